// Q3_K weights for the quantized-weight family (quant_common.wgsl): 256 values per block, 28 words:
// [0..7] hmask (32 bytes: bit c of byte l is the high bit of value l, or l + 16, of chunk c),
// [8..23] 64 bytes of 2-bit quants laid out as Q2_K's, [24..26] 16 6-bit scales packed in 12 bytes,
// [27] f16 d (low half; 2 bytes appended to GGUF's 110). Value = d · (scale − 32) · (q − 4 · !hbit).
const CHUNKS: u32 = 8u;
const BLOCK_WORDS: u32 = 28u;

// Scale s (0..15): its low 4 bits from byte s % 8 (low nibble for s < 8, high nibble after),
// its high 2 bits from byte 8 + s % 4, bits 2 (s / 4).
fn scale_q3_k(sc: u32, s: u32) -> f32 {
    let low = (block_byte(sc, s % 8u) >> (4u * (s / 8u))) & 15u;
    let high = (block_byte(sc, 8u + s % 4u) >> (2u * (s / 4u))) & 3u;
    return f32(low | (high << 4u)) - 32.0;
}

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    let c = kc % CHUNKS;
    let qs = base + 8u + 8u * (c / 4u);
    let shift = 2u * (c % 4u);
    var out: Chunk;
    for (var i = 0u; i < 8u; i++) {
        // hmask bytes l = 4i..4i+3 of the same chunk half: words 0..3 (values 0..15), 4..7 (16..31).
        let high = (wq[base + i] >> c) & LOW1;
        out.q[i] = bytes4(((wq[qs + i] >> shift) & LOW2) | (high << 2u)) - 4.0;
    }
    let d = f16_lo(wq[base + 27u]);
    out.d = d * vec2<f32>(scale_q3_k(base + 24u, 2u * c), scale_q3_k(base + 24u, 2u * c + 1u));
    out.m = vec2<f32>(0.0);
    return out;
}
