//! The dot products of [`super`] with x86_64 AVX2 + FMA (+ F16C), chosen at run time where the
//! CPU has them.

use core::arch::x86_64::*;

use super::{half_scales, Acts, Int8Row, Unpacked, Weights, ACT_BLOCK};

/// Whether this CPU has AVX2, FMA and F16C (detected once by std, cached).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Q8_0 block layout: f16 scale, then 32 i8 quants.
const Q8_0_BYTES: usize = 2 + ACT_BLOCK;

/// The f16 at `p` as f32 (F16C; exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// One Q8_0 row (`row.len()` = 34 × blocks) times one int8 activation row of its length,
/// read from the blocks in place: the same arithmetic as [`dot_i8_n`] on the row unpacked (the
/// block's scale is its f16 as f32 there too), so a row's product is the same bits whichever
/// kernel the row count picks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_dot_i8(row: &[u8], x: Int8Row<'_>) -> f32 {
    let blocks = row.len() / Q8_0_BYTES;
    assert!(x.qs.len() == blocks * ACT_BLOCK && x.d.len() == blocks, "int8 row length");
    let ones = _mm256_set1_epi16(1);
    let (pw, px) = (row.as_ptr(), x.qs.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for b in 0..blocks {
        let blk = pw.add(b * Q8_0_BYTES);
        let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        let xv = _mm256_loadu_si256(px.add(b * ACT_BLOCK) as *const __m256i);
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)), ones);
        let s = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)), _mm256_set1_ps(*x.d.get_unchecked(b)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
    }
    hsum(acc)
}

/// One Q8_0 row times one f32 activation row of its length, read from the blocks in place:
/// per block the quants widened to f32 times the activations, times the block's scale.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let blocks = row.len() / Q8_0_BYTES;
    assert_eq!(x.len(), blocks * ACT_BLOCK, "activation row length");
    let (pw, px) = (row.as_ptr(), x.as_ptr());
    let (mut acc_a, mut acc_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..blocks {
        let (q, xb) = (pw.add(b * Q8_0_BYTES + 2), px.add(b * ACT_BLOCK));
        let f = |k: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * k) as *const __m128i)));
        let lo = _mm256_fmadd_ps(f(1), _mm256_loadu_ps(xb.add(8)), _mm256_mul_ps(f(0), _mm256_loadu_ps(xb)));
        let hi = _mm256_fmadd_ps(f(3), _mm256_loadu_ps(xb.add(24)), _mm256_mul_ps(f(2), _mm256_loadu_ps(xb.add(16))));
        let d = _mm256_set1_ps(f16_at(pw.add(b * Q8_0_BYTES)));
        if b % 2 == 0 {
            acc_a = _mm256_fmadd_ps(_mm256_add_ps(lo, hi), d, acc_a);
        } else {
            acc_b = _mm256_fmadd_ps(_mm256_add_ps(lo, hi), d, acc_b);
        }
    }
    hsum(_mm256_add_ps(acc_a, acc_b))
}

/// [`super::rows_times`] built for AVX2 + FMA (+ F16C).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_times(w: Weights<'_>, cols: usize, acts: Acts<'_>, n: usize, out: &mut [f32]) {
    super::rows_times_with::<true>(w, cols, acts, n, out)
}

/// The sum of the 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Σ a·b (same lengths) with four 8-lane FMA sums.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= len {
        // Four independent accumulators, indexed by lane group.
        #[allow(clippy::needless_range_loop)]
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * k)), _mm256_loadu_ps(pb.add(i + 8 * k)), acc[k]);
        }
        i += 32;
    }
    while i + 8 <= len {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
        i += 8;
    }
    let mut tail = 0f32;
    while i < len {
        tail += a[i] * b[i];
        i += 1;
    }
    hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) + tail
}

