// Prelude of the quantized-weight family (matmul_blocks.wgsl, embed.wgsl): every weight type
// gives, in its quant_<type>.wgsl, CHUNKS (32-value chunks per block), BLOCK_WORDS (u32 words of
// one repacked block) and `decode(n, kc, nb)`: chunk kc (values 32kc..32kc+31) of row n of a
// matrix of nb chunks per row. Value k of a chunk is d[k / 16] · q[k] + m[k / 16]: q holds the
// quants as f32 (integer-valued for the quantized types, the values themselves for F32, F16 and
// BF16), d and m the scale and offset of each half (K-quants with 16-value sub-blocks have two).
// f16 is only storage (unpack2x16float): no `shader-f16`.
//
// The generic layout (every type but Q4_1 and Q8_0, which keep their interleaved layouts of
// matmul_q4_1.wgsl and matmul_q8_0.wgsl): the GGUF blocks of GROUP_ROWS adjacent rows that cover
// the same columns side by side, [groups][blocks per row][GROUP_ROWS][BLOCK_WORDS] u32, each block
// the GGUF bytes with a 2-byte f16 header padded to 4 (Q4_0, Q5_0) or 2 bytes appended (Q3_K,
// Q6_K) so that every field is word-aligned. Rows past the matrix are zero blocks (value 0).

@group(0) @binding(0) var<storage, read> wq: array<u32>;

struct Chunk {
    q: array<vec4<f32>, 8>,
    d: vec2<f32>,
    m: vec2<f32>,
}

const GROUP_ROWS: u32 = 4u;

// The first word of the block holding chunk kc of row n, in the generic layout.
fn block_base(n: u32, kc: u32, nb: u32) -> u32 {
    let nblk = nb / CHUNKS;
    return ((n / GROUP_ROWS * nblk + kc / CHUNKS) * GROUP_ROWS + n % GROUP_ROWS) * BLOCK_WORDS;
}

fn f16_lo(word: u32) -> f32 {
    return unpack2x16float(word).x;
}

fn f16_hi(word: u32) -> f32 {
    return unpack2x16float(word).y;
}

// Masks of the low 4, 2 and 1 bits of each byte of a word: quants are extracted four at a time
// with word operations, then converted once.
const LOW4: u32 = 0x0F0F0F0Fu;
const LOW2: u32 = 0x03030303u;
const LOW1: u32 = 0x01010101u;

// The 4 bytes of `word` as floats.
fn bytes4(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(word));
}

// Bits 0..3 of h, one per byte (bit k in bit 0 of byte k): the 4 partial products of the
// multiplication do not overlap, so it is a shift-and-or.
fn spread4(h: u32) -> u32 {
    return ((h & 15u) * 0x00204081u) & LOW1;
}

// Byte i (0..) of the block at `base`.
fn block_byte(base: u32, i: u32) -> u32 {
    return (wq[base + i / 4u] >> (8u * (i % 4u))) & 0xFFu;
}

// 4-bit quants (Q4_0, Q4_1): the 4 words at `qs` hold bytes 0..15; low nibbles are values 0..15,
// high nibbles values 16..31. `offset` is added to every quant.
fn nibble_chunk(qs: u32, offset: f32) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let word = wq[qs + i];
        q[i] = bytes4(word & LOW4) + offset;
        q[4u + i] = bytes4((word >> 4u) & LOW4) + offset;
    }
    return q;
}

// 5-bit quants (Q5_0, Q5_1): nibbles as above, bit j of the word at `qh` the fifth bit of value j.
fn five_bit_chunk(qh_at: u32, qs: u32, offset: f32) -> array<vec4<f32>, 8> {
    let qh = wq[qh_at];
    var q: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let word = wq[qs + i];
        q[i] = bytes4((word & LOW4) | (spread4(qh >> (4u * i)) << 4u)) + offset;
        q[4u + i] = bytes4(((word >> 4u) & LOW4) | (spread4(qh >> (16u + 4u * i)) << 4u)) + offset;
    }
    return q;
}

// Q4_K/Q5_K's 6-bit scale and minimum of sub-block j (0..7), from the 12 scale bytes at word `sc`.
fn scale_min_k4(sc: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(block_byte(sc, j) & 63u), f32(block_byte(sc, j + 4u) & 63u));
    }
    let s = (block_byte(sc, j + 4u) & 15u) | ((block_byte(sc, j - 4u) >> 6u) << 4u);
    let m = (block_byte(sc, j + 4u) >> 4u) | ((block_byte(sc, j) >> 6u) << 4u);
    return vec2<f32>(f32(s), f32(m));
}
