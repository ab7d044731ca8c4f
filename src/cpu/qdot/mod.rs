//! Fused dot products of GGUF weight rows with activation rows, for the CPU backend's matmul
//! (`kernels::matmul_acts`).
//!
//! A weight row is first *unpacked* ([`Unpacked`]): its quants as small signed integers (one
//! `i8` per value, the symmetric types' offset already taken off) and, per sub-block (16 or 32
//! values), the f32 scale and minimum ggml's dequantizer applies (`value = scale · q + min`,
//! computed in f32 exactly as [`crate::quant::dequantize`] does). This reads each block once,
//! with no per-value bit-field lookups, so the loops vectorize. The row is then multiplied with
//! every activation row of the step in one of two ways:
//!
//! - **f32 activations** ([`Acts::F32`]): the row's values are expanded to f32 (bit-equal to
//!   `dequantize`) and dotted with each activation row in f32 — the same values as dequantize
//!   then dot, summed in another order (rounding only);
//! - **int8 activations** ([`Acts::Int8`], llama.cpp's Q8 idea): each activation row is
//!   quantized once per matmul into 32-value blocks ([`Int8Rows`], as
//!   `shaders/quantize_common.wgsl` does), the quants are multiplied as integers (i32 sums per
//!   16 values) and scaled by the weight's sub-block scale times the activation block's scale;
//!   a minimum multiplies the sum of the dequantized activations (block scale × the sum of the
//!   codes, per 32 or 16 values), as llama.cpp's Q8_1 does: the product is then exactly the
//!   dequantized weights times the rounded activations, whose rounding errors meet the centred
//!   weights. (A minimum times the exact sum, as `shaders/quantize_common.wgsl` has it, leaves
//!   the rounding errors to meet the codes alone, all ≥ 0: twice the error, and SmolLM2's logits
//!   2.3 from llama.cpp's instead of 1.1.) F32, F16 and BF16 weights always take f32
//!   activations.
//!
//! The inner loops come in three builds: AVX2 + FMA on x86_64 (chosen at run time), SIMD128 in
//! wasm when the crate is built with `+simd128`, and portable Rust that LLVM vectorizes. A wasm
//! build with `+relaxed-simd` as well (the package's second module) multiplies int8 codes with
//! relaxed SIMD's dot product, giving the SIMD128 build's bits ([`LANE_ORDER`]).

use crate::gguf::GgmlType;
use crate::quant::{SubBlocks, WeightType, QK, QK_K};

/// Values per activation block of [`Int8Rows`] (one f32 scale each).
pub const ACT_BLOCK: usize = QK;

/// How a quantized type's row unpacks (the type's [`SubBlocks`]): values per sub-block (one
/// scale, maybe one minimum), whether values have a minimum term, and the codes' bias. `None`
/// for F32, F16, BF16 and unsupported types.
pub fn sub_blocks(ty: GgmlType) -> Option<SubBlocks> {
    WeightType::of(ty)?.cpu
}

/// Bytes of one row of `cols` values of `ty`, `None` if `cols` is not whole blocks of it.
pub fn row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    crate::quant::bytes_of(ty, cols as u64).map(|b| b as usize)
}

/// The f16 at `at` (little-endian) as f32, exactly (inlined bit arithmetic: the unpackers
/// read one or two per block): the exponent and mantissa moved into an f32's place and scaled
/// by 2¹¹², which is exact for normal and subnormal values; ∞ and NaN keep their class.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u32::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let magnitude = h & 0x7FFF;
    let v = if magnitude >= 0x7C00 {
        f32::from_bits(0x7F80_0000 | ((magnitude & 0x03FF) << 13))
    } else {
        f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000)
    };
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

/// A fixed-size view of a slice known to have `N` elements.
#[inline(always)]
fn arr<T, const N: usize>(s: &[T]) -> &[T; N] {
    s.try_into().expect("a slice of the array's length")
}

/// [`arr`], mutable.
#[inline(always)]
fn arr_mut<T, const N: usize>(s: &mut [T]) -> &mut [T; N] {
    s.try_into().expect("a slice of the array's length")
}

