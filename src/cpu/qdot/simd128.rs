//! The dot products of [`super`] in wasm SIMD128 (every browser with WebGPU has it, and the
//! browsers the CPU backend is for): quants multiplied in registers, up to four rows per weight
//! load.

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

#[inline(always)]
fn hsum(v: v128) -> f32 {
    (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v)) + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v))
}

/// [`super::dot_i8_rows`] with SIMD128, for `N` (1 to 4) activation rows at once: per 32-value
/// block the weight codes are loaded and widened to i16 once, then, per row, multiplied with its
/// codes by `i32x4.dot_i16x8` (|w| ≤ 128, |x| ≤ 127: no pair overflows). Where the block has one
/// scale (32-value sub-blocks) its two halves' i32 sums are added first (exact: |sum| < 2²⁰) and
/// scaled once; 16-value sub-blocks scale each half. Each row's arithmetic is the same whatever `N`
/// is, so a row's product does not depend on the rows beside it (a draft's rows, a batch). The
/// caller checked every row's length.
#[inline(always)]
pub(super) fn dot_i8_n<const N: usize>(u: &Unpacked, x: [Int8Row<'_>; N]) -> [f32; N] {
    #[cfg(target_feature = "relaxed-simd")]
    if let Some(bias) = u.bias {
        return match (u.sub == 16, bias > 0) {
            (true, true) => dot_i8_relaxed::<N, true, true>(u, x, bias),
            (true, false) => dot_i8_relaxed::<N, true, false>(u, x, 0),
            (false, true) => dot_i8_relaxed::<N, false, true>(u, x, bias),
            (false, false) => dot_i8_relaxed::<N, false, false>(u, x, 0),
        };
    }
    if u.sub == 16 {
        dot_i8_scaled::<N, true>(u, x)
    } else {
        dot_i8_scaled::<N, false>(u, x)
    }
}

/// [`dot_i8_n`] with the sub-block size fixed: `HALVES`, a scale per 16-value half.
#[inline(always)]
fn dot_i8_scaled<const N: usize, const HALVES: bool>(u: &Unpacked, x: [Int8Row<'_>; N]) -> [f32; N] {
    let blocks = u.q.len() / ACT_BLOCK;
    let pw = u.q.as_ptr();
    let px = x.map(|x| x.qs.as_ptr());
    let mut acc = [f32x4_splat(0.0); N];
    for b in 0..blocks {
        // SAFETY: the weight row and every activation row hold `blocks` whole blocks of 32
        // codes (checked by the caller); block b reads codes 32b..32b+32, unaligned loads.
        let (w_lo, w_hi) = unsafe { (v128_load(pw.add(b * ACT_BLOCK) as *const v128), v128_load(pw.add(b * ACT_BLOCK + 16) as *const v128)) };
        let w = [i16x8_extend_low_i8x16(w_lo), i16x8_extend_high_i8x16(w_lo), i16x8_extend_low_i8x16(w_hi), i16x8_extend_high_i8x16(w_hi)];
        let (s_lo, s_hi) = half_scales(u, b);
        for k in 0..N {
            // SAFETY: as above.
            let (x_lo, x_hi) = unsafe { (v128_load(px[k].add(b * ACT_BLOCK) as *const v128), v128_load(px[k].add(b * ACT_BLOCK + 16) as *const v128)) };
            let lo = i32x4_add(i32x4_dot_i16x8(w[0], i16x8_extend_low_i8x16(x_lo)), i32x4_dot_i16x8(w[1], i16x8_extend_high_i8x16(x_lo)));
            let hi = i32x4_add(i32x4_dot_i16x8(w[2], i16x8_extend_low_i8x16(x_hi)), i32x4_dot_i16x8(w[3], i16x8_extend_high_i8x16(x_hi)));
            acc[k] = f32x4_add(acc[k], scaled::<HALVES>((lo, hi), (s_lo, s_hi), x[k].d[b]));
        }
    }
    acc.map(hsum)
}

/// One block's i32 lanes (`lo`, `hi`: its two 16-value halves) in f32 times the weight's scales
/// times the activation block's scale `d`: each half by its own scale (`HALVES`), or the halves
/// added first (exact) and scaled once. Both int8 kernels end a block with it.
#[inline(always)]
fn scaled<const HALVES: bool>((lo, hi): (v128, v128), (s_lo, s_hi): (f32, f32), d: f32) -> v128 {
    if HALVES {
        f32x4_add(f32x4_mul(f32x4_convert_i32x4(lo), f32x4_splat(s_lo * d)), f32x4_mul(f32x4_convert_i32x4(hi), f32x4_splat(s_hi * d)))
    } else {
        f32x4_mul(f32x4_convert_i32x4(i32x4_add(lo, hi)), f32x4_splat(s_lo * d))
    }
}

/// [`dot_i8_n`] with relaxed SIMD's int8 dot product (`i32x4.relaxed_dot_i8x16_i7x16_add_s`; on
/// x86 a `pmaddubsw` and a `pmaddwd`) for weights whose codes plus `bias` fit 7 bits (every
/// type but Q8_0): the activation codes are read in [`super::LANE_ORDER`] (kept so by
/// [`super::Int8Rows`]), the weight codes put in that order by one shuffle and biased to ≥ 0
/// (`BIASED`), and each i32 lane starts at −bias × the sum of its 4 activation codes. Each lane
/// is then exactly the i32 lane of [`dot_i8_scaled`], and the rest is its arithmetic: the same
/// bits as the SIMD128 build, for any `N`. The caller checked every row's length.
#[cfg(target_feature = "relaxed-simd")]
#[inline(always)]
fn dot_i8_relaxed<const N: usize, const HALVES: bool, const BIASED: bool>(u: &Unpacked, x: [Int8Row<'_>; N], bias: u8) -> [f32; N] {
    let blocks = u.q.len() / ACT_BLOCK;
    let pw = u.q.as_ptr();
    let (px, ps) = (x.map(|x| x.lanes.as_ptr()), x.map(|x| x.lane_sums.as_ptr()));
    let (bias8, minus_bias) = (i8x16_splat(bias as i8), i32x4_splat(-i32::from(bias)));
    let in_lane_order = |v: v128| {
        let v = i8x16_shuffle::<0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15>(v, v);
        if BIASED {
            i8x16_add(v, bias8)
        } else {
            v
        }
    };
    let mut acc = [f32x4_splat(0.0); N];
    for b in 0..blocks {
        // SAFETY: the weight row and every activation row hold `blocks` whole blocks of 32
        // codes, and the rows' lane sums 8 per block (checked by the caller; `Int8Rows` makes
        // both in a relaxed build); block b reads codes 32b..32b+32 and sums 8b..8b+8,
        // unaligned loads.
        let (w_lo, w_hi) = unsafe { (v128_load(pw.add(b * ACT_BLOCK) as *const v128), v128_load(pw.add(b * ACT_BLOCK + 16) as *const v128)) };
        let (w_lo, w_hi) = (in_lane_order(w_lo), in_lane_order(w_hi));
        let (s_lo, s_hi) = half_scales(u, b);
        for k in 0..N {
            // SAFETY: as above.
            let (x_lo, x_hi) = unsafe { (v128_load(px[k].add(b * ACT_BLOCK) as *const v128), v128_load(px[k].add(b * ACT_BLOCK + 16) as *const v128)) };
            let (c_lo, c_hi) = if BIASED {
                // SAFETY: as above.
                unsafe {
                    (i32x4_mul(v128_load(ps[k].add(8 * b) as *const v128), minus_bias), i32x4_mul(v128_load(ps[k].add(8 * b + 4) as *const v128), minus_bias))
                }
            } else {
                (i32x4_splat(0), i32x4_splat(0))
            };
            let lo = i32x4_relaxed_dot_i8x16_i7x16_add(x_lo, w_lo, c_lo);
            let hi = i32x4_relaxed_dot_i8x16_i7x16_add(x_hi, w_hi, c_hi);
            acc[k] = f32x4_add(acc[k], scaled::<HALVES>((lo, hi), (s_lo, s_hi), x[k].d[b]));
        }
    }
    acc.map(hsum)
}
