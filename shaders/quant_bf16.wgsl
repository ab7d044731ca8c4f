// BF16 weights for the quantized-weight family (quant_common.wgsl): blocks of 32 values, 16 words,
// value 2w in the low half of word w. A bfloat16 is the top half of an f32: exact by shifting.
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 16u;

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xFFFF0000u));
}

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    var c: Chunk;
    for (var i = 0u; i < 8u; i++) {
        c.q[i] = vec4<f32>(bf16_pair(wq[base + 2u * i]), bf16_pair(wq[base + 2u * i + 1u]));
    }
    c.d = vec2<f32>(1.0);
    c.m = vec2<f32>(0.0);
    return c;
}
