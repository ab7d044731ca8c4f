//! The K-quants: 256-value super-blocks of 16 or 32-value sub-blocks. Each sub-block has a
//! small integer scale code `sc` (and, in the types with a minimum, a min code `m`); the
//! super-block has f16 `d` (and `dmin`). A value is `(d·sc)·q − (dmin·m)` (Q2_K, Q4_K, Q5_K)
//! or `(d·sc)·q` (Q3_K, Q6_K), in that order of f32 operations, as ggml computes it.
//!
//! | type | bytes | sub-block | q       | sc, m                    | layout (ggml's `block_qN_K`)          |
//! |------|-------|-----------|---------|--------------------------|---------------------------------------|
//! | Q2_K | 84    | 16        | 0..3    | 4 + 4 bits, in one byte  | scales[16], qs[64], d, dmin           |
//! | Q3_K | 110   | 16        | −4..3   | 6 bits − 32              | hmask[32], qs[64], scales[12], d      |
//! | Q4_K | 144   | 32        | 0..15   | 6 + 6 bits, packed in 12 | d, dmin, scales[12], qs[128]          |
//! | Q5_K | 176   | 32        | 0..31   | 6 + 6 bits, packed in 12 | d, dmin, scales[12], qh[32], qs[128]  |
//! | Q6_K | 210   | 16        | −32..31 | i8                       | ql[128], qh[64], scales[16], d        |
//!
//! Where each element's bits lie is [`Format::quant_code`], each sub-block's codes
//! [`Format::scale_code`] and [`Format::min_code`]: one table that both the dequantizer and
//! the quantizer read, so the two cannot disagree.
//!
//! The quantizer is our own and simple (ggml's search for the best scales is not needed for a
//! valid encoding): each sub-block's range is covered by rounding its scale code (and min code)
//! up, and every value takes the nearest quant. Types with a minimum cover [min(0, lo), hi];
//! the symmetric ones map the value of largest magnitude to the most negative quant, as ggml
//! does. A value comes back within one step of its sub-block plus one step of the super-block
//! scales (`d`, and `dmin`). Scales must fit in f16 (|values| up to about 10⁵).

use half::f16;

use super::{f16_at, QK_K};
use crate::gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    Q2,
    Q3,
    Q4,
    Q5,
    Q6,
}

/// Where an integer code lies in a block: up to two bit fields (byte, shift, width), low bits
/// first, minus `bias`; `signed` codes are 8-bit two's complement.
struct Code {
    fields: [(usize, u32, u32); 2],
    n_fields: usize,
    bias: i32,
    signed: bool,
}

impl Code {
    fn one(byte: usize, shift: u32, width: u32) -> Code {
        Code { fields: [(byte, shift, width), (0, 0, 0)], n_fields: 1, bias: 0, signed: false }
    }

    fn two(low: (usize, u32, u32), high: (usize, u32, u32), bias: i32) -> Code {
        Code { fields: [low, high], n_fields: 2, bias, signed: false }
    }

    fn get(&self, b: &[u8]) -> i32 {
        let (mut raw, mut at) = (0u32, 0u32);
        for &(byte, shift, width) in &self.fields[..self.n_fields] {
            raw |= ((b[byte] as u32 >> shift) & ((1 << width) - 1)) << at;
            at += width;
        }
        let raw = if self.signed { raw as u8 as i8 as i32 } else { raw as i32 };
        raw - self.bias
    }

    /// ORs the code into `b`, whose fields start zeroed.
    fn set(&self, b: &mut [u8], value: i32) {
        let mut raw = (value + self.bias) as u32;
        for &(byte, shift, width) in &self.fields[..self.n_fields] {
            b[byte] |= ((raw & ((1 << width) - 1)) << shift) as u8;
            raw >>= width;
        }
    }
}

impl Format {
    /// `t` is one of Q2_K .. Q6_K.
    pub(super) fn of(t: GgmlType) -> Format {
        match t {
            GgmlType::Q2_K => Format::Q2,
            GgmlType::Q3_K => Format::Q3,
            GgmlType::Q4_K => Format::Q4,
            GgmlType::Q5_K => Format::Q5,
            _ => Format::Q6,
        }
    }

