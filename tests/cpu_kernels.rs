//! The CPU backend's matrix products (`pagedlm::cpu::kernels::matmul_acts`, `cpu::qdot`) for
//! every supported weight type: the f32 path against dequantize + a float64 dot product, the
//! int8-activation path against the dequantized weights times the int8-rounded activations in
//! float64 (minimums included: they multiply the rounded sums), the unpacked rows bit-equal to
//! the dequantizer,
//! and the activation quantization against its formula. Odd row counts (rows that do not fill
//! the last parallel task), one and many activation rows, weights from the quantizers and from
//! random bytes (every code of every field). Pure CPU; natively and in the browser, where a
//! row's int8 product is also checked bit-equal whatever rows share its step.

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use pagedlm::cpu::kernels::{matmul, matmul_acts, QMatrix};
use pagedlm::cpu::qdot::{Acts, Int8Rows, Unpacked, ACT_BLOCK, LANE_ORDER, RELAXED};
use pagedlm::gguf::GgmlType;
use pagedlm::quant::{bytes_of, dequantize, quantize};
use pagedlm::rng::Rng;

/// Relative tolerance (of Σ|w·x|) for the f32 and int8 paths: f32 rounding of sums of a few
/// hundred products, far below any one quantization step.
const REL_TOL: f64 = 1e-5;

