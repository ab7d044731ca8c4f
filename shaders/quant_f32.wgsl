// F32 weights for the quantized-weight family (quant_common.wgsl): blocks of 32 values, 32 words.
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 32u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    var c: Chunk;
    for (var i = 0u; i < 8u; i++) {
        let at = base + 4u * i;
        c.q[i] = bitcast<vec4<f32>>(vec4<u32>(wq[at], wq[at + 1u], wq[at + 2u], wq[at + 3u]));
    }
    c.d = vec2<f32>(1.0);
    c.m = vec2<f32>(0.0);
    return c;
}
