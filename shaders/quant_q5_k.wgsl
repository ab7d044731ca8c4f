// Q5_K weights for the quantized-weight family (quant_common.wgsl): 256 values per block, 44 words:
// [0] f16 d and dmin, [1..3] scales and minimums as Q4_K's, [4..11] qh (bit c of byte l: the fifth
// bit of value l of chunk c), [12..43] 128 quant bytes laid out as Q4_K's.
// Value = d · scale_c · q − dmin · min_c.
const CHUNKS: u32 = 8u;
const BLOCK_WORDS: u32 = 44u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    let c = kc % CHUNKS;
    let qs = base + 12u + 8u * (c / 2u);
    let shift = 4u * (c % 2u);
    var out: Chunk;
    for (var i = 0u; i < 8u; i++) {
        out.q[i] = bytes4(((wq[qs + i] >> shift) & LOW4) | (((wq[base + 4u + i] >> c) & LOW1) << 4u));
    }
    let dd = unpack2x16float(wq[base]);
    let sm = scale_min_k4(base + 1u, c);
    out.d = vec2<f32>(dd.x * sm.x);
    out.m = vec2<f32>(-dd.y * sm.y);
    return out;
}
