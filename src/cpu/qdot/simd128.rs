//! The dot products of [`super`] in wasm SIMD128 (every browser with WebGPU has it, and the
//! browsers the CPU backend is for): quants multiplied in registers, four rows per weight load.

use core::arch::wasm32::*;

use super::{half_scales, Int8Row, Unpacked, ACT_BLOCK};

/// [`super::unpacked_dot_f32`] with SIMD128: per 32-value block, the quants widened to f32
/// (i8 → i16 → i32 → f32) and multiplied with the activations four at a time, each 16-value
/// half times its sub-block's scale into its own accumulator. The caller checked the length.
#[inline(always)]
pub(super) fn unpacked_dot_f32(u: &Unpacked, x: &[f32]) -> f32 {
    let blocks = u.q.len() / ACT_BLOCK;
    let (pq, px) = (u.q.as_ptr(), x.as_ptr());
    let (mut acc_lo, mut acc_hi) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for b in 0..blocks {
        // SAFETY: `q` and `x` hold `blocks` whole blocks of 32 values (checked by the caller);
        // block b reads values 32b..32b+32 of each, unaligned loads.
        let (lo, hi) = unsafe {
            let (q, xb) = (pq.add(b * ACT_BLOCK), px.add(b * ACT_BLOCK));
            let half = |h: usize| {
                let v = v128_load(q.add(16 * h) as *const v128);
                let (a, c) = (i16x8_extend_low_i8x16(v), i16x8_extend_high_i8x16(v));
                let f = [i32x4_extend_low_i16x8(a), i32x4_extend_high_i16x8(a), i32x4_extend_low_i16x8(c), i32x4_extend_high_i16x8(c)]
                    .map(|v| f32x4_convert_i32x4(v));
                let xs = |k: usize| v128_load(xb.add(16 * h + 4 * k) as *const v128);
                f32x4_add(f32x4_add(f32x4_mul(f[0], xs(0)), f32x4_mul(f[1], xs(1))), f32x4_add(f32x4_mul(f[2], xs(2)), f32x4_mul(f[3], xs(3))))
            };
            (half(0), half(1))
        };
        let (s_lo, s_hi) = half_scales(u, b);
        acc_lo = f32x4_add(acc_lo, f32x4_mul(lo, f32x4_splat(s_lo)));
        acc_hi = f32x4_add(acc_hi, f32x4_mul(hi, f32x4_splat(s_hi)));
    }
    hsum(f32x4_add(acc_lo, acc_hi))
}

/// The i32 code-product sums of one 16-value half: i8 widened to i16, `i32x4.dot_i16x8`
/// pairs (|w| ≤ 128, |x| ≤ 127: no pair overflows), four lanes each holding four products.
#[inline(always)]
fn half_dot(w: v128, x: v128) -> v128 {
    i32x4_add(i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(x)), i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(x)))
}

#[inline(always)]
fn hsum(v: v128) -> f32 {
    (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v)) + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v))
}

/// [`super::dot_i8_x4`] with SIMD128: per 32-value block, each half's i32 sums
/// ([`half_dot`]) converted to f32 and multiplied by (weight half scale × activation block
/// scale) into one accumulator per row; the weight halves are loaded once for the four rows.
/// The caller checked every row's length.
#[inline(always)]
pub(super) fn dot_i8_x4(u: &Unpacked, x: [Int8Row<'_>; 4]) -> [f32; 4] {
    let blocks = u.q.len() / ACT_BLOCK;
    let pw = u.q.as_ptr();
    let px = x.map(|x| x.qs.as_ptr());
    let mut acc = [f32x4_splat(0.0); 4];
    for b in 0..blocks {
        // SAFETY: the weight row and every activation row hold `blocks` whole blocks of 32
        // codes (checked by the caller); block b reads codes 32b..32b+32, unaligned loads.
        let (w_lo, w_hi) = unsafe { (v128_load(pw.add(b * ACT_BLOCK) as *const v128), v128_load(pw.add(b * ACT_BLOCK + 16) as *const v128)) };
        let (s_lo, s_hi) = half_scales(u, b);
        for k in 0..4 {
            // SAFETY: as above.
            let (x_lo, x_hi) = unsafe { (v128_load(px[k].add(b * ACT_BLOCK) as *const v128), v128_load(px[k].add(b * ACT_BLOCK + 16) as *const v128)) };
            let d = x[k].d[b];
            let lo = f32x4_mul(f32x4_convert_i32x4(half_dot(w_lo, x_lo)), f32x4_splat(s_lo * d));
            let hi = f32x4_mul(f32x4_convert_i32x4(half_dot(w_hi, x_hi)), f32x4_splat(s_hi * d));
            acc[k] = f32x4_add(acc[k], f32x4_add(lo, hi));
        }
    }
    acc.map(hsum)
}

/// [`dot_i8_x4`] for one row.
#[inline(always)]
pub(super) fn dot_i8(u: &Unpacked, x: Int8Row<'_>) -> f32 {
    let blocks = u.q.len() / ACT_BLOCK;
    let (pw, px) = (u.q.as_ptr(), x.qs.as_ptr());
    let mut acc = f32x4_splat(0.0);
    for b in 0..blocks {
        // SAFETY: as in `dot_i8_x4`.
        let (lo, hi) = unsafe {
            let (w, q) = (pw.add(b * ACT_BLOCK), px.add(b * ACT_BLOCK));
            (
                half_dot(v128_load(w as *const v128), v128_load(q as *const v128)),
                half_dot(v128_load(w.add(16) as *const v128), v128_load(q.add(16) as *const v128)),
            )
        };
        let (s_lo, s_hi) = half_scales(u, b);
        let d = x.d[b];
        acc = f32x4_add(acc, f32x4_add(f32x4_mul(f32x4_convert_i32x4(lo), f32x4_splat(s_lo * d)), f32x4_mul(f32x4_convert_i32x4(hi), f32x4_splat(s_hi * d))));
    }
    hsum(acc)
}
