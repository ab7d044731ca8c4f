//! The GGML weight formats of GGUF files, with CPU dequantizers that give ggml's (and the
//! `gguf` Python package's) f32 values bit for bit, and quantizers:
//!
//! - [`float`]: F32, F16 and BF16, one value per "block";
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, 32 values per block with one f16 scale (and
//!   an f16 minimum in Q4_1/Q5_1); quantized as ggml's reference quantizers do, byte for byte;
//! - [`kquants`]: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, 256-value super-blocks of 16 or 32-value
//!   sub-blocks with quantized sub-block scales; quantized by a simple quantizer of our own (any
//!   valid encoding decodes the same way).
//!
//! A GGUF matrix with `ne0 = cols` (input features) and `ne1 = rows` stores row after row,
//! each row `cols / block values` blocks, so `ne0` must be a multiple of the block.

mod float;
mod kquants;
mod legacy;

use super::types::{Codec, WeightType};
use crate::gguf::GgmlType;

/// Values per block of the legacy formats (Q4_0 .. Q8_0).
pub const QK: usize = 32;
/// Values per super-block of the K-quants.
pub const QK_K: usize = 256;
pub const Q4_1_BLOCK_BYTES: usize = 20;
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Why values could not be converted from or to a GGML type.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("pagedlm cannot convert values of type {0}")]
    Unsupported(String),
    #[error("{values} values are not a whole number of {type_name} blocks ({block} values each)")]
    PartialBlock { type_name: String, values: u64, block: u64 },
    #[error("{values} values of type {type_name} take {expected} bytes, not the {got} given")]
    ByteLength { type_name: String, values: u64, expected: u64, got: u64 },
}

/// How one supported type is coded.
#[derive(Clone, Copy)]
enum Family {
    Float,
    Legacy(legacy::Format),
    K(kquants::Format),
}

fn family(t: GgmlType) -> Result<Family, QuantError> {
    let row = WeightType::of(t).ok_or_else(|| QuantError::Unsupported(t.name()))?;
    Ok(match row.codec {
        Codec::Float => Family::Float,
        Codec::Legacy => Family::Legacy(legacy::Format::of(t)),
        Codec::K => Family::K(kquants::Format::of(t)),
    })
}

/// Bytes of `n` values of type `t` (`n` a multiple of its block), `None` if `n` is not, or if
/// ggml gives `t` no size. Sizes every type ggml can store, supported or not.
pub fn bytes_of(t: GgmlType, n: u64) -> Option<u64> {
    let (block_values, block_bytes) = t.block_size()?;
    if n % block_values != 0 {
        return None;
    }
    (n / block_values).checked_mul(block_bytes)
}

/// The family of `t` once `values` is known to be whole blocks of it.
fn checked(t: GgmlType, values: usize) -> Result<(Family, u64), QuantError> {
    let family = family(t)?;
    let partial = || QuantError::PartialBlock { type_name: t.name(), values: values as u64, block: t.block_size().map_or(1, |(v, _)| v) };
    let bytes = bytes_of(t, values as u64).ok_or_else(partial)?;
    Ok((family, bytes))
}

/// `out.len()` values from `raw`, which must be exactly the bytes of `out.len()` values of type
/// `t`. Every value is the one ggml's `dequantize_row_*` gives, to the bit.
pub fn dequantize(t: GgmlType, raw: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let (family, expected) = checked(t, out.len())?;
    if expected != raw.len() as u64 {
        return Err(QuantError::ByteLength { type_name: t.name(), values: out.len() as u64, expected, got: raw.len() as u64 });
    }
    match family {
        Family::Float => float::dequantize(t, raw, out),
        Family::Legacy(format) => legacy::dequantize(format, raw, out),
        Family::K(format) => kquants::dequantize(format, raw, out),
    }
    Ok(())
}

/// `values` in type `t`; `values.len()` must be a multiple of `t`'s block. F32, F16, BF16 and
/// the legacy types give the bytes of ggml's reference quantizers (`quantize_row_*_ref`, as the
/// `gguf` Python package does); the K-quants a simple valid encoding (see [`kquants`]).
pub fn quantize(t: GgmlType, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    let (family, bytes) = checked(t, values.len())?;
    let mut out = Vec::with_capacity(bytes as usize);
    match family {
        Family::Float => float::quantize(t, values, &mut out),
        Family::Legacy(format) => by_blocks(values, (QK, format.block_bytes()), &mut out, |x, b| format.quantize_block(x, b)),
        Family::K(format) => by_blocks(values, (QK_K, format.block_bytes()), &mut out, |x, b| format.quantize_block(x, b)),
    }
    Ok(out)
}

/// Quantizes whole blocks of `values` one by one onto `out`; each block's bytes start zeroed.
fn by_blocks(values: &[f32], (block_values, block_bytes): (usize, usize), out: &mut Vec<u8>, quantize_block: impl Fn(&[f32], &mut [u8])) {
    let mut block = vec![0u8; block_bytes];
    for x in values.chunks_exact(block_values) {
        block.fill(0);
        quantize_block(x, &mut block);
        out.extend_from_slice(&block);
    }
}

/// Dequantizes Q4_1 blocks into `out` (`out.len()` = 32 × blocks).
///
/// # Panics
/// If `blocks` is not the bytes of `out.len()` values (see [`dequantize`] for the error instead).
pub fn dequantize_q4_1(blocks: &[u8], out: &mut [f32]) {
    dequantize(GgmlType::Q4_1, blocks, out).unwrap_or_else(|e| panic!("{e}"))
}

/// Dequantizes Q8_0 blocks into `out` (`out.len()` = 32 × blocks).
///
/// # Panics
/// If `blocks` is not the bytes of `out.len()` values (see [`dequantize`] for the error instead).
pub fn dequantize_q8_0(blocks: &[u8], out: &mut [f32]) {
    dequantize(GgmlType::Q8_0, blocks, out).unwrap_or_else(|e| panic!("{e}"))
}

/// Quantizes values (a multiple of 32) to Q4_1, as ggml's reference quantizer does.
///
/// # Panics
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q4_1(values: &[f32]) -> Vec<u8> {
    quantize(GgmlType::Q4_1, values).unwrap_or_else(|e| panic!("{e}"))
}

/// Quantizes values (a multiple of 32) to Q8_0, as ggml's reference quantizer does.
///
/// # Panics
/// If `values.len()` is not a multiple of 32.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    quantize(GgmlType::Q8_0, values).unwrap_or_else(|e| panic!("{e}"))
}

/// An f32 from 2 little-endian f16 bytes.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The f16 nearest `v` (ties to even, as ggml's `GGML_FP32_TO_FP16` and numpy round), as
/// little-endian bytes.
fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
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
