// Q6_K weights for the quantized-weight family (quant_common.wgsl): 256 values per block, 53 words:
// [0..31] ql (128 bytes of low 4 bits), [32..47] qh (64 bytes of high 2 bits), [48..51] 16 signed
// 8-bit scales of 16-value sub-blocks, [52] f16 d (low half; 2 bytes appended to GGUF's 210).
// Chunk c = 4h + k: values l = 0..31 take the low (k < 2) or high (k ≥ 2) nibble of ql byte
// 64h + 32 (k % 2) + l and bits 2k of qh byte 32h + l; scales 8h + 2k and 8h + 2k + 1.
// Value = d · scale · (q − 32).
const CHUNKS: u32 = 8u;
const BLOCK_WORDS: u32 = 53u;

fn decode(n: u32, kc: u32, nb: u32) -> Chunk {
    let base = block_base(n, kc, nb);
    let c = kc % CHUNKS;
    let h = c / 4u;
    let k = c % 4u;
    let ql = base + 16u * h + 8u * (k % 2u);
    let qh = base + 32u + 8u * h;
    var out: Chunk;
    for (var i = 0u; i < 8u; i++) {
        out.q[i] = bytes4(((wq[ql + i] >> (4u * (k / 2u))) & LOW4) | (((wq[qh + i] >> (2u * k)) & LOW2) << 4u)) - 32.0;
    }
    let s = 8u * h + 2u * k;
    let scales = base + 48u;
    let s0 = extractBits(i32(wq[scales + s / 4u]), 8u * (s % 4u), 8u);
    let s1 = extractBits(i32(wq[scales + (s + 1u) / 4u]), 8u * ((s + 1u) % 4u), 8u);
    out.d = f16_lo(wq[base + 52u]) * vec2<f32>(f32(s0), f32(s1));
    out.m = vec2<f32>(0.0);
    return out;
}
