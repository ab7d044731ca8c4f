// Q4_K weights for the quantized-weight family (quant_common.wgsl): 256 values per block, 36 words:
// [0] f16 d (low) and dmin (high), [1..3] 8 6-bit scales and 8 6-bit minimums in 12 bytes,
// [4..35] 128 quant bytes. Chunk c: bytes 32 (c / 2).. , low nibbles for even c, high for odd.
// Value = d · scale_c · q − dmin · min_c.
const CHUNKS: u32 = 8u;
const BLOCK_WORDS: u32 = 36u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    let c = kc % CHUNKS;
    let qs = base + 4u + 8u * (c / 2u);
    let shift = 4u * (c % 2u);
    var out: Chunk;
    for (var i = 0u; i < 8u; i++) {
        out.q[i] = bytes4((wq[qs + i] >> shift) & LOW4);
    }
    let dd = unpack2x16float(wq[base]);
    let sm = scale_min_k4(base + 1u, c);
    out.d = vec2<f32>(dd.x * sm.x);
    out.m = vec2<f32>(-dd.y * sm.y);
    return out;
}
