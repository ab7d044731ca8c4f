//! GGML block formats pagedlm reads, with CPU quantize/dequantize references.
//!
//! - **Q4_1**: 32 values per 20-byte block: f16 scale `d`, f16 minimum `m`, then 16 bytes whose
//!   low nibble of byte j is element j and high nibble is element j + 16; value = d·q + m.
//! - **Q8_0**: 32 values per 34-byte block: f16 scale `d`, then 32 signed bytes; value = d·q.
//!
//! A GGUF matrix with `ne0 = cols` (input features) and `ne1 = rows` stores row after row,
//! each row `cols / 32` blocks.

use half::f16;

pub const QK: usize = 32;
pub const Q4_1_BLOCK_BYTES: usize = 20;
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Dequantizes Q4_1 blocks into `out` (`out.len()` = 32 × blocks).
pub fn dequantize_q4_1(blocks: &[u8], out: &mut [f32]) {
    assert_eq!(blocks.len() / Q4_1_BLOCK_BYTES * QK, out.len(), "Q4_1: {} bytes for {} values", blocks.len(), out.len());
    for (b, chunk) in blocks.chunks_exact(Q4_1_BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
        for j in 0..16 {
            let q = b[4 + j];
            chunk[j] = d * (q & 0x0F) as f32 + m;
            chunk[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

/// Dequantizes Q8_0 blocks into `out` (`out.len()` = 32 × blocks).
pub fn dequantize_q8_0(blocks: &[u8], out: &mut [f32]) {
    assert_eq!(blocks.len() / Q8_0_BLOCK_BYTES * QK, out.len(), "Q8_0: {} bytes for {} values", blocks.len(), out.len());
    for (b, chunk) in blocks.chunks_exact(Q8_0_BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        for j in 0..QK {
            chunk[j] = d * (b[2 + j] as i8) as f32;
        }
    }
}

/// Quantizes values (a multiple of 32) to Q4_1, as ggml's reference quantizer does.
pub fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    assert_eq!(values.len() % QK, 0, "Q4_1 needs a multiple of 32 values");
    let mut out = Vec::with_capacity(values.len() / QK * Q4_1_BLOCK_BYTES);
    for chunk in values.chunks_exact(QK) {
        let min = chunk.iter().cloned().fold(f32::INFINITY, f32::min);
        let max = chunk.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let q0 = (((chunk[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((chunk[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            out.push(q0 | (q1 << 4));
        }
    }
    out
}

/// Quantizes values (a multiple of 32) to Q8_0, as ggml's reference quantizer does.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    assert_eq!(values.len() % QK, 0, "Q8_0 needs a multiple of 32 values");
    let mut out = Vec::with_capacity(values.len() / QK * Q8_0_BLOCK_BYTES);
    for chunk in values.chunks_exact(QK) {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        for v in chunk {
            out.push(((v * id).round() as i32).clamp(-127, 127) as i8 as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn q4_1_round_trip_is_within_half_a_step() {
        let mut rng = Rng::new(7);
        let v = rng.vec_uniform(32 * 64, -2.0, 3.0);
        let q = quantize_q4_1(&v);
        assert_eq!(q.len(), 64 * 20);
        let mut back = vec![0f32; v.len()];
        dequantize_q4_1(&q, &mut back);
        for (block, (a, b)) in v.chunks(32).zip(back.chunks(32)).enumerate() {
            let step = (a.iter().cloned().fold(f32::MIN, f32::max) - a.iter().cloned().fold(f32::MAX, f32::min)) / 15.0;
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= step * 0.5 + step * 0.01 + 1e-3, "block {block}: {x} -> {y}, step {step}");
            }
        }
    }

    #[test]
    fn q8_0_round_trip_is_within_half_a_step() {
        let mut rng = Rng::new(8);
        let v = rng.vec_uniform(32 * 64, -5.0, 5.0);
        let q = quantize_q8_0(&v);
        assert_eq!(q.len(), 64 * 34);
        let mut back = vec![0f32; v.len()];
        dequantize_q8_0(&q, &mut back);
        for (a, b) in v.chunks(32).zip(back.chunks(32)) {
            let step = a.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= step * 0.51 + 1e-3, "{x} -> {y}");
            }
        }
    }
}
