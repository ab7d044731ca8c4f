// F16 weights for the quantized-weight family (quant_common.wgsl): blocks of 32 values, 16 words,
// value 2w in the low half of word w. Read through unpack2x16float: no `shader-f16`.
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 16u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    var c: Chunk;
    for (var i = 0u; i < 8u; i++) {
        c.q[i] = vec4<f32>(unpack2x16float(wq[base + 2u * i]), unpack2x16float(wq[base + 2u * i + 1u]));
    }
    c.d = vec2<f32>(1.0);
    c.m = vec2<f32>(0.0);
    return c;
}