/// One weight row unpacked: `q[cols]` quants, and per sub-block of `sub` values its `scale` and
/// `min` (all zero for types without a minimum), so that value `j` is
/// `scale[j / sub] · q[j] (+ min[j / sub])` in f32, bit-equal to ggml's dequantizer.
pub struct Unpacked {
    /// The quants, `cols` of them, in the row's value order.
    pub q: Vec<i8>,
    /// Per sub-block: ggml's f32 scale (`d`, or `d · sc` for the K-quants).
    pub scale: Vec<f32>,
    /// Per sub-block: the added minimum (`m`, or `−dmin · m` for the K-quants); zeros without one.
    pub min: Vec<f32>,
    /// Values per sub-block (16 or 32).
    pub sub: usize,
    /// Whether the type has a minimum.
    pub has_min: bool,
    /// What the unpacker took off the stored codes, where those fit 7 bits ([`SubBlocks`]).
    pub bias: Option<u8>,
}

impl Unpacked {
    /// Room for rows of `cols` values of `ty`; `None` for a type that does not unpack
    /// ([`sub_blocks`]) or `cols` not whole blocks of it.
    pub fn new(ty: GgmlType, cols: usize) -> Option<Unpacked> {
        let SubBlocks { values: sub, has_min, bias } = sub_blocks(ty)?;
        row_bytes(ty, cols)?;
        Some(Unpacked { q: vec![0; cols], scale: vec![0.0; cols / sub], min: vec![0.0; cols / sub], sub, has_min, bias })
    }

    /// Unpacks `row` (exactly one row of `ty` of this unpacker's `cols`; `ty` the type it was
    /// made for). Rows of another length leave the unpacker partly written (a caller's bug,
    /// never a panic on valid input).
    #[inline(always)]
    pub fn unpack(&mut self, ty: GgmlType, row: &[u8]) {
        use GgmlType as G;
        let (q, sc, mn) = (&mut self.q[..], &mut self.scale[..], &mut self.min[..]);
        match ty {
            G::Q4_0 => legacy(row, 18, (q, sc, mn), |b, q, _| nibbles(arr(&b[2..18]), q, 8)),
            G::Q4_1 => legacy(row, 20, (q, sc, mn), |b, q, m| {
                *m = f16_at(b, 2);
                nibbles(arr(&b[4..20]), q, 0)
            }),
            G::Q5_0 => legacy(row, 22, (q, sc, mn), |b, q, _| {
                nibbles(arr(&b[6..22]), q, 0);
                fifth_bits(arr(&b[2..6]), q, 16)
            }),
            G::Q5_1 => legacy(row, 24, (q, sc, mn), |b, q, m| {
                *m = f16_at(b, 2);
                nibbles(arr(&b[8..24]), q, 0);
                fifth_bits(arr(&b[4..8]), q, 0)
            }),
            G::Q8_0 => legacy(row, 34, (q, sc, mn), |b, q, _| {
                let codes: &[u8; QK] = arr(&b[2..34]);
                for j in 0..QK {
                    q[j] = codes[j] as i8;
                }
            }),
            G::Q2_K => k_quant(row, 84, (q, sc, mn), q2_k),
            G::Q3_K => k_quant(row, 110, (q, sc, mn), q3_k),
            G::Q4_K => k_quant(row, 144, (q, sc, mn), q4_k),
            G::Q5_K => k_quant(row, 176, (q, sc, mn), q5_k),
            G::Q6_K => k_quant(row, 210, (q, sc, mn), q6_k),
            _ => {}
        }
    }

    /// The row's values (`out.len()` = cols), bit-equal to [`crate::quant::dequantize`].
    #[inline(always)]
    pub fn expand(&self, out: &mut [f32]) {
        let sub = self.sub;
        for (s, (o, q)) in out.chunks_exact_mut(sub).zip(self.q.chunks_exact(sub)).enumerate() {
            let d = self.scale[s];
            if self.has_min {
                let m = self.min[s];
                o.iter_mut().zip(q).for_each(|(o, &q)| *o = d * q as f32 + m);
            } else {
                // No `+ 0.0`: ggml keeps the sign of a zero product.
                o.iter_mut().zip(q).for_each(|(o, &q)| *o = d * q as f32);
            }
        }
    }
}

/// Unpacks the 32-value blocks of a legacy row (`bytes` per block, the f16 scale first):
/// `block(b, q, min)` writes the 32 quants (offset taken off) and the minimum.
#[inline(always)]
fn legacy(row: &[u8], bytes: usize, (q, sc, mn): (&mut [i8], &mut [f32], &mut [f32]), block: impl Fn(&[u8], &mut [i8; QK], &mut f32)) {
    for (((b, q), s), m) in row.chunks_exact(bytes).zip(q.chunks_exact_mut(QK)).zip(sc.iter_mut()).zip(mn.iter_mut()) {
        *s = f16_at(b, 0);
        block(b, arr_mut(q), m);
    }
}

