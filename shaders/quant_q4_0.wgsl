// Q4_0 weights for the quantized-weight family (quant_common.wgsl): 32 values per block, 5 words:
// [0] the f16 scale d (low half; GGUF's 2 header bytes padded to 4), [1..4] 16 quant bytes.
// Value = d · (q − 8).
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 5u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    var c: Chunk;
    c.q = nibble_chunk(base + 1u, -8.0);
    c.d = vec2<f32>(f16_lo(wq[base]));
    c.m = vec2<f32>(0.0);
    return c;
}
