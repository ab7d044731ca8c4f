//! The legacy block formats: 32 values per block, one f16 scale `d` first.
//!
//! | type | bytes | layout                                  | value          |
//! |------|-------|-----------------------------------------|----------------|
//! | Q4_0 | 18    | d, 16 nibble bytes                      | d·(q − 8)      |
//! | Q4_1 | 20    | d, m, 16 nibble bytes                   | d·q + m        |
//! | Q5_0 | 22    | d, qh (u32), 16 nibble bytes            | d·(q − 16)     |
//! | Q5_1 | 24    | d, m, qh (u32), 16 nibble bytes         | d·q + m        |
//! | Q8_0 | 34    | d, 32 signed bytes                      | d·q            |
//!
//! Nibble order (the one that bites): the low nibble of byte j is element j, the high nibble
//! element j + 16. In Q5_*, bit j of the little-endian `qh` is bit 4 of element j.
//!
//! The quantizers are ggml's `quantize_row_*_ref`: the symmetric types map the value of largest
//! magnitude (the first one on a tie) to the most negative quant, the types with a minimum
//! spread [min, max] over every level, and Q8_0 scales by max|x| / 127 and rounds half away
//! from zero.

use super::{f16_at, f16_bytes, QK};
use crate::gguf::GgmlType;

#[derive(Clone, Copy)]
pub(super) struct Format {
    /// Bits per quant: 4, 5 or 8.
    bits: u32,
    /// Whether blocks carry an f16 minimum after the scale (Q4_1, Q5_1).
    has_min: bool,
}

impl Format {
    /// `t` is one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
    pub(super) fn of(t: GgmlType) -> Format {
        match t {
            GgmlType::Q4_0 => Format { bits: 4, has_min: false },
            GgmlType::Q4_1 => Format { bits: 4, has_min: true },
            GgmlType::Q5_0 => Format { bits: 5, has_min: false },
            GgmlType::Q5_1 => Format { bits: 5, has_min: true },
            _ => Format { bits: 8, has_min: false },
        }
    }

    pub(super) fn block_bytes(self) -> usize {
        self.qs_at() + if self.bits == 8 { QK } else { QK / 2 }
    }

    /// Where the u32 of fifth bits starts (Q5_*).
    fn qh_at(self) -> usize {
        if self.has_min {
            4
        } else {
            2
        }
    }

    /// Where the quants start.
    fn qs_at(self) -> usize {
        self.qh_at() + if self.bits == 5 { 4 } else { 0 }
    }

    /// What the stored quant is offset by in the symmetric 4- and 5-bit types.
    fn offset(self) -> i32 {
        if self.has_min || self.bits == 8 {
            0
        } else {
            1 << (self.bits - 1)
        }
    }

    fn qmax(self) -> i32 {
        (1 << self.bits) - 1
    }

    /// Quant j of block `b` as stored: unsigned for 4 and 5 bits, signed for Q8_0.
    fn code(self, b: &[u8], j: usize) -> i32 {
        let qs = &b[self.qs_at()..];
        if self.bits == 8 {
            return qs[j] as i8 as i32;
        }
        let nibble = if j < QK / 2 { qs[j] & 0x0F } else { qs[j - QK / 2] >> 4 };
        let high = if self.bits == 5 { (qh(b, self.qh_at()) >> j) & 1 } else { 0 };
        nibble as i32 | (high << 4) as i32
    }

    /// Stores quant j into block `b`, whose quant bytes start zeroed.
    fn set_code(self, b: &mut [u8], j: usize, code: i32) {
        let qs_at = self.qs_at();
        if self.bits == 8 {
            b[qs_at + j] = code as i8 as u8;
            return;
        }
        let nibble = (code & 0x0F) as u8;
        if j < QK / 2 {
            b[qs_at + j] |= nibble;
        } else {
            b[qs_at + j - QK / 2] |= nibble << 4;
        }
        if self.bits == 5 && code & 0x10 != 0 {
            b[self.qh_at() + j / 8] |= 1 << (j % 8);
        }
    }

    /// ggml's reference quantizer for one block.
    pub(super) fn quantize_block(self, x: &[f32], b: &mut [u8]) {
        if self.bits == 8 {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b[..2].copy_from_slice(&f16_bytes(d));
            // f32::round rounds half away from zero, as C's roundf.
            x.iter().enumerate().for_each(|(j, v)| self.set_code(b, j, ((v * id).round() as i32).clamp(-127, 127)));
        } else if self.has_min {
            let min = x.iter().copied().fold(f32::MAX, f32::min);
            let max = x.iter().copied().fold(-f32::MAX, f32::max);
            let d = (max - min) / self.qmax() as f32;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b[..2].copy_from_slice(&f16_bytes(d));
            b[2..4].copy_from_slice(&f16_bytes(min));
            // `as i32` truncates, as the C cast to an integer does.
            x.iter().enumerate().for_each(|(j, v)| self.set_code(b, j, (((v - min) * id + 0.5) as i32).clamp(0, self.qmax())));
        } else {
            // The value of largest magnitude, sign kept; the first one wins a tie.
            let max = x.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let d = max / -(self.offset() as f32);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b[..2].copy_from_slice(&f16_bytes(d));
            let shift = self.offset() as f32 + 0.5;
            x.iter().enumerate().for_each(|(j, v)| self.set_code(b, j, ((v * id + shift) as i32).clamp(0, self.qmax())));
        }
    }
}

fn qh(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `raw` holds exactly the blocks of `out` (checked by the caller).
pub(super) fn dequantize(format: Format, raw: &[u8], out: &mut [f32]) {
    for (b, y) in raw.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let offset = format.offset();
        if format.has_min {
            let m = f16_at(b, 2);
            y.iter_mut().enumerate().for_each(|(j, y)| *y = d * format.code(b, j) as f32 + m);
        } else {
            // No `+ 0.0`: ggml leaves d·0 with d < 0 as −0.
            y.iter_mut().enumerate().for_each(|(j, y)| *y = d * (format.code(b, j) - offset) as f32);
        }
    }
}