/// The byte offsets of a type's f16 fields (scales and minimums) within one block.
fn f16_fields(t: GgmlType) -> &'static [usize] {
    use GgmlType as G;
    match t {
        G::Q4_0 | G::Q5_0 | G::Q8_0 => &[0],
        G::Q4_1 | G::Q5_1 | G::Q4_K | G::Q5_K => &[0, 2],
        G::Q2_K => &[80, 82],
        G::Q3_K => &[108],
        G::Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` rows of `cols` values of `t`: from the quantizer (`random_bytes` false), or random
/// bytes with finite f16 scales in [-0.05, 0.05] (every code of every field occurs).
fn weights(t: GgmlType, rows: usize, cols: usize, random_bytes: bool, rng: &mut Rng) -> Vec<u8> {
    let floats = matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    if !random_bytes || floats {
        return quantize(t, &rng.vec_uniform(rows * cols, -1.0, 1.0)).unwrap();
    }
    let mut raw: Vec<u8> = (0..bytes_of(t, (rows * cols) as u64).unwrap()).map(|_| rng.next_u32() as u8).collect();
    let block_bytes = t.block_size().unwrap().1 as usize;
    for block in raw.chunks_exact_mut(block_bytes) {
        for &at in f16_fields(t) {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(rng.uniform(-0.05, 0.05)).to_le_bytes());
        }
    }
    raw
}

/// The supported types with the column counts their blocks allow (odd block counts included).
fn cases() -> Vec<(GgmlType, usize)> {
    GgmlType::SUPPORTED
        .into_iter()
        .flat_map(|t| {
            let block = t.block_size().unwrap().0 as usize;
            let cols: &[usize] = if block == 256 { &[256, 768] } else { &[96, 576] };
            cols.iter().map(move |&c| (t, c))
        })
        .collect()
}

/// Row counts: one, a few, and counts that leave the last parallel task partly filled.
const ROWS: [usize; 4] = [1, 7, 67, 130];
/// Activation rows: decode (1), fewer than a group of four, and groups plus a remainder.
const NS: [usize; 4] = [1, 2, 3, 9];

fn dequantized(t: GgmlType, raw: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut w = vec![0f32; rows * cols];
    dequantize(t, raw, &mut w).unwrap();
    w
}

fn activations(n: usize, cols: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = rng.vec_uniform(n * cols, -2.0, 2.0);
    // A zero block (scale 0) and a block with one large value.
    x[..ACT_BLOCK.min(cols)].fill(0.0);
    if cols >= 2 * ACT_BLOCK {
        x[ACT_BLOCK + 5] = 40.0;
    }
    x
}

fn check(what: &str, got: f32, want: f64, scale: f64) {
    let err = (f64::from(got) - want).abs();
    assert!(err <= REL_TOL * scale + 1e-6, "{what}: {got} instead of {want} (error {err:e}, Σ|w·x| {scale:e})");
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn unpacked_rows_are_bit_equal_to_the_dequantizer() {
    let mut rng = Rng::new(11);
    for (t, cols) in cases() {
        let Some(mut u) = Unpacked::new(t, cols) else { continue };
        for random_bytes in [false, true] {
            let raw = weights(t, 3, cols, random_bytes, &mut rng);
            let want = dequantized(t, &raw, 3, cols);
            let row_bytes = raw.len() / 3;
            let mut got = vec![f32::NAN; cols];
            for r in 0..3 {
                u.unpack(t, &raw[r * row_bytes..(r + 1) * row_bytes]);
                check_bias(t, &u, random_bytes);
                u.expand(&mut got);
                for (j, (g, w)) in got.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{} row {r} value {j}: {g} instead of {w}", t.name());
                }
            }
        }
    }
}

/// The type's bias (its row in `quant::WEIGHT_TYPES`): codes plus bias fit 7 bits, which relaxed
/// SIMD's int8 dot product needs, and random bytes (every stored code) reach 0; without one
/// (Q8_0) the codes need 8.
fn check_bias(t: GgmlType, u: &Unpacked, random_bytes: bool) {
    let (lo, hi) = u.q.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &q| (lo.min(q.into()), hi.max(q.into())));
    match u.bias {
        Some(b) => {
            let b = i32::from(b);
            assert!(lo + b >= 0 && hi + b <= 127, "{}: codes {lo}..={hi} plus bias {b} do not fit 7 bits", t.name());
            assert!(!random_bytes || lo + b == 0, "{}: random codes reach {lo}, not −{b}", t.name());
        }
        None => assert!(!random_bytes || hi - lo > 127, "{}: codes {lo}..={hi} would fit 7 bits with a bias", t.name()),
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn the_f32_path_matches_dequantize_then_dot() {
    let mut rng = Rng::new(12);
    for (t, cols) in cases() {
        for (rows, random_bytes) in ROWS.into_iter().zip([false, true, false, true]) {
            let raw = weights(t, rows, cols, random_bytes, &mut rng);
            let w = dequantized(t, &raw, rows, cols);
            let m = QMatrix::new(t, rows, cols, &raw).unwrap();
            for n in NS {
                let x = activations(n, cols, &mut rng);
                let mut out = vec![f32::NAN; n * rows];
                matmul(&m, &x, n, &mut out);
                for t_ in 0..n {
                    for r in 0..rows {
                        let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[t_ * cols..(t_ + 1) * cols]);
                        let want: f64 = wr.iter().zip(xr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                        let scale: f64 = wr.iter().zip(xr).map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs()).sum();
                        check(&format!("{} {rows}×{cols}, n {n}: out[{t_}][{r}]", t.name()), out[t_ * rows + r], want, scale);
                    }
                }
            }
        }
    }
}

/// The int8 view of one activation row: per 32-value block d = max|x| / 127 and the dequantized
/// values d · round_ties_even(x · (1 / d)) in f64.
fn int8_view(x: &[f32]) -> Vec<f64> {
    let mut view = Vec::new();
    for block in x.chunks(ACT_BLOCK) {
        let d = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        view.extend(block.iter().map(|&v| f64::from(d) * f64::from((v * inv).round_ties_even())));
    }
    view
}

/// `m` times the `n` rows of `x` with int8 activations: the quantized rows and `out[n][rows]`.
fn int8_product(m: &QMatrix, x: &[f32], n: usize) -> (Int8Rows, Vec<f32>) {
    let xq = Int8Rows::quantize(x, n).unwrap();
    let mut out = vec![f32::NAN; n * m.rows];
    matmul_acts(m, Acts::Int8(&xq, x), n, &mut out);
    (xq, out)
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn the_int8_path_matches_the_int8_rounded_activations() {
    let mut rng = Rng::new(13);
    for (t, cols) in cases() {
        let float = matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        for (rows, random_bytes) in ROWS.into_iter().zip([true, false, true, false]) {
            let raw = weights(t, rows, cols, random_bytes, &mut rng);
            let w = dequantized(t, &raw, rows, cols);
            let m = QMatrix::new(t, rows, cols, &raw).unwrap();
            for n in NS {
                let x = activations(n, cols, &mut rng);
                let (_, out) = int8_product(&m, &x, n);
                for t_ in 0..n {
                    let xr = &x[t_ * cols..(t_ + 1) * cols];
                    let view = int8_view(xr);
                    // Float weights multiply the activations themselves.
                    let xs: Vec<f64> = if float { xr.iter().map(|&v| f64::from(v)).collect() } else { view.clone() };
                    for r in 0..rows {
                        let wr = &w[r * cols..(r + 1) * cols];
                        // Minimums too multiply the rounded activations (their sums).
                        let want: f64 = wr.iter().zip(&xs).map(|(a, b)| f64::from(*a) * b).sum();
                        let scale: f64 = wr.iter().zip(&xs).map(|(a, b)| (f64::from(*a) * b).abs()).sum();
                        check(
                            &format!("{} {rows}×{cols} ({}), n {n}: out[{t_}][{r}]", t.name(), if random_bytes { "random bytes" } else { "quantized" }),
                            out[t_ * rows + r],
                            want,
                            scale,
                        );
                    }
                }
            }
        }
    }
}

/// With int8 activations (the browser's CPU backend; natively AVX2 or portable), a row's product
/// is bit-equal whatever rows share its step: one row alone, or within any group of one to nine
/// (speculation's draft rows and batches must not change a token that a step of one row chooses;
/// natively Q8_0 rows of fewer than four are read in place, by a kernel of their own).
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn a_rows_int8_product_does_not_depend_on_the_rows_beside_it() {
    let mut rng = Rng::new(15);
    for (t, cols) in cases() {
        let (rows, n) = (7, 9);
        let raw = weights(t, rows, cols, true, &mut rng);
        let m = QMatrix::new(t, rows, cols, &raw).unwrap();
        let x = activations(n, cols, &mut rng);
        let xq = Int8Rows::quantize(&x, n).unwrap();
        let mut all = vec![f32::NAN; n * rows];
        matmul_acts(&m, Acts::Int8(&xq, &x), n, &mut all);
        for k in 1..=n {
            // The first k rows alone give the same bits as among all nine.
            let (xk, xqk) = (&x[..k * cols], Int8Rows::quantize(&x[..k * cols], k).unwrap());
            let mut out = vec![f32::NAN; k * rows];
            matmul_acts(&m, Acts::Int8(&xqk, xk), k, &mut out);
            for (i, (a, b)) in out.iter().zip(&all).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{} {cols}: row {} of {k}: {a} alone, {b} among {n}", t.name(), i / rows);
            }
        }
    }
}

/// The wasm kernels' arithmetic in scalar Rust (their twin): per 32-value block and per lane j of
/// four, the i32 sum of the code products at 2j, 2j+1, 2j+8 and 2j+9 of each 16-value half, in
/// f32 times the weight's sub-block scale times the activation block's scale (the halves' sums
/// added first where the sub-block is 32 values), summed per lane over the blocks, the lanes
/// summed as (0 + 1) + (2 + 3), then the minimums' term.
#[cfg(target_arch = "wasm32")]
fn simd_twin(u: &Unpacked, x: &Int8Rows, t: usize) -> f32 {
    let x = x.row(t);
    let mut acc = [0f32; 4];
    for b in 0..u.q.len() / ACT_BLOCK {
        let lane = |h: usize, j: usize| -> i32 {
            [2 * j, 2 * j + 1, 2 * j + 8, 2 * j + 9]
                .iter()
                .map(|&i| i32::from(u.q[b * ACT_BLOCK + 16 * h + i]) * i32::from(x.qs[b * ACT_BLOCK + 16 * h + i]))
                .sum()
        };
        let d = x.d[b];
        for (j, acc) in acc.iter_mut().enumerate() {
            *acc += if u.sub == 16 {
                lane(0, j) as f32 * (u.scale[2 * b] * d) + lane(1, j) as f32 * (u.scale[2 * b + 1] * d)
            } else {
                (lane(0, j) + lane(1, j)) as f32 * (u.scale[b] * d)
            };
        }
    }
    let min = match (u.has_min, u.sub) {
        (false, _) => 0.0,
        (true, 16) => pagedlm::cpu::qdot::dot(&u.min, x.dsum16),
        (true, _) => pagedlm::cpu::qdot::dot(&u.min, x.sum),
    };
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + min
}

/// In wasm, a row's int8 product is bit-equal to the kernels' scalar twin for every quantized
/// type and 1 to 9 rows: in the SIMD128 build, and in the build with relaxed SIMD (whose
/// dot product sums other codes per lane unless they are kept in `LANE_ORDER`), so the two
/// builds give the same bits.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen_test::wasm_bindgen_test]
fn in_wasm_a_rows_int8_product_is_bit_equal_to_the_kernels_twin() {
    let mut rng = Rng::new(16);
    let mut checked = 0;
    for (t, cols) in cases() {
        let Some(mut u) = Unpacked::new(t, cols) else { continue };
        let rows = 5;
        let raw = weights(t, rows, cols, true, &mut rng);
        let m = QMatrix::new(t, rows, cols, &raw).unwrap();
        for n in NS {
            let x = activations(n, cols, &mut rng);
            let (xq, out) = int8_product(&m, &x, n);
            let row_bytes = raw.len() / rows;
            for r in 0..rows {
                u.unpack(t, &raw[r * row_bytes..(r + 1) * row_bytes]);
                for t_ in 0..n {
                    let (got, want) = (out[t_ * rows + r], simd_twin(&u, &xq, t_));
                    assert_eq!(got.to_bits(), want.to_bits(), "{} {cols} (relaxed SIMD: {RELAXED}), n {n}: out[{t_}][{r}] {got}, the twin {want}", t.name());
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn activations_quantize_as_the_shaders_do() {
    let mut rng = Rng::new(14);
    let (n, cols) = (3, 128);
    let x = activations(n, cols, &mut rng);
    let xq = Int8Rows::quantize(&x, n).unwrap();
    assert_eq!((xq.n, xq.cols), (n, cols));
    for t in 0..n {
        let row = xq.row(t);
        let xr = &x[t * cols..(t + 1) * cols];
        for (b, block) in xr.chunks(ACT_BLOCK).enumerate() {
            let d = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            assert_eq!(row.d[b].to_bits(), d.to_bits(), "row {t} block {b}: scale");
            for (j, &v) in block.iter().enumerate() {
                assert_eq!(i32::from(row.qs[b * ACT_BLOCK + j]), (v * inv).round_ties_even() as i32, "row {t} value {}", b * ACT_BLOCK + j);
            }
            let codes: i32 = row.qs[b * ACT_BLOCK..][..ACT_BLOCK].iter().map(|&c| i32::from(c)).sum();
            assert_eq!(row.sum[b], d * codes as f32, "row {t} block {b}: the rounded values' sum");
            for h in 0..2 {
                let codes: i32 = row.qs[b * ACT_BLOCK + 16 * h..][..16].iter().map(|&c| i32::from(c)).sum();
                assert_eq!(row.dsum16[2 * b + h], d * codes as f32, "row {t} block {b}: half {h}'s sum");
            }
        }
        // A build with relaxed SIMD also keeps the codes in lane order, with each 4's sum.
        if RELAXED {
            for (i, (l, q)) in row.lanes.chunks_exact(16).zip(row.qs.chunks_exact(16)).enumerate() {
                for (p, &j) in LANE_ORDER.iter().enumerate() {
                    assert_eq!(l[p], q[j], "row {t} run {i}: lane code {p}");
                }
                for j in 0..4 {
                    let s: i32 = l[4 * j..4 * j + 4].iter().map(|&c| i32::from(c)).sum();
                    assert_eq!(row.lane_sums[4 * i + j], s, "row {t} run {i}: lane {j}'s sum");
                }
            }
        } else {
            assert!(row.lanes.is_empty() && row.lane_sums.is_empty(), "lanes are kept only for relaxed SIMD");
        }
    }
    assert!(Int8Rows::quantize(&x[..100], 1).is_none(), "100 values are not whole blocks");
    assert!(Int8Rows::quantize(&x, 0).is_none(), "no rows");
}

/// Not a check: times the matmuls of the benchmark models' shapes (run with `--release
/// --ignored --nocapture`; native only).
#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore]
fn matmul_timings() {
    let mut rng = Rng::new(15);
    let shapes = [
        (GgmlType::Q8_0, 49152, 576),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q4_K, 640, 1024),
        (GgmlType::Q6_K, 640, 2048),
    ];
    for (t, rows, cols) in shapes {
        let raw = weights(t, rows, cols, false, &mut rng);
        let m = QMatrix::new(t, rows, cols, &raw).unwrap();
        for n in [1, 64] {
            let x = activations(n, cols, &mut rng);
            let xq = Int8Rows::quantize(&x, n).unwrap();
            let mut out = vec![0f32; n * rows];
            for (name, acts) in [("f32", Acts::F32(&x)), ("int8", Acts::Int8(&xq, &x))] {
                let reps = (2e8 as usize / (rows * cols * n)).max(2);
                matmul_acts(&m, acts, n, &mut out);
                let start = std::time::Instant::now();
                for _ in 0..reps {
                    matmul_acts(&m, acts, n, &mut out);
                }
                let s = start.elapsed().as_secs_f64() / reps as f64;
                println!("{:5} {rows:6}×{cols:5} n {n:3} {name:4}: {:8.3} ms  {:6.2} GMAC/s", t.name(), s * 1e3, (rows * cols * n) as f64 / s / 1e9);
            }
        }
    }
}
