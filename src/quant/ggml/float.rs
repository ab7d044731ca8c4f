//! F32, F16 and BF16: one little-endian value per element.
//!
//! BF16 is the top half of an f32; ggml rounds f32 to it to nearest, ties to even, and keeps
//! every NaN a (quiet) NaN. F16 rounds to nearest, ties to even, overflowing to ±∞.

use crate::gguf::GgmlType;

/// `raw` holds exactly `out.len()` values of `t` (checked by the caller).
pub(super) fn dequantize(t: GgmlType, raw: &[u8], out: &mut [f32]) {
    match t {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = super::f16_at(b, 0);
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

pub(super) fn quantize(t: GgmlType, values: &[f32], out: &mut Vec<u8>) {
    for &v in values {
        match t {
            GgmlType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            GgmlType::F16 => out.extend_from_slice(&super::f16_bytes(v)),
            _ => out.extend_from_slice(&f32_to_bf16(v).to_le_bytes()),
        }
    }
}

fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// ggml's `ggml_compute_fp32_to_bf16`: a NaN is made quiet, anything else is rounded to
/// nearest, ties to even (a carry out of the mantissa bumps the exponent, up to ∞).
fn f32_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    ((bits as u64 + 0x7fff + ((bits as u64 >> 16) & 1)) >> 16) as u16
}