    pub(super) fn block_bytes(self) -> usize {
        match self {
            Format::Q2 => 84,
            Format::Q3 => 110,
            Format::Q4 => 144,
            Format::Q5 => 176,
            Format::Q6 => 210,
        }
    }

    fn sub_len(self) -> usize {
        match self {
            Format::Q4 | Format::Q5 => 32,
            _ => 16,
        }
    }

    /// Whether a value subtracts `dmin·m`.
    fn has_min(self) -> bool {
        matches!(self, Format::Q2 | Format::Q4 | Format::Q5)
    }

    /// Byte offset of the f16 `d` (`dmin` follows it).
    fn d_at(self) -> usize {
        match self {
            Format::Q2 => 80,
            Format::Q3 => 108,
            Format::Q4 | Format::Q5 => 0,
            Format::Q6 => 208,
        }
    }

    /// The quants' range.
    fn quant_range(self) -> (i32, i32) {
        match self {
            Format::Q2 => (0, 3),
            Format::Q3 => (-4, 3),
            Format::Q4 => (0, 15),
            Format::Q5 => (0, 31),
            Format::Q6 => (-32, 31),
        }
    }

    /// The largest magnitude a scale (or min) code takes here (Q3_K's 6-bit signed codes reach
    /// −32, but we use them symmetrically).
    fn code_max(self) -> i32 {
        match self {
            Format::Q2 => 15,
            Format::Q3 => 31,
            Format::Q4 | Format::Q5 => 63,
            Format::Q6 => 127,
        }
    }

    /// Quant `e` (0..256) of a block. Within a 128-value half `h` of Q2/Q3/Q6_K, 32-value group
    /// `g` takes bits 2g.. of the half's 32 bytes; Q4/Q5_K's 64-value chunk `c` takes the low
    /// nibbles of 32 bytes, then their high nibbles.
    fn quant_code(self, e: usize) -> Code {
        let (h, g, l) = (e / 128, (e % 128) / 32, e % 32);
        let (c, nibble) = (e / 64, (e % 64) / 32);
        match self {
            Format::Q2 => Code::one(16 + h * 32 + l, 2 * g as u32, 2),
            // The hmask bit set means no −4.
            Format::Q3 => Code::two((32 + h * 32 + l, 2 * g as u32, 2), (l, (h * 4 + g) as u32, 1), 4),
            Format::Q4 => Code::one(16 + c * 32 + l, 4 * nibble as u32, 4),
            Format::Q5 => Code::two((48 + c * 32 + l, 4 * nibble as u32, 4), (16 + l, (e / 32) as u32, 1), 0),
            Format::Q6 => Code::two((h * 64 + (g & 1) * 32 + l, 4 * (g >> 1) as u32, 4), (128 + h * 32 + l, 2 * g as u32, 2), 32),
        }
    }

    /// Scale code of sub-block `s`. Q3_K: the low nibbles of bytes 0..8, then their high
    /// nibbles, with 2 high bits each from bytes 8..12. Q4/Q5_K (ggml's `get_scale_min_k4`):
    /// sub-blocks 0..4 in the low 6 bits of bytes 0..4, 4..8 in the low nibbles of bytes 8..12
    /// with their high 2 bits on top of bytes 0..4.
    fn scale_code(self, s: usize) -> Code {
        match self {
            Format::Q2 => Code::one(s, 0, 4),
            Format::Q3 => Code::two((96 + s % 8, 4 * (s / 8) as u32, 4), (104 + s % 4, 2 * (s / 4) as u32, 2), 32),
            Format::Q4 | Format::Q5 if s < 4 => Code::one(4 + s, 0, 6),
            Format::Q4 | Format::Q5 => Code::two((8 + s, 0, 4), (s, 6, 2), 0),
            Format::Q6 => Code { signed: true, ..Code::one(192 + s, 0, 8) },
        }
    }

    /// Min code of sub-block `s` (types with a minimum); the Q4/Q5_K packing mirrors the scales'
    /// in bytes 4..8 and the high nibbles of 8..12.
    fn min_code(self, s: usize) -> Code {
        match self {
            Format::Q2 => Code::one(s, 4, 4),
            _ if s < 4 => Code::one(8 + s, 0, 6),
            _ => Code::two((8 + s, 4, 4), (4 + s, 6, 2), 0),
        }
    }

