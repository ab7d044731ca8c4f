// The prelude of argmax.wgsl and sample.wgsl: the one float order every token choice uses.
//
// order_key(bits) is a u32 whose order is the float order of the f32 with those bits: NaN -> 0
// (below every number, -inf included), both zeros -> one key, negatives bit-inverted (larger
// magnitude, smaller key), positives above them. Comparing keys instead of floats keeps the
// order exact even where a compiler assumes no NaNs or infinities (WGSL allows it).
// crate::sampler::order_key is the same function on the CPU.

const KEY_NAN: u32 = 0u;
const KEY_NEG_INF: u32 = 0x007fffffu;
const KEY_POS_INF: u32 = 0xff800000u;

fn order_key(bits: u32) -> u32 {
    let magnitude = bits & 0x7fffffffu;
    let signed_key = select(bits | 0x80000000u, ~bits, bits >= 0x80000000u);
    let number_key = select(signed_key, 0x80000000u, magnitude == 0u);
    return select(number_key, KEY_NAN, magnitude > 0x7f800000u);
}

// The bits of a float with this key (+0 for the zeros' key); keys of NaN have none.
fn key_bits(key: u32) -> u32 {
    return select(~key, key & 0x7fffffffu, key >= 0x80000000u);
}