/// `[w · x[k]]` for `N` (1 to 4) rows, each weight vector loaded once; per row two accumulators
/// over alternate 8-value groups, then the tail, so a row's sum is the same whatever `N` is.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot_f32_n<const N: usize>(w: &[f32], x: [&[f32]; N]) -> [f32; N] {
    let len = x.iter().fold(w.len(), |m, x| m.min(x.len()));
    let pw = w.as_ptr();
    let px = x.map(|x| x.as_ptr());
    let mut even = [_mm256_setzero_ps(); N];
    let mut odd = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 16 <= len {
        let (w0, w1) = (_mm256_loadu_ps(pw.add(i)), _mm256_loadu_ps(pw.add(i + 8)));
        for k in 0..N {
            even[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px[k].add(i)), even[k]);
            odd[k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(px[k].add(i + 8)), odd[k]);
        }
        i += 16;
    }
    if i + 8 <= len {
        let w0 = _mm256_loadu_ps(pw.add(i));
        for k in 0..N {
            even[k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px[k].add(i)), even[k]);
        }
        i += 8;
    }
    let mut out = [0f32; N];
    for k in 0..N {
        out[k] = hsum(_mm256_add_ps(even[k], odd[k]));
        for j in i..len {
            out[k] += w[j] * x[k][j];
        }
    }
    out
}

/// [`super::dot_i8_rows`] for `N` (1 to 4) rows: per 32-value block, `|w|` once and each row's
/// activations with w's signs (`maddubs` multiplies unsigned by signed bytes; |w| ≤ 128 and
/// |x| ≤ 127, so no pair sum saturates), i16 pairs summed to i32 lanes (lanes 0..4: values
/// 0..16, 4..8: 16..32), converted and multiplied by the lanes' scales into one accumulator per
/// row. A row's arithmetic is the same whatever `N` is. The caller checked every row's length.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot_i8_n<const N: usize>(u: &Unpacked, x: [Int8Row<'_>; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let blocks = u.q.len() / ACT_BLOCK;
    let mut acc = [_mm256_setzero_ps(); N];
    let pw = u.q.as_ptr();
    let px = x.map(|x| x.qs.as_ptr());
    for b in 0..blocks {
        let wv = _mm256_loadu_si256(pw.add(b * ACT_BLOCK) as *const __m256i);
        let aw = _mm256_sign_epi8(wv, wv);
        let ws = if u.sub == 16 { _mm256_set_m128(_mm_set1_ps(u.scale[2 * b + 1]), _mm_set1_ps(u.scale[2 * b])) } else { _mm256_set1_ps(u.scale[b]) };
        for k in 0..N {
            let xv = _mm256_loadu_si256(px[k].add(b * ACT_BLOCK) as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
            let s = _mm256_mul_ps(ws, _mm256_set1_ps(*x[k].d.get_unchecked(b)));
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[k]);
        }
    }
    let mut out = [0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum(a);
    }
    out
}

/// [`super::unpacked_dot_f32`]: per 32-value block, the quants widened to f32 and multiplied
/// with the activations in two 16-value halves, each half times its sub-block's scale. The
/// caller checked the length.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn unpacked_dot_f32(u: &Unpacked, x: &[f32]) -> f32 {
    let blocks = u.q.len() / ACT_BLOCK;
    let (pq, px) = (u.q.as_ptr(), x.as_ptr());
    let (mut acc_lo, mut acc_hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..blocks {
        let (q, xb) = (pq.add(b * ACT_BLOCK), px.add(b * ACT_BLOCK));
        let f = |k: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * k) as *const __m128i)));
        let lo = _mm256_fmadd_ps(f(1), _mm256_loadu_ps(xb.add(8)), _mm256_mul_ps(f(0), _mm256_loadu_ps(xb)));
        let hi = _mm256_fmadd_ps(f(3), _mm256_loadu_ps(xb.add(24)), _mm256_mul_ps(f(2), _mm256_loadu_ps(xb.add(16))));
        let (s_lo, s_hi) = half_scales(u, b);
        acc_lo = _mm256_fmadd_ps(lo, _mm256_set1_ps(s_lo), acc_lo);
        acc_hi = _mm256_fmadd_ps(hi, _mm256_set1_ps(s_hi), acc_hi);
    }
    hsum(_mm256_add_ps(acc_lo, acc_hi))
}
