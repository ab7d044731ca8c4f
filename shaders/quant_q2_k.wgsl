// Q2_K weights for the quantized-weight family (quant_common.wgsl): 256 values per block, 21 words:
// [0..3] 16 scale bytes (low nibble: scale, high nibble: minimum of a 16-value sub-block),
// [4..19] 64 bytes of 2-bit quants, [20] f16 d (low) and dmin (high).
// Chunk c: half h = c / 4 of the quants, bits 2 (c % 4); its first 16 values from bytes
// 32h..32h+15, the next 16 from bytes 32h+16..; sub-blocks 2c and 2c + 1.
// Value = d · scale · q − dmin · min.
const CHUNKS: u32 = 8u;
const BLOCK_WORDS: u32 = 21u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    let c = kc % CHUNKS;
    let qs = base + 4u + 8u * (c / 4u);
    let shift = 2u * (c % 4u);
    var out: Chunk;
    for (var i = 0u; i < 8u; i++) {
        out.q[i] = bytes4((wq[qs + i] >> shift) & LOW2);
    }
    let dd = unpack2x16float(wq[base + 20u]);
    let s0 = block_byte(base, 2u * c);
    let s1 = block_byte(base, 2u * c + 1u);
    out.d = dd.x * vec2<f32>(f32(s0 & 15u), f32(s1 & 15u));
    out.m = -dd.y * vec2<f32>(f32(s0 >> 4u), f32(s1 >> 4u));
    return out;
}