/// Unpacks the 256-value super-blocks of a K-quant row (`bytes` per block) with `block`, which
/// writes one super-block's quants and its sub-blocks' scales and minimums.
#[inline(always)]
fn k_quant(row: &[u8], bytes: usize, (q, sc, mn): (&mut [i8], &mut [f32], &mut [f32]), block: impl Fn(&[u8], &mut [i8; QK_K], &mut [f32], &mut [f32])) {
    let subs = sc.len() / (q.len() / QK_K).max(1);
    for (((b, q), s), m) in row.chunks_exact(bytes).zip(q.chunks_exact_mut(QK_K)).zip(sc.chunks_exact_mut(subs)).zip(mn.chunks_exact_mut(subs)) {
        block(b, arr_mut(q), s, m);
    }
}

/// The 32 nibbles of 16 bytes minus `offset`: low nibbles are values 0..16, high ones 16..32.
#[inline(always)]
fn nibbles(qs: &[u8; 16], q: &mut [i8; QK], offset: i8) {
    let (lo, hi) = q.split_at_mut(16);
    for j in 0..16 {
        lo[j] = (qs[j] & 0x0F) as i8 - offset;
        hi[j] = (qs[j] >> 4) as i8 - offset;
    }
}

/// ORs bit j of the little-endian `qh` into bit 4 of quant j, then takes `offset` off. Each
/// byte of `qh` is spread over 8 bytes of a u64 (byte i keeps bit i; a byte's 0x7F carry sets
/// its top bit iff that bit was set), which becomes 0x10 in the bytes whose bit is set.
#[inline(always)]
fn fifth_bits(qh: &[u8; 4], q: &mut [i8; QK], offset: i8) {
    for (k, q8) in q.chunks_exact_mut(8).enumerate() {
        let isolated = (u64::from(qh[k]) * 0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
        let bits = (((isolated + 0x7F7F_7F7F_7F7F_7F7F) & 0x8080_8080_8080_8080) >> 3).to_le_bytes();
        for (q, bit) in q8.iter_mut().zip(bits) {
            *q = (*q | bit as i8) - offset;
        }
    }
}

/// Q2_K: scales[16] (scale code low nibble, min code high), qs[64], d, dmin.
#[inline(always)]
fn q2_k(b: &[u8], q: &mut [i8; QK_K], sc: &mut [f32], mn: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (s, (sc, mn)) in sc.iter_mut().zip(mn.iter_mut()).enumerate() {
        *sc = d * (b[s] & 0x0F) as f32;
        *mn = -(dmin * (b[s] >> 4) as f32);
    }
    for (h, q) in q.chunks_exact_mut(128).enumerate() {
        let qs: &[u8; 32] = arr(&b[16 + 32 * h..48 + 32 * h]);
        for (g, q) in q.chunks_exact_mut(32).enumerate() {
            q.iter_mut().zip(qs).for_each(|(q, &c)| *q = ((c >> (2 * g)) & 3) as i8);
        }
    }
}

/// Q3_K: hmask[32], qs[64], scales[12] (6-bit codes − 32), d; a quant is its 2 low bits and the
/// hmask bit, minus 4.
#[inline(always)]
fn q3_k(b: &[u8], q: &mut [i8; QK_K], sc: &mut [f32], _: &mut [f32]) {
    let d = f16_at(b, 108);
    for (s, sc) in sc.iter_mut().enumerate() {
        let low = (b[96 + s % 8] >> (4 * (s / 8))) & 0x0F;
        let high = (b[104 + s % 4] >> (2 * (s / 4))) & 3;
        *sc = d * ((low | (high << 4)) as i32 - 32) as f32;
    }
    let hmask: &[u8; 32] = arr(&b[..32]);
    for (h, q) in q.chunks_exact_mut(128).enumerate() {
        let qs: &[u8; 32] = arr(&b[32 + 32 * h..64 + 32 * h]);
        for (g, q) in q.chunks_exact_mut(32).enumerate() {
            let bit = 4 * h + g;
            for l in 0..32 {
                q[l] = (((qs[l] >> (2 * g)) & 3) | (((hmask[l] >> bit) & 1) << 2)) as i8 - 4;
            }
        }
    }
}

/// Q4_K / Q5_K's 6-bit scale and min codes of sub-block `j` from their 12 bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
fn k4_scale_min(s: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The eight 32-value sub-blocks' scales and minimums of a Q4_K / Q5_K block.
#[inline(always)]
fn k4_scales(b: &[u8], sc: &mut [f32], mn: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let codes: &[u8; 12] = arr(&b[4..16]);
    for (j, (sc, mn)) in sc.iter_mut().zip(mn.iter_mut()).enumerate() {
        let (s, m) = k4_scale_min(codes, j);
        *sc = d * s as f32;
        *mn = -(dmin * m as f32);
    }
}

/// Q4_K: d, dmin, scales[12], qs[128]; 64-value chunk c is the low nibbles of 32 bytes, then
/// their high nibbles.
#[inline(always)]
fn q4_k(b: &[u8], q: &mut [i8; QK_K], sc: &mut [f32], mn: &mut [f32]) {
    k4_scales(b, sc, mn);
    for (c, q) in q.chunks_exact_mut(64).enumerate() {
        let qs: &[u8; 32] = arr(&b[16 + 32 * c..48 + 32 * c]);
        let (lo, hi) = q.split_at_mut(32);
        for l in 0..32 {
            lo[l] = (qs[l] & 0x0F) as i8;
            hi[l] = (qs[l] >> 4) as i8;
        }
    }
}

/// Q5_K: Q4_K's layout with qh[32] before the nibbles: bit `e / 32` of qh[e % 32] is bit 4 of
/// value e.
#[inline(always)]
fn q5_k(b: &[u8], q: &mut [i8; QK_K], sc: &mut [f32], mn: &mut [f32]) {
    k4_scales(b, sc, mn);
    let qh: &[u8; 32] = arr(&b[16..48]);
    for (c, q) in q.chunks_exact_mut(64).enumerate() {
        let qs: &[u8; 32] = arr(&b[48 + 32 * c..80 + 32 * c]);
        let (lo, hi) = q.split_at_mut(32);
        for l in 0..32 {
            lo[l] = ((qs[l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4)) as i8;
            hi[l] = ((qs[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) as i8;
        }
    }
}

/// Q6_K: ql[128], qh[64], scales[16] (i8), d; a quant is 4 bits of ql and 2 of qh, minus 32.
#[inline(always)]
fn q6_k(b: &[u8], q: &mut [i8; QK_K], sc: &mut [f32], _: &mut [f32]) {
    let d = f16_at(b, 208);
    for (s, sc) in sc.iter_mut().enumerate() {
        *sc = d * (b[192 + s] as i8) as f32;
    }
    for (h, q) in q.chunks_exact_mut(128).enumerate() {
        let ql: &[u8; 64] = arr(&b[64 * h..64 * h + 64]);
        let qh: &[u8; 32] = arr(&b[128 + 32 * h..160 + 32 * h]);
        let (q01, q23) = q.split_at_mut(64);
        let (q0, q1) = q01.split_at_mut(32);
        let (q2, q3) = q23.split_at_mut(32);
        for l in 0..32 {
            q0[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            q1[l] = ((ql[32 + l] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            q2[l] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            q3[l] = ((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

/// Activation rows quantized to int8 in [`ACT_BLOCK`]-value blocks, as
/// `shaders/quantize_common.wgsl` and `model::reference`'s int8 view do: per block
/// `d = max|x| / 127` (f32), codes `round_ties_even(x · (1 / d))` (0 when `d` is 0), plus
/// `d ·` the sum of the codes per block and per 16 values (what minimums multiply: the module's
/// doc says why not the exact sum, which the shader keeps).
pub struct Int8Rows {
    /// Values per row (a multiple of [`ACT_BLOCK`]).
    pub cols: usize,
    /// Rows.
    pub n: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<f32>,
    dsum16: Vec<f32>,
    lanes: Vec<i8>,
    lane_sums: Vec<i32>,
}

/// One row of [`Int8Rows`]: `qs[cols]`, and per 32 values `d` and `sum`, per 16 `dsum16`. In a
/// build with relaxed SIMD also the codes in [`LANE_ORDER`] (`lanes[cols]`) and the sum of each
/// run of 4 of those (`lane_sums[cols / 4]`); empty in other builds.
#[derive(Clone, Copy)]
pub struct Int8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub sum: &'a [f32],
    pub dsum16: &'a [f32],
    pub lanes: &'a [i8],
    pub lane_sums: &'a [i32],
}

/// Whether this is a wasm build with relaxed SIMD (`scripts/build-web.sh`'s second build), whose
/// int8 dot product sums each run of 4 codes into an i32 lane.
pub const RELAXED: bool = cfg!(all(target_arch = "wasm32", target_feature = "relaxed-simd"));

/// The order a relaxed build keeps each 16 activation codes in (and reads the weight codes in):
/// its dot product's lane `j` then sums codes 2j, 2j+1, 2j+8 and 2j+9, the lane the SIMD128
/// kernel's `i32x4.dot_i16x8` pair gives them, so both builds' i32 lanes, and so their f32
/// sums, are the same bits.
pub const LANE_ORDER: [usize; 16] = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15];

impl Int8Rows {
    /// Quantizes `n` rows of `x` (`x.len() = n · cols`); `None` if the rows are not whole
    /// blocks (`cols` not a multiple of [`ACT_BLOCK`]) or `n` does not divide `x.len()`.
    pub fn quantize(x: &[f32], n: usize) -> Option<Int8Rows> {
        if n == 0 || x.len() % n != 0 || (x.len() / n) % ACT_BLOCK != 0 {
            return None;
        }
        let blocks = x.len() / ACT_BLOCK;
        let lanes = if RELAXED { x.len() } else { 0 };
        let mut r = Int8Rows {
            cols: x.len() / n,
            n,
            qs: vec![0; x.len()],
            d: vec![0.0; blocks],
            sum: vec![0.0; blocks],
            dsum16: vec![0.0; 2 * blocks],
            lanes: vec![0; lanes],
            lane_sums: vec![0; lanes / 4],
        };
        for (i, (v, q)) in x.chunks_exact(ACT_BLOCK).zip(r.qs.chunks_exact_mut(ACT_BLOCK)).enumerate() {
            let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            q.iter_mut().zip(v).for_each(|(q, &x)| *q = round_ties_even(x * inv) as i8);
            r.d[i] = d;
            let halves = [0, 1].map(|h| q[16 * h..16 * h + 16].iter().map(|&c| c as i32).sum::<i32>());
            r.sum[i] = d * (halves[0] + halves[1]) as f32;
            for (h, half) in halves.into_iter().enumerate() {
                r.dsum16[2 * i + h] = d * half as f32;
            }
        }
        if RELAXED {
            for ((q, l), s) in r.qs.chunks_exact(16).zip(r.lanes.chunks_exact_mut(16)).zip(r.lane_sums.chunks_exact_mut(4)) {
                l.iter_mut().zip(LANE_ORDER).for_each(|(l, j)| *l = q[j]);
                s.iter_mut().zip(l.chunks_exact(4)).for_each(|(s, run)| *s = run.iter().map(|&c| i32::from(c)).sum());
            }
        }
        Some(r)
    }

    /// Row `t` (< n).
    #[inline(always)]
    pub fn row(&self, t: usize) -> Int8Row<'_> {
        let (c, b) = (self.cols, self.cols / ACT_BLOCK);
        Int8Row {
            qs: &self.qs[t * c..(t + 1) * c],
            d: &self.d[t * b..(t + 1) * b],
            sum: &self.sum[t * b..(t + 1) * b],
            dsum16: &self.dsum16[2 * t * b..2 * (t + 1) * b],
            lanes: if RELAXED { &self.lanes[t * c..(t + 1) * c] } else { &[] },
            lane_sums: if RELAXED { &self.lane_sums[t * c / 4..(t + 1) * c / 4] } else { &[] },
        }
    }
}

/// `v.round_ties_even()` for |v| ≤ 2²² (the codes: |v| ≤ 127), NaN for NaN, without a library
/// call where the target lacks a rounding instruction: adding and taking off 1.5 · 2²³ leaves
/// `v` rounded to an integer in the default rounding mode (to nearest, ties to even).
#[inline(always)]
fn round_ties_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() <= 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v.round_ties_even()
    }
}

/// Σ a·b with eight independent sums (vectorized; the order differs from a plain loop by
/// rounding only). `a` and `b` have one length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let mut s = [0f32; 8];
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail
}

/// The activations a matmul multiplies its weights with.
#[derive(Clone, Copy)]
pub enum Acts<'a> {
    /// `n` rows of `cols` f32 values, row after row.
    F32(&'a [f32]),
    /// `n` rows quantized to int8 (float weight types use `F32`'s rows, the second field).
    Int8(&'a Int8Rows, &'a [f32]),
}

/// Weight rows, in their file's format or as f32 values.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    /// Rows of `cols` f32 values.
    F32(&'a [f32]),
    /// Rows of `cols` values of a GGUF type, [`row_bytes`] each.
    Blocks(GgmlType, &'a [u8]),
}

/// `out[i · n + t] = Σ_c w[i][c] · x[t][c]` for every weight row `i` of `w` (`rows` of them,
/// `cols` values each) and activation row `t < n`: out `[rows][n]`. `w` must hold whole rows of
/// `cols` values and `acts` `n` rows of `cols`; anything else is a caller's bug (panics).
pub fn rows_times(w: Weights<'_>, cols: usize, acts: Acts<'_>, n: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { avx2::rows_times(w, cols, acts, n, out) };
        return;
    }
    rows_times_with::<false>(w, cols, acts, n, out)
}

/// [`rows_times`] with the kernels of one instruction set (`AVX2`: x86_64 AVX2 + FMA, only
/// called where the CPU has them; else portable). Inlined into a function built for that set,
/// so that the unpacking loops are vectorized for it too.
#[inline(always)]
fn rows_times_with<const AVX2: bool>(w: Weights<'_>, cols: usize, acts: Acts<'_>, n: usize, out: &mut [f32]) {
    let rows = out.len() / n.max(1);
    let x_f32 = match acts {
        Acts::F32(x) | Acts::Int8(_, x) => x,
    };
    assert_eq!(x_f32.len(), n * cols, "activations");
    let mut values = vec![0f32; cols];
    let (ty, data) = match w {
        Weights::F32(v) => {
            assert_eq!(v.len(), rows * cols, "weights");
            for (wr, o) in v.chunks_exact(cols.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
                f32_times::<AVX2>(wr, x_f32, o);
            }
            return;
        }
        Weights::Blocks(ty, data) => (ty, data),
    };
    let rb = row_bytes(ty, cols).expect("whole blocks");
    assert_eq!(data.len(), rows * rb, "weights");
    let Some(mut u) = Unpacked::new(ty, cols) else {
        // F16 / BF16: decoded to f32, then f32 dot products.
        for (wr, o) in data.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
            decode_float(ty, wr, &mut values);
            f32_times::<AVX2>(&values, x_f32, o);
        }
        return;
    };
    // Q8_0 rows are their quants already: read in place for few activation rows (decode).
    #[cfg(target_arch = "x86_64")]
    if AVX2 && ty == GgmlType::Q8_0 && n < 4 {
        for (wr, o) in data.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
            for (t, o) in o.iter_mut().enumerate() {
                // SAFETY: AVX2 is only true where the CPU has AVX2, FMA and F16C; the kernels
                // check the lengths.
                *o = match acts {
                    Acts::F32(x) => unsafe { avx2::q8_0_dot_f32(wr, &x[t * cols..(t + 1) * cols]) },
                    Acts::Int8(xq, _) => unsafe { avx2::q8_0_dot_i8(wr, xq.row(t)) },
                };
            }
        }
        return;
    }
    // Few activation rows (decode) with AVX2 or SIMD128: each unpacked row is multiplied in
    // registers, its minimums times each row's sub-block sums, without expanding it to f32
    // values first.
    let fused = (AVX2 || SIMD128) && n < 4;
    let x_sums: Vec<f32> = if fused && u.has_min { x_f32.chunks_exact(u.sub).map(|c| c.iter().sum()).collect() } else { Vec::new() };
    for (wr, o) in data.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
        u.unpack(ty, wr);
        match acts {
            Acts::F32(x) if fused => {
                let subs = cols / u.sub;
                for (t, o) in o.iter_mut().enumerate() {
                    *o = unpacked_dot_f32::<AVX2>(&u, &x[t * cols..(t + 1) * cols]);
                    if u.has_min {
                        *o += dot_f32::<AVX2>(&u.min, &x_sums[t * subs..(t + 1) * subs]);
                    }
                }
            }
            Acts::F32(x) => {
                u.expand(&mut values);
                f32_times::<AVX2>(&values, x, o);
            }
            Acts::Int8(xq, _) => int8_times::<AVX2>(&u, xq, o),
        }
    }
}

/// Whether this is a wasm build with SIMD128 (`.cargo/config.toml` turns it on).
const SIMD128: bool = cfg!(all(target_arch = "wasm32", target_feature = "simd128"));

/// F16 / BF16 values of `raw` into `out`.
#[inline(always)]
fn decode_float(ty: GgmlType, raw: &[u8], out: &mut [f32]) {
    if ty == GgmlType::F16 {
        out.iter_mut().zip(raw.chunks_exact(2)).for_each(|(o, b)| *o = f16_at(b, 0));
    } else {
        out.iter_mut().zip(raw.chunks_exact(2)).for_each(|(o, b)| *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16));
    }
}

/// `o[t] = w · x[t]` for each of the `o.len()` rows of `x`: four at a time, then the one to three
/// left together, each row's sum the same bits whatever rows are beside it.
#[inline(always)]
fn f32_times<const AVX2: bool>(w: &[f32], x: &[f32], o: &mut [f32]) {
    let cols = w.len();
    let row = |t: usize| &x[t * cols..(t + 1) * cols];
    let mut quads = o.chunks_exact_mut(4);
    let mut t = 0;
    for o4 in &mut quads {
        o4.copy_from_slice(&dot_f32_n::<AVX2, 4>(w, [row(t), row(t + 1), row(t + 2), row(t + 3)]));
        t += 4;
    }
    let rest = quads.into_remainder();
    match rest.len() {
        3 => rest.copy_from_slice(&dot_f32_n::<AVX2, 3>(w, [row(t), row(t + 1), row(t + 2)])),
        2 => rest.copy_from_slice(&dot_f32_n::<AVX2, 2>(w, [row(t), row(t + 1)])),
        1 => rest.copy_from_slice(&dot_f32_n::<AVX2, 1>(w, [row(t)])),
        _ => {}
    }
}

/// `Σ_s scale[s] · Σ_{j in s} q[j] · x[j]` (f32; `x` has the row's length): the unpacked row
/// times `x` without its minimums.
#[inline(always)]
fn unpacked_dot_f32<const AVX2: bool>(u: &Unpacked, x: &[f32]) -> f32 {
    assert_eq!(x.len(), u.q.len(), "activation row length");
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `dot_f32`; the length was checked above.
        return unsafe { avx2::unpacked_dot_f32(u, x) };
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return simd128::unpacked_dot_f32(u, x);
    #[allow(unreachable_code)]
    let mut acc = 0f32;
    for (s, (q, x)) in u.q.chunks_exact(u.sub).zip(x.chunks_exact(u.sub)).enumerate() {
        acc += u.scale[s] * q.iter().zip(x).map(|(&q, x)| q as f32 * x).sum::<f32>();
    }
    acc
}

/// `o[t] = u · xq[t]` with int8 activations, for each of the `o.len()` rows of `xq`: four rows
/// at a time, then the one to three left together.
#[inline(always)]
fn int8_times<const AVX2: bool>(u: &Unpacked, xq: &Int8Rows, o: &mut [f32]) {
    let mut quads = o.chunks_exact_mut(4);
    let mut t = 0;
    for o4 in &mut quads {
        int8_rows::<AVX2, 4>(u, xq, t, o4);
        t += 4;
    }
    let rest = quads.into_remainder();
    match rest.len() {
        3 => int8_rows::<AVX2, 3>(u, xq, t, rest),
        2 => int8_rows::<AVX2, 2>(u, xq, t, rest),
        1 => int8_rows::<AVX2, 1>(u, xq, t, rest),
        _ => {}
    }
}

/// `o[k] = u · xq[t + k]` for the `N` rows from `t`, minimums included.
#[inline(always)]
fn int8_rows<const AVX2: bool, const N: usize>(u: &Unpacked, xq: &Int8Rows, t: usize, o: &mut [f32]) {
    let xs: [Int8Row<'_>; N] = std::array::from_fn(|k| xq.row(t + k));
    let r = dot_i8_rows::<AVX2, N>(u, xs);
    for (o, (r, x)) in o.iter_mut().zip(r.into_iter().zip(xs)) {
        *o = r + min_term::<AVX2>(u, x);
    }
}

/// What the weights' minimums add: Σ min · (dequantized block sum) per 32-value or 16-value
/// sub-block; 0 without minimums.
#[inline(always)]
fn min_term<const AVX2: bool>(u: &Unpacked, x: Int8Row<'_>) -> f32 {
    match (u.has_min, u.sub) {
        (false, _) => 0.0,
        (true, 16) => dot_f32::<AVX2>(&u.min, x.dsum16),
        (true, _) => dot_f32::<AVX2>(&u.min, x.sum),
    }
}

/// Σ a·b in f32 (same lengths).
#[inline(always)]
fn dot_f32<const AVX2: bool>(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is only true where the CPU has AVX2 and FMA.
        return unsafe { avx2::dot_f32(a, b) };
    }
    dot(a, b)
}

/// `[w · x[k]]` in f32 for `N` rows (all of `w`'s length), a row's sum the same whatever `N`.
#[inline(always)]
fn dot_f32_n<const AVX2: bool, const N: usize>(w: &[f32], x: [&[f32]; N]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `dot_f32`.
        return unsafe { avx2::dot_f32_n(w, x) };
    }
    x.map(|x| dot(w, x))
}

/// The integer part of `u · x[k]` for `N` int8 rows: Σ over blocks of (weight sub-block scale ×
/// activation block scale) × the i32 sum of code products (per 16 values for 16-value
/// sub-blocks). Minimums are [`min_term`]'s. A row's result does not depend on `N`.
#[inline(always)]
fn dot_i8_rows<const AVX2: bool, const N: usize>(u: &Unpacked, x: [Int8Row<'_>; N]) -> [f32; N] {
    for x in &x {
        assert!(x.qs.len() == u.q.len() && x.d.len() * ACT_BLOCK == u.q.len(), "int8 row length");
        assert!(!RELAXED || (x.lanes.len() == u.q.len() && x.lane_sums.len() * 4 == u.q.len()), "int8 row lanes");
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `dot_f32`; the lengths were checked above.
        return unsafe { avx2::dot_i8_n(u, x) };
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return simd128::dot_i8_n(u, x);
    #[allow(unreachable_code)]
    x.map(|x| dot_i8_portable(u, x))
}

/// [`dot_i8_rows`] for one row in portable Rust (i32 sums per 16 values, which LLVM vectorizes).
#[inline(always)]
fn dot_i8_portable(u: &Unpacked, x: Int8Row<'_>) -> f32 {
    let mut acc = [0f32; 2];
    for (b, (w, q)) in u.q.chunks_exact(ACT_BLOCK).zip(x.qs.chunks_exact(ACT_BLOCK)).enumerate() {
        let (w, q): (&[i8; 32], &[i8; 32]) = (arr(w), arr(q));
        let mut s = [0i32; 2];
        // Indexed, as the SIMD twins are: LLVM vectorizes the fixed 16-value runs.
        #[allow(clippy::needless_range_loop)]
        for h in 0..2 {
            for j in 16 * h..16 * h + 16 {
                s[h] += i32::from(w[j]) * i32::from(q[j]);
            }
        }
        acc[b % 2] += x.d[b] * block_scaled(u, b, s);
    }
    acc[0] + acc[1]
}

/// The scales of block `b`'s two 16-value halves (one scale for both where sub-blocks are 32).
#[inline(always)]
fn half_scales(u: &Unpacked, b: usize) -> (f32, f32) {
    if u.sub == 16 {
        (u.scale[2 * b], u.scale[2 * b + 1])
    } else {
        (u.scale[b], u.scale[b])
    }
}

/// Block `b`'s two 16-value integer sums times the weight's sub-block scales.
#[inline]
fn block_scaled(u: &Unpacked, b: usize, s: [i32; 2]) -> f32 {
    if u.sub == 16 {
        u.scale[2 * b] * s[0] as f32 + u.scale[2 * b + 1] * s[1] as f32
    } else {
        u.scale[b] * (s[0] + s[1]) as f32
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// `Σ_c w[c] · x[c]` for one row `w` of type `ty` (`x.len()` values) with f32 activations
/// (single-row form of [`rows_times`]).
pub fn row_dot_f32(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let mut out = [0f32];
    rows_times(Weights::Blocks(ty, w), x.len(), Acts::F32(x), 1, &mut out);
    out[0]
}
