// Q5_0 weights for the quantized-weight family (quant_common.wgsl): 32 values per block, 6 words:
// [0] the f16 scale d (low half, padded), [1] the 32 fifth bits, [2..5] 16 quant bytes.
// Value = d · (q − 16).
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 6u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    var c: Chunk;
    c.q = five_bit_chunk(base + 1u, base + 2u, -16.0);
    c.d = vec2<f32>(f16_lo(wq[base]));
    c.m = vec2<f32>(0.0);
    return c;
}