    fn dequantize_block(self, b: &[u8], y: &mut [f32]) {
        let d = f16_at(b, self.d_at());
        let dmin = if self.has_min() { f16_at(b, self.d_at() + 2) } else { 0.0 };
        let sub = self.sub_len();
        for (s, ys) in y.chunks_exact_mut(sub).enumerate() {
            let dl = d * self.scale_code(s).get(b) as f32;
            let quants = ys.iter_mut().enumerate().map(|(i, y)| (y, self.quant_code(s * sub + i).get(b) as f32));
            if self.has_min() {
                let ml = dmin * self.min_code(s).get(b) as f32;
                quants.for_each(|(y, q)| *y = dl * q - ml);
            } else {
                // No `− 0.0`: ggml leaves the sign of a zero product.
                quants.for_each(|(y, q)| *y = dl * q);
            }
        }
    }

    /// Our quantizer (module doc) for one super-block; `b` (one block) starts zeroed.
    pub(super) fn quantize_block(self, x: &[f32], b: &mut [u8]) {
        let (qmin, qmax) = self.quant_range();
        let code_max = self.code_max();
        let subs: Vec<&[f32]> = x.chunks_exact(self.sub_len()).collect();
        // Per sub-block: the offset it needs subtracted (≥ 0) and the step it needs.
        let (offsets, dmin) = if self.has_min() {
            let need: Vec<f32> = subs.iter().map(|s| -s.iter().copied().fold(0f32, f32::min)).collect();
            let dmin = f16_at_least(need.iter().copied().fold(0f32, f32::max) / code_max as f32);
            let codes: Vec<i32> = need.iter().map(|&n| code_up(n, dmin, code_max)).collect();
            (codes, dmin)
        } else {
            (vec![0; subs.len()], 0.0)
        };
        let steps: Vec<f32> = subs
            .iter()
            .zip(&offsets)
            .map(|(s, &m)| {
                if self.has_min() {
                    (s.iter().copied().fold(0f32, f32::max) + dmin * m as f32) / qmax as f32
                } else {
                    // The value of largest magnitude goes to qmin, so the step has its sign flipped.
                    s.iter().copied().fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a }) / qmin as f32
                }
            })
            .collect();
        let d = f16_at_least(steps.iter().fold(0f32, |a, s| a.max(s.abs())) / code_max as f32);
        b[self.d_at()..self.d_at() + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        if self.has_min() {
            b[self.d_at() + 2..self.d_at() + 4].copy_from_slice(&f16::from_f32(dmin).to_le_bytes());
        }
        let sub = self.sub_len();
        for (s, values) in subs.iter().enumerate() {
            let sc = code_up(steps[s].abs(), d, code_max) * if steps[s] < 0.0 { -1 } else { 1 };
            self.scale_code(s).set(b, sc);
            let (dl, ml) = (d * sc as f32, dmin * offsets[s] as f32);
            if self.has_min() {
                self.min_code(s).set(b, offsets[s]);
            }
            for (i, v) in values.iter().enumerate() {
                let q = if dl != 0.0 { (((v + ml) / dl).round() as i32).clamp(qmin, qmax) } else { 0 };
                self.quant_code(s * sub + i).set(b, q);
            }
        }
    }
}

/// The smallest f16 at least `v` (≥ 0), as f32, so a scale rounded to f16 still covers its range.
fn f16_at_least(v: f32) -> f32 {
    let h = f16::from_f32(v);
    if h.to_f32() >= v {
        h.to_f32()
    } else {
        f16::from_bits(h.to_bits() + 1).to_f32()
    }
}

/// The smallest code c ≤ code_max with c·unit ≥ need (need, unit ≥ 0).
fn code_up(need: f32, unit: f32, code_max: i32) -> i32 {
    if unit > 0.0 {
        ((need / unit).ceil() as i32).clamp(0, code_max)
    } else {
        0
    }
}

/// `raw` holds exactly the super-blocks of `out` (checked by the caller).
pub(super) fn dequantize(format: Format, raw: &[u8], out: &mut [f32]) {
    for (b, y) in raw.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(QK_K)) {
        format.dequantize_block(b, y);
    }
}
