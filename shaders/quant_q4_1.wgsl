// Q4_1 weights for the quantized-weight family (quant_common.wgsl), in matmul_q4_1.wgsl's
// interleaved layout: group g = n / 4, chunk kc is 20 words at (g · nb + kc) · 20: word r holds row
// r's f16 scale d and minimum m, words 4 + 4r.. its 16 quant bytes. Value = d · q + m.
const CHUNKS: u32 = 1u;
const BLOCK_WORDS: u32 = 5u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = (n / 4u * nb + kc) * 20u;
    let r = n % 4u;
    let dm = unpack2x16float(wq[base + r]);
    var c: Chunk;
    c.q = nibble_chunk(base + 4u + 4u * r, 0.0);
    c.d = vec2<f32>(dm.x);
    c.m = vec2<f32>(dm.y);
    return c;
}
