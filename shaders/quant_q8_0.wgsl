// Q8_0 weights for the quantized-weight family (quant_common.wgsl), in matmul_q8_0.wgsl's
// interleaved layout: group g = n / 8, chunk kc is 68 words at (g · nb + kc) · 68: words 0..3 the
// 8 rows' f16 scales (row r in half r % 2 of word r / 2), words 4 + 8r.. row r's 32 signed quant
// bytes. Value = d · q.
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 9u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = (n / 8u * nb + kc) * 68u;
    let r = n % 8u;
    var c: Chunk;
    for (var i = 0u; i < 8u; i++) {
        c.q[i] = vec4<f32>(unpack4xI8(wq[base + 4u + 8u * r + i]));
    }
    c.d = vec2<f32>(unpack2x16float(wq[base + r / 2u])[r % 2u]);
    c.m = vec2<f32>(0.0);
    return c;
}
