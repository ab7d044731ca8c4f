//! Matmul and embedding kernels of every weight type against their CPU references, natively and
//! in the browser. Matrices of Q4_1 and Q8_0 come from the quantizer; every other type is random
//! blocks (every quant and sub-block scale bit pattern) with sane f16 super-block scales, so the
//! kernels are checked on encodings no quantizer of ours chose. The CPU dequantizers themselves are
//! checked against llama.cpp's `gguf` package in tests/quant_formats.rs.
//!
//! Tolerance of the matmul tests: |got − want| ≤ 1e-5 · Σ_k |W[n,k] · x[a,k]| per output, where want
//! is the f64 dot product of the dequantized weights. The kernels dequantize exactly (d · q + m in
//! f32) and accumulate in f32, so only summation rounding remains: about √K · 2⁻²⁴ ≈ 2e-6 of that
//! sum for K = 1536. One wrong quant, scale or row already moves an output by ~1/K of the sum
//! (≥ 6e-4), far above the bound. The embedding is d · q + m per value in f32, as the CPU's
//! dequantizer computes it, up to one rounding (a fused multiply-add): |Δ| ≤ 2⁻²² · (|w| + max|row|).
//!
//! The int8-activation variant (opt-in; the tests of the device's default ask for it explicitly
//! too) is checked twice: against the exact reference within the
//! worst case its activation rounding allows, Σ_k |d·q[n,k]| · step_k / 2 (`int8_error_bound`,
//! step_k = max|x| / 127 of k's block), and against a CPU emulation of the same int8 arithmetic
//! (`matmul_int8_cpu`) within the f32 tolerance above plus two quantization steps of one weight
//! (the GPU's 1/d may round one activation to the neighbouring int8 value).
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::gpu;
use pagedlm::gguf::GgmlType;
use pagedlm::gpu::ops::embed::{embedding, embedding_cpu};
use pagedlm::gpu::ops::matmul::{
    int8_error_bound, matmul, matmul_configured, matmul_cpu, matmul_input, matmul_int8_cpu, matmul_into, matmul_with, Epilogue, Input, MatmulConfig,
    QuantMatrix, MAX_TILE_ROWS,
};
use pagedlm::gpu::ops::norm::rms_norm_cpu;
use pagedlm::gpu::{Context, Recorder};
use pagedlm::model::Activation;
use pagedlm::quant::{dequantize, quantize_q4_1, quantize_q8_0};
use pagedlm::rng::Rng;

type GgmlKind = GgmlType;

const REL_TOL: f64 = 1e-5;

/// A seeded random GGUF matrix of `kind`, [rows, cols].
fn random_matrix(rng: &mut Rng, kind: GgmlKind, rows: u32, cols: u32) -> Vec<u8> {
    // Per-row offsets make the Q4_1 minimum matter and give rows different scales.
    let mut values = Vec::with_capacity(rows as usize * cols as usize);
    for _ in 0..rows {
        let offset = rng.uniform(-0.5, 0.5);
        let spread = rng.uniform(0.1, 2.0);
        values.extend((0..cols).map(|_| offset + spread * rng.uniform(-1.0, 1.0)));
    }
    match kind {
        GgmlKind::Q4_1 => quantize_q4_1(&values),
        GgmlKind::Q8_0 => quantize_q8_0(&values),
        other => random_blocks(rng, other, rows, cols),
    }
}

/// (bytes per block, byte offsets of the block's f16 scales and minimums) of the GGUF layout of `t`.
fn block_fields(t: GgmlType) -> (usize, &'static [usize]) {
    match t {
        GgmlType::Q4_0 => (18, &[0]),
        GgmlType::Q5_0 => (22, &[0]),
        GgmlType::Q5_1 => (24, &[0, 2]),
        GgmlType::Q2_K => (84, &[80, 82]),
        GgmlType::Q3_K => (110, &[108]),
        GgmlType::Q4_K => (144, &[0, 2]),
        GgmlType::Q5_K => (176, &[0, 2]),
        GgmlType::Q6_K => (210, &[208]),
        other => panic!("no block fields for {}", other.name()),
    }
}

/// Random GGUF data of `t`, [rows, cols]: float types from random values with per-row spreads;
/// quantized types random bytes with their f16 scales overwritten by sane ones (0.002..0.05; the
/// Q5_1 minimum −0.5..0.5), so that values stay in a sane range.
fn random_blocks(rng: &mut Rng, t: GgmlType, rows: u32, cols: u32) -> Vec<u8> {
    let n = rows as usize * cols as usize;
    let floats = |rng: &mut Rng| -> Vec<f32> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..rows {
            let spread = rng.uniform(0.01, 2.0);
            v.extend((0..cols).map(|_| spread * rng.uniform(-1.0, 1.0)));
        }
        v
    };
    match t {
        GgmlType::F32 => return bytemuck::cast_slice(&floats(rng)).to_vec(),
        GgmlType::F16 => return floats(rng).iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        GgmlType::BF16 => return floats(rng).iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        _ => {}
    }
    let (bb, fields) = block_fields(t);
    let block_values = if bb >= 84 { 256 } else { 32 };
    let mut out: Vec<u8> = (0..n / block_values * bb).map(|_| rng.next_u32() as u8).collect();
    for block in out.chunks_exact_mut(bb) {
        for (i, &at) in fields.iter().enumerate() {
            let v = if t == GgmlType::Q5_1 && i == 1 { rng.uniform(-0.5, 0.5) } else { rng.uniform(0.002, 0.05) };
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    out
}

fn dequantized(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32) -> Vec<f32> {
    let mut out = vec![0f32; rows as usize * cols as usize];
    dequantize(kind, raw, &mut out).unwrap();
    out
}

/// Whether the kernel of `kind` takes int8 activations when asked to (Q4_1 and Q8_0 do).
fn has_int8_path(kind: GgmlKind) -> bool {
    matches!(kind, GgmlKind::Q4_1 | GgmlKind::Q8_0)
}

/// Σ_k |W[n,k] · x[a,k]| for every output: the scale of each output's rounding error.
fn magnitudes(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Vec<f64> {
    let w = dequantized(kind, raw, rows, cols);
    let (rows, cols) = (rows as usize, cols as usize);
    let mut out = Vec::with_capacity(n_rows as usize * rows);
    for a in 0..n_rows as usize {
        let xa = &x[a * cols..][..cols];
        for n in 0..rows {
            out.push(w[n * cols..][..cols].iter().zip(xa).map(|(p, q)| (p * q).abs() as f64).sum());
        }
    }
    out
}

/// max over k of |d·q[n,k]| · step_k: what one activation rounded the other way moves an output by.
fn max_weight_step(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32, x: &[f32]) -> f64 {
    let w = dequantized(kind, raw, rows, cols);
    let max_w = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    // |d·q| ≤ |d·q + m| + |m| ≤ 2·max|W| for Q4_1.
    let max_step = x.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
    2.0 * max_w * max_step
}

/// Asserts |got − want| ≤ REL_TOL · scale + extra, element-wise (extra: the int8 bound, or empty).
fn assert_matmul_close(what: &str, got: &[f32], want: &[f32], scale: &[f64], extra: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: Option<(usize, f64)> = None;
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (*g as f64 - *w as f64).abs();
        let tol = REL_TOL * s + extra.get(i).copied().unwrap_or(0.0);
        let excess = err / tol.max(1e-30);
        if !g.is_finite() || (excess > 1.0 && worst.is_none_or(|(_, e)| excess > e)) {
            worst = Some((i, if g.is_finite() { excess } else { f64::INFINITY }));
        }
    }
    if let Some((i, excess)) = worst {
        panic!(
            "{what}: element {i} is {} but the reference is {} (error {:.2}× the tolerance {REL_TOL}·{:.4} + {:.3e})",
            got[i],
            want[i],
            excess,
            scale[i],
            extra.get(i).copied().unwrap_or(0.0)
        );
    }
}

/// Uploads, runs one matmul and returns y.
async fn run_matmul(ctx: &Context, w: &QuantMatrix, x: &[f32], n_rows: u32, config: Option<MatmulConfig>) -> Vec<f32> {
    let xb = ctx.storage_init("x", bytemuck::cast_slice(x));
    let yb = ctx.storage_zeroed("y", n_rows as u64 * w.rows as u64 * 4);
    let kernels = match config {
        Some(c) => matmul_with(ctx, w, &xb, &yb, n_rows, c).unwrap(),
        None => matmul(ctx, w, &xb, &yb, n_rows).unwrap(),
    };
    let mut rec = Recorder::new(ctx, "test");
    rec.dispatch_all(&kernels);
    rec.submit();
    ctx.read_f32(&yb, 0, n_rows as u64 * w.rows as u64).await.unwrap()
}

/// Checks one shape and batch against the CPU reference (`config` None: the device's default).
async fn check(ctx: &Context, rng: &mut Rng, kind: GgmlKind, rows: u32, cols: u32, n_rows: u32, config: Option<MatmulConfig>) {
    let raw = random_matrix(rng, kind, rows, cols);
    let x = rng.vec_uniform(n_rows as usize * cols as usize, -1.0, 1.0);
    let w = QuantMatrix::upload(ctx, "w", kind, &raw, rows, cols).unwrap();
    let got = run_matmul(ctx, &w, &x, n_rows, config).await;
    let effective = config.unwrap_or(MatmulConfig::for_device(ctx, n_rows));
    let what = format!("{kind:?} {cols}→{rows}, {n_rows} rows, {effective:?}");
    assert_reference(&what, (kind, &raw, rows, cols), (&x, n_rows), effective.int8_activations, &got);
}

/// Asserts that `got` is x · Wᵀ (raw: GGUF [rows, cols]; x: [n_rows, cols]) as the kernels compute
/// it: within the f32 tolerance of the exact reference, or, with `int8` activations (for types
/// with an int8 body), within the int8 bound of it and close to the CPU emulation of int8.
fn assert_reference(what: &str, (kind, raw, rows, cols): (GgmlKind, &[u8], u32, u32), (x, n_rows): (&[f32], u32), int8: bool, got: &[f32]) {
    let want = matmul_cpu(kind, raw, rows, cols, x, n_rows).unwrap();
    let scale = magnitudes(kind, raw, rows, cols, x, n_rows);
    if !int8 || !has_int8_path(kind) {
        assert_matmul_close(what, got, &want, &scale, &[]);
        return;
    }
    let bound = int8_error_bound(kind, raw, rows, cols, x, n_rows).unwrap();
    assert_matmul_close(&format!("{what} vs exact"), got, &want, &scale, &bound);
    let emulated = matmul_int8_cpu(kind, raw, rows, cols, x, n_rows).unwrap();
    let flips = vec![2.0 * max_weight_step(kind, raw, rows, cols, x); got.len()];
    assert_matmul_close(&format!("{what} vs int8 emulation"), got, &emulated, &scale, &flips);
}

/// Whether the device's default matmul for `n_rows` rows uses int8 activations.
fn default_int8(ctx: &Context, n_rows: u32) -> bool {
    MatmulConfig::for_device(ctx, n_rows).int8_activations
}

gpu_test! {
    async fn q4_1_matches_cpu_on_model_shapes() {
        let ctx = gpu().await;
        let mut rng = Rng::new(11);
        // The device's default, and its activations the other way (int8 or f32).
        let flipped = |n_rows| {
            let c = MatmulConfig::for_device(&ctx, n_rows);
            Some(MatmulConfig { int8_activations: !c.int8_activations, ..c })
        };
        for (rows, cols) in [(576, 576), (192, 576), (1536, 576), (576, 1536)] {
            for n_rows in [1, 3, 8, 16] {
                check(&ctx, &mut rng, GgmlKind::Q4_1, rows, cols, n_rows, None).await;
                check(&ctx, &mut rng, GgmlKind::Q4_1, rows, cols, n_rows, flipped(n_rows)).await;
            }
        }
    }
}

gpu_test! {
    async fn int8_activations_on_model_shapes() {
        let ctx = gpu().await;
        let mut rng = Rng::new(20);
        let int8 = |n_rows| Some(MatmulConfig { int8_activations: true, ..MatmulConfig::for_device(&ctx, n_rows) });
        check(&ctx, &mut rng, GgmlKind::Q4_1, 1536, 576, 1, int8(1)).await;
        check(&ctx, &mut rng, GgmlKind::Q4_1, 576, 1536, 8, int8(8)).await;
        check(&ctx, &mut rng, GgmlKind::Q8_0, 1000, 576, 3, int8(3)).await;
    }
}

gpu_test! {
    async fn q4_1_prefill_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(12);
        // 100 rows: not a multiple of the 8-row tile.
        let c = MatmulConfig::for_device(&ctx, 100);
        for config in [None, Some(MatmulConfig { int8_activations: !c.int8_activations, ..c })] {
            check(&ctx, &mut rng, GgmlKind::Q4_1, 1536, 576, 100, config).await;
            check(&ctx, &mut rng, GgmlKind::Q4_1, 576, 1536, 100, config).await;
        }
    }
}

gpu_test! {
    async fn q8_0_output_projection_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(13);
        check(&ctx, &mut rng, GgmlKind::Q8_0, 49152, 576, 1, None).await;
        for n_rows in [3, 8, 16, 100] {
            check(&ctx, &mut rng, GgmlKind::Q8_0, 1000, 576, n_rows, None).await;
        }
    }
}

gpu_test! {
    async fn rows_that_do_not_fill_a_group_are_written_and_nothing_past_them() {
        let ctx = gpu().await;
        let mut rng = Rng::new(14);
        for kind in [GgmlKind::Q4_1, GgmlKind::Q8_0] {
            for rows in [1, 5, 13] {
                check(&ctx, &mut rng, kind, rows, 64, 3, None).await;
            }
            // y is larger than needed: the element after the last output must stay untouched.
            let (rows, cols, n_rows) = (13u32, 32u32, 2u32);
            let raw = random_matrix(&mut rng, kind, rows, cols);
            let w = QuantMatrix::upload(&ctx, "w", kind, &raw, rows, cols).unwrap();
            let x = rng.vec_uniform((n_rows * cols) as usize, -1.0, 1.0);
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
            let sentinel = vec![7.5f32; (n_rows * rows + 16) as usize];
            let yb = ctx.storage_init("y", bytemuck::cast_slice(&sentinel));
            let kernels = matmul(&ctx, &w, &xb, &yb, n_rows).unwrap();
            let mut rec = Recorder::new(&ctx, "test");
            rec.dispatch_all(&kernels);
            rec.submit();
            let got = ctx.read_f32(&yb, 0, sentinel.len() as u64).await.unwrap();
            let n_out = (n_rows * rows) as usize;
            assert!(got[n_out..].iter().all(|&v| v == 7.5), "{kind:?}: wrote past the output: {:?}", &got[n_out..]);
            assert_reference(&format!("{kind:?} 13 rows into a larger y"), (kind, &raw, rows, cols), (&x, n_rows), default_int8(&ctx, n_rows), &got[..n_out]);
        }
    }
}

gpu_test! {
    async fn every_kernel_variant_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(15);
        // The split-row variant (real GPUs) runs here too, so it is tested on CPU adapters; the
        // shared-load variant and the split rows summed within subgroups wherever the device has
        // subgroups of 8 (lavapipe: of exactly 8, so 8-way splits fill a subgroup and 4-way ones
        // put two groups in each).
        let mut configs = Vec::new();
        let subgroups: &[bool] = if ctx.has_subgroups(8) { &[false, true] } else { &[false] };
        for int8_activations in [false, true] {
            let c = |tile_rows, k_split, workgroup, subgroup| MatmulConfig { tile_rows, group_tile: 1, k_split, workgroup, subgroup, int8_activations };
            for &subgroup in subgroups {
                configs.extend([c(1, 8, 64, subgroup), c(4, 8, 64, subgroup), c(3, 4, 16, subgroup), c(2, 2, 256, subgroup)]);
                configs.extend([1, 3, 8, MAX_TILE_ROWS].map(|tile_rows| c(tile_rows, 1, 16, subgroup)));
            }
        }
        for config in configs {
            check(&ctx, &mut rng, GgmlKind::Q4_1, 96, 320, 19, Some(config)).await;
            check(&ctx, &mut rng, GgmlKind::Q8_0, 96, 320, 19, Some(config)).await;
        }
    }
}

gpu_test! {
    async fn group_tiles_match_cpu() {
        // Several row groups per invocation (group_tile), in each body (Q4_1, Q8_0 and the
        // decoded-blocks kernel of every other type), with row counts whose last invocation holds
        // groups past the end and a partial last group, f32 and int8 activations, alone and with
        // split rows (and subgroups where the device has them).
        let ctx = gpu().await;
        let mut rng = Rng::new(16);
        let sg = ctx.has_subgroups(8);
        let c = |tile_rows, group_tile, k_split, workgroup, int8_activations| MatmulConfig { tile_rows, group_tile, k_split, workgroup, subgroup: false, int8_activations };
        let mut configs = vec![c(1, 4, 1, 16, false), c(4, 4, 1, 8, false), c(3, 2, 1, 16, false), c(1, 2, 4, 16, false), c(1, 4, 1, 16, true), c(4, 2, 1, 16, true)];
        // Past 16 slots (the plain variant only, matmul_slots32.wgsl): tiles of 32 and 24, alone
        // and with split rows.
        configs.extend([c(8, 4, 1, 8, false), c(16, 2, 1, 8, true), c(6, 4, 4, 16, false)]);
        if sg {
            configs.extend([MatmulConfig { subgroup: true, ..c(2, 4, 1, 16, false) }, MatmulConfig { subgroup: true, ..c(1, 2, 8, 64, false) }]);
            // The variants with subgroups compile 16 slots: a larger tile is refused, not run.
            let raw = random_matrix(&mut rng, GgmlKind::Q4_1, 64, 64);
            let m = QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, 64, 64).unwrap();
            let (xb, yb) = (ctx.storage_zeroed("x", 8 * 64 * 4), ctx.storage_zeroed("y", 8 * 64 * 4));
            for wide in [MatmulConfig { subgroup: true, ..c(8, 4, 1, 16, false) }, MatmulConfig { subgroup: true, ..c(8, 4, 8, 64, false) }] {
                let e = matmul_with(&ctx, &m, &xb, &yb, 8, wide).err().unwrap_or_else(|| panic!("{wide:?} accepted")).to_string();
                assert!(e.contains("invalid kernel configuration"), "{e}");
            }
        }
        for config in configs {
            // Q4_1: 25 groups of 4 (the last partial); Q8_0: 13 groups of 8 (the last partial).
            check(&ctx, &mut rng, GgmlKind::Q4_1, 99, 320, 7, Some(config)).await;
            check(&ctx, &mut rng, GgmlKind::Q8_0, 101, 320, 7, Some(config)).await;
            if !config.int8_activations {
                check(&ctx, &mut rng, GgmlKind::Q5_0, 99, 320, 5, Some(config)).await;
                check(&ctx, &mut rng, GgmlKind::Q4_K, 45, 512, 2, Some(config)).await;
            }
        }
        // The norm prologue (its sum of squares taken once per activation row, whatever the
        // groups) and the epilogues with several groups per invocation.
        check_norm(&ctx, &mut rng, GgmlKind::Q4_1, (100, 512), 3, c(3, 4, 1, 16, false)).await;
        let (_, g) = norm_inputs(&mut rng, 1, 576);
        check_epilogues(&ctx, &mut rng, GgmlKind::Q4_1, (104, 576), 2, (c(2, 4, 1, 16, false), Some((&g, 1e-5))), &[Activation::Silu]).await;
    }
}

gpu_test! {
    async fn stacked_upload_is_the_concatenation_of_its_parts() {
        let ctx = gpu().await;
        let mut rng = Rng::new(16);
        // One type, then a mix as a "Q4_K_M" file holds it (q and k Q5_0, v Q8_0), then more types.
        let mixes = [
            vec![GgmlKind::Q4_1; 4],
            vec![GgmlKind::Q8_0; 4],
            vec![GgmlKind::Q5_0, GgmlKind::Q5_0, GgmlKind::Q8_0, GgmlKind::Q4_1],
            vec![GgmlKind::F16, GgmlKind::Q4_0, GgmlKind::Q4_0, GgmlKind::BF16],
        ];
        for types in mixes {
            // q|k|v of SmolLM2: 576 + 192 + 192 rows; an odd part size checks that parts are not group-aligned.
            let cols = 576u32;
            let part_rows = [576u32, 192, 192, 5];
            let raws: Vec<Vec<u8>> = part_rows.iter().zip(&types).map(|(&r, &t)| random_matrix(&mut rng, t, r, cols)).collect();
            let parts: Vec<(GgmlType, &[u8], u32)> = raws.iter().zip(part_rows).zip(&types).map(|((r, n), &t)| (t, &r[..], n)).collect();
            let stacked = QuantMatrix::upload_stacked(&ctx, "qkv", &parts, cols).unwrap();
            let total: u32 = part_rows.iter().sum();
            assert_eq!((stacked.rows, stacked.cols), (total, cols));
            let mut distinct = types.clone();
            distinct.dedup();
            assert_eq!(stacked.types(), distinct, "one part per run of a type");
            assert_eq!(stacked.parts.len(), distinct.len());
            let n_rows = 3u32;
            let x = rng.vec_uniform((n_rows * cols) as usize, -1.0, 1.0);
            let got = run_matmul(&ctx, &stacked, &x, n_rows, None).await;
            let mut offset = 0usize;
            for ((raw, rows), &kind) in raws.iter().zip(part_rows).zip(&types) {
                let got_part: Vec<f32> = (0..n_rows as usize)
                    .flat_map(|a| got[a * total as usize + offset..][..rows as usize].to_vec())
                    .collect();
                let what = format!("{kind:?} stacked part at row {offset}");
                assert_reference(&what, (kind, raw, rows, cols), (&x, n_rows), default_int8(&ctx, n_rows), &got_part);
                offset += rows as usize;
            }
        }
    }
}

/// Runs `w` with `epilogue` and `config` over x into a y that starts as `y0` and returns y; with
/// `norm` = (g, eps), x normalized in the matmul's prologue ([`Input::Norm`]).
async fn run_epilogue(
    ctx: &Context,
    w: &QuantMatrix,
    (x, y0): (&[f32], &[f32]),
    n_rows: u32,
    (config, norm): (MatmulConfig, Option<(&[f32], f32)>),
    epilogue: Epilogue,
) -> Vec<f32> {
    let xb = ctx.storage_init("x", bytemuck::cast_slice(x));
    let yb = ctx.storage_init("y", bytemuck::cast_slice(y0));
    let kernels = match norm {
        None => matmul_configured(ctx, w, (&xb, &yb), n_rows, config, epilogue).unwrap(),
        Some((g, eps)) => {
            let gb = ctx.storage_init("g", bytemuck::cast_slice(g));
            matmul_input(ctx, w, (Input::Norm { x: &xb, weight: &gb, eps }, &yb), n_rows, config, epilogue).unwrap()
        }
    };
    let mut rec = Recorder::new(ctx, "test");
    rec.dispatch_all(&kernels);
    rec.submit();
    ctx.read_f32(&yb, 0, y0.len() as u64).await.unwrap()
}

/// The fused epilogues against the plain matmul of the same variant followed by the CPU doing
/// what they fuse: both sum every output in the same order, so only the epilogue's own rounding
/// may differ (the add: exact to one rounding; the activation: f32 against f64, ~1e-7 relative).
/// With `norm` = (g, eps) every run normalizes x in its prologue, and the plain one is checked
/// against the CPU's rms_norm then matmul first.
async fn check_epilogues(
    ctx: &Context,
    rng: &mut Rng,
    kind: GgmlKind,
    (ffn, cols): (u32, u32),
    n_rows: u32,
    (config, norm): (MatmulConfig, Option<(&[f32], f32)>),
    acts: &[Activation],
) {
    let gate = random_matrix(rng, kind, ffn, cols);
    let up = random_matrix(rng, kind, ffn, cols);
    let x = rng.vec_uniform((n_rows * cols) as usize, -1.0, 1.0);
    let stacked = QuantMatrix::upload_stacked(ctx, "gate|up", &[(kind, &gate, ffn), (kind, &up, ffn)], cols).unwrap();
    let plain = run_epilogue(ctx, &stacked, (&x, &vec![0.0; (n_rows * 2 * ffn) as usize]), n_rows, (config, norm), Epilogue::Store).await;
    let what = format!("{kind:?} {cols}→2×{ffn}, {n_rows} rows, {config:?}, norm prologue {}", norm.is_some());
    if let Some((g, eps)) = norm {
        let normed = rms_norm_cpu(&x, g, n_rows as usize, cols as usize, eps);
        let both = [gate.clone(), up.clone()].concat();
        assert_reference(&what, (kind, &both, 2 * ffn, cols), (&normed, n_rows), false, &plain);
    }

    // y0 + y: the residual add.
    let y0 = rng.vec_uniform(plain.len(), -4.0, 4.0);
    let got = run_epilogue(ctx, &stacked, (&x, &y0), n_rows, (config, norm), Epilogue::Accumulate).await;
    let want: Vec<f32> = y0.iter().zip(&plain).map(|(a, b)| a + b).collect();
    assert_eq!(got, want, "{what}: the accumulating epilogue must add the plain result to y");

    // act(gate) · up, from the interleaved upload.
    let gated = QuantMatrix::upload_gated(ctx, "gate_up", (kind, &gate), (kind, &up), ffn, cols).unwrap().expect("one type, an even ffn");
    assert!(gated.gated && gated.rows == 2 * ffn);
    for &act in acts {
        let got = run_epilogue(ctx, &gated, (&x, &vec![f32::NAN; (n_rows * ffn) as usize]), n_rows, (config, norm), Epilogue::Gated(act)).await;
        for a in 0..n_rows as usize {
            for j in 0..ffn as usize {
                let (g, u) = (plain[a * 2 * ffn as usize + j] as f64, plain[a * 2 * ffn as usize + ffn as usize + j] as f64);
                let want = act.apply(g) * u;
                let gotv = got[a * ffn as usize + j] as f64;
                assert!((gotv - want).abs() <= 1e-6 * want.abs() + 1e-6 * u.abs(), "{what}, {act:?}: row {a} column {j}: {gotv} vs {want}");
            }
        }
    }
}

gpu_test! {
    async fn fused_epilogues_match_the_plain_matmul() {
        let ctx = gpu().await;
        let mut rng = Rng::new(23);
        // 102 gate rows: 204 interleaved rows, a partial last group for Q8_0's groups of 8. Every
        // pipeline is a shader compile (seconds on lavapipe), so one batch size per type, and
        // GELU (the activation itself is glu's test) on one type.
        for (t, cols) in every_type() {
            let acts: &[Activation] = if t == GgmlKind::Q4_1 { &[Activation::Silu, Activation::GeluTanh] } else { &[Activation::Silu] };
            check_epilogues(&ctx, &mut rng, t, (102, cols), 5, (MatmulConfig::for_device(&ctx, 5), None), acts).await;
        }
        // The variants of the two bodies of their own: split rows (real GPUs), int8 activations.
        let c = |tile_rows, k_split, workgroup, int8_activations| MatmulConfig { tile_rows, group_tile: 1, k_split, workgroup, subgroup: false, int8_activations };
        for config in [c(1, 8, 64, false), c(3, 4, 16, true)] {
            for t in [GgmlKind::Q4_1, GgmlKind::Q8_0] {
                check_epilogues(&ctx, &mut rng, t, (64, 320), 9, (config, None), &[Activation::Silu]).await;
            }
        }
    }
}

gpu_test! {
    async fn epilogues_refuse_the_wrong_matrix() {
        let ctx = gpu().await;
        let mut rng = Rng::new(24);
        let (ffn, cols) = (32u32, 64u32);
        let g = random_matrix(&mut rng, GgmlKind::Q4_1, ffn, cols);
        let u8_0 = random_matrix(&mut rng, GgmlKind::Q8_0, ffn, cols);
        // Two types, or an odd width, cannot interleave: the caller stacks them instead.
        assert!(QuantMatrix::upload_gated(&ctx, "gu", (GgmlKind::Q4_1, &g), (GgmlKind::Q8_0, &u8_0), ffn, cols).unwrap().is_none());
        let odd = random_matrix(&mut rng, GgmlKind::Q4_1, 31, cols);
        assert!(QuantMatrix::upload_gated(&ctx, "gu", (GgmlKind::Q4_1, &odd), (GgmlKind::Q4_1, &odd), 31, cols).unwrap().is_none());
        let e = QuantMatrix::upload_gated(&ctx, "gu", (GgmlKind::Q4_1, &g), (GgmlKind::Q4_1, &g[1..]), ffn, cols).err().expect("short up");
        assert!(e.to_string().contains("up"), "{e}");
        let gated = QuantMatrix::upload_gated(&ctx, "gu", (GgmlKind::Q4_1, &g), (GgmlKind::Q4_1, &g), ffn, cols).unwrap().unwrap();
        let plain = QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &g, ffn, cols).unwrap();
        let x = ctx.storage_zeroed("x", (cols * 4) as u64);
        let y = ctx.storage_zeroed("y", (2 * ffn * 4) as u64);
        let merr = |r: Result<Vec<pagedlm::gpu::Kernel>, pagedlm::gpu::GpuError>| r.err().expect("must be refused").to_string();
        let e = merr(matmul_into(&ctx, &gated, (&x, &y), 1, Epilogue::Store));
        assert!(e.contains("without"), "{e}");
        let e = merr(matmul_into(&ctx, &plain, (&x, &y), 1, Epilogue::Gated(Activation::Silu)));
        assert!(e.contains("interleaved"), "{e}");
        let e = merr(matmul_into(&ctx, &plain, (&x, &x), 1, Epilogue::Accumulate));
        assert!(e.contains("different buffer"), "{e}");
        let y_short = ctx.storage_zeroed("y", (ffn * 4 - 4) as u64);
        let e = merr(matmul_into(&ctx, &gated, (&x, &y_short), 1, Epilogue::Gated(Activation::Silu)));
        assert!(e.contains("y needs"), "{e}");
        assert!(matmul_into(&ctx, &gated, (&x, &y), 1, Epilogue::Gated(Activation::GeluTanh)).is_ok());
    }
}

/// Activation rows of very different sizes (so that a row normalized with another row's scale is
/// far off) and a norm weight of both signs: (x [n_rows, cols], g [cols]).
fn norm_inputs(rng: &mut Rng, n_rows: u32, cols: u32) -> (Vec<f32>, Vec<f32>) {
    let mut x = Vec::with_capacity((n_rows * cols) as usize);
    for _ in 0..n_rows {
        let size = 10f32.powf(rng.uniform(-1.5, 1.5));
        x.extend((0..cols).map(|_| size * rng.uniform(-1.0, 1.0)));
    }
    let g = (0..cols).map(|_| rng.uniform(-1.5, 1.5)).collect();
    (x, g)
}

/// The matmul of `kind` with its input normalized in the prologue against the CPU's rms_norm then
/// its matmul (the tolerance of the plain matmul, on the normalized activations).
async fn check_norm(ctx: &Context, rng: &mut Rng, kind: GgmlKind, (rows, cols): (u32, u32), n_rows: u32, config: MatmulConfig) {
    let raw = random_matrix(rng, kind, rows, cols);
    let w = QuantMatrix::upload(ctx, "w", kind, &raw, rows, cols).unwrap();
    let (x, g) = norm_inputs(rng, n_rows, cols);
    let eps = 1e-5;
    let got = run_epilogue(ctx, &w, (&x, &vec![f32::NAN; (n_rows * rows) as usize]), n_rows, (config, Some((&g, eps))), Epilogue::Store).await;
    let normed = rms_norm_cpu(&x, &g, n_rows as usize, cols as usize, eps);
    let what = format!("{kind:?} {cols}→{rows}, {n_rows} rows, {config:?}, norm prologue");
    assert_reference(&what, (kind, &raw, rows, cols), (&normed, n_rows), false, &got);
}

gpu_test! {
    async fn norm_prologue_matches_rms_norm_then_the_matmul() {
        let ctx = gpu().await;
        let mut rng = Rng::new(25);
        // Every type in decode and in a prefill chunk with a partial last tile (67 rows: a partial
        // last group), with the device's variant.
        for (t, cols) in every_type() {
            for n_rows in [1, 37] {
                check_norm(&ctx, &mut rng, t, (67, cols), n_rows, MatmulConfig::for_device(&ctx, n_rows)).await;
            }
        }
        // The other variants of the bodies: split rows (their lanes reduce the sums of squares
        // too), tiles of every size, shared activation loads where the device has them.
        let c = |tile_rows, k_split, workgroup, subgroup| MatmulConfig { tile_rows, group_tile: 1, k_split, workgroup, subgroup, int8_activations: false };
        let mut configs = vec![c(1, 8, 64, false), c(4, 8, 64, false), c(3, 4, 16, false), c(16, 1, 16, false)];
        if ctx.has_subgroups(8) {
            configs.extend([c(1, 1, 16, true), c(16, 1, 16, true)]);
        }
        for config in configs {
            for (t, cols) in [(GgmlKind::Q4_1, 320), (GgmlKind::Q8_0, 320), (GgmlKind::Q4_K, 512)] {
                check_norm(&ctx, &mut rng, t, (96, cols), 19, config).await;
            }
        }
        // With the epilogues the graph fuses it with: the gated FFN and the residual add.
        for (t, cols) in [(GgmlKind::Q4_1, 576), (GgmlKind::Q8_0, 320), (GgmlKind::Q6_K, 512)] {
            let (_, g) = norm_inputs(&mut rng, 1, cols);
            let config = MatmulConfig::for_device(&ctx, 5);
            check_epilogues(&ctx, &mut rng, t, (102, cols), 5, (config, Some((&g, 1e-6))), &[Activation::Silu]).await;
        }
    }
}

gpu_test! {
    async fn norm_prologue_refuses_what_it_cannot_do() {
        let ctx = gpu().await;
        let mut rng = Rng::new(26);
        let (rows, cols) = (64u32, 96u32);
        let raw = random_matrix(&mut rng, GgmlKind::Q4_1, rows, cols);
        let w = QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, rows, cols).unwrap();
        let x = ctx.storage_zeroed("x", (cols * 4) as u64);
        let y = ctx.storage_zeroed("y", (rows * 4) as u64);
        let g = ctx.storage_zeroed("g", (cols * 4) as u64);
        let g_short = ctx.storage_zeroed("g", (cols * 4 - 4) as u64);
        let f32_config = MatmulConfig { int8_activations: false, ..MatmulConfig::for_device(&ctx, 1) };
        let run = |weight, eps, config| matmul_input(&ctx, &w, (Input::Norm { x: &x, weight, eps }, &y), 1, config, Epilogue::Store);
        let merr = |r: Result<Vec<pagedlm::gpu::Kernel>, pagedlm::gpu::GpuError>| r.err().expect("must be refused").to_string();
        let e = merr(run(&g_short, 1e-5, f32_config));
        assert!(e.contains("norm weight needs"), "{e}");
        let e = merr(run(&g, f32::NAN, f32_config));
        assert!(e.contains("eps"), "{e}");
        // Int8 activations are quantized by the norm kernel: the prologue cannot feed them.
        let e = merr(run(&g, 1e-5, MatmulConfig { int8_activations: true, ..f32_config }));
        assert!(e.contains("int8"), "{e}");
        let e = merr(matmul_input(&ctx, &w, (Input::Norm { x: &x, weight: &g, eps: 1e-5 }, &x), 1, f32_config, Epilogue::Store));
        assert!(e.contains("different buffer"), "{e}");
        assert!(run(&g, 1e-5, f32_config).is_ok());
    }
}

gpu_test! {
    async fn every_adapter_class_variant_matches_cpu() {
        // The variant each adapter class picks (MatmulConfig::for_device), with and without the
        // optional features, all on this machine's adapter: a handful of shapes per variant, since
        // every pipeline is a compile.
        let mut rng = Rng::new(27);
        for ctx in common::variant_contexts().await {
            // Every type in decode (a partial last group).
            for (t, cols) in every_type() {
                check(&ctx, &mut rng, t, 67, cols, 1, None).await;
            }
            // The two bodies of their own at a batch and a prefill chunk with a partial last tile,
            // with int8 activations too (the split and reduction are theirs as well).
            for kind in [GgmlKind::Q4_1, GgmlKind::Q8_0] {
                for n_rows in [5, 19] {
                    check(&ctx, &mut rng, kind, 203, 576, n_rows, None).await;
                }
                let int8 = MatmulConfig { int8_activations: true, ..MatmulConfig::for_device(&ctx, 3) };
                check(&ctx, &mut rng, kind, 203, 576, 3, Some(int8)).await;
            }
            // The norm prologue, alone and with the gated epilogue (llama's gate/up).
            check_norm(&ctx, &mut rng, GgmlKind::Q4_K, (96, 512), 3, MatmulConfig::for_device(&ctx, 3)).await;
            let (_, g) = norm_inputs(&mut rng, 1, 576);
            check_epilogues(&ctx, &mut rng, GgmlKind::Q4_1, (102, 576), 1, (MatmulConfig::for_device(&ctx, 1), Some((&g, 1e-5))), &[Activation::Silu]).await;
        }
    }
}

/// Every type pagedlm computes with, and a shape it accepts: (type, cols), cols a whole number of
/// its blocks (K-quants: 256).
fn every_type() -> Vec<(GgmlType, u32)> {
    GgmlType::SUPPORTED.iter().map(|&t| (t, if t.block_size().unwrap().0 == 256 { 768 } else { 576 })).collect()
}

gpu_test! {
    async fn every_type_matches_cpu_in_decode_batch_and_prefill() {
        let ctx = gpu().await;
        let mut rng = Rng::new(21);
        for (t, cols) in every_type() {
            // 203 rows: a partial last group; 1, 7 and 37 activation rows: decode, a batch, a prefill
            // chunk whose last tile is partial.
            for n_rows in [1, 7, 37] {
                check(&ctx, &mut rng, t, 203, cols, n_rows, None).await;
            }
        }
    }
}

gpu_test! {
    async fn upload_keeps_the_gguf_size() {
        let ctx = gpu().await;
        let mut rng = Rng::new(17);
        for (kind, rows) in [(GgmlKind::Q4_1, 1536u32), (GgmlKind::Q8_0, 1000)] {
            let raw = random_matrix(&mut rng, kind, rows, 576);
            let w = QuantMatrix::upload(&ctx, "w", kind, &raw, rows, 576).unwrap();
            assert_eq!(w.bytes(), raw.len() as u64, "{kind:?}: the repacked layout must not grow");
        }
        // The generic layout: GGUF blocks padded to whole words, rows padded to groups of 4.
        for (t, cols) in every_type() {
            if has_int8_path(t) {
                continue;
            }
            let rows = 1001u32;
            let raw = random_matrix(&mut rng, t, rows, cols);
            let w = QuantMatrix::upload(&ctx, "w", t, &raw, rows, cols).unwrap();
            let row_bytes = raw.len() as u64 / rows as u64;
            let (values, bytes) = match t.block_size().unwrap() {
                (1, b) => (32, 32 * b),
                vb => vb,
            };
            let padded_row = cols as u64 / values * bytes.div_ceil(4) * 4;
            assert_eq!(w.bytes(), 1004 * padded_row, "{}: {} bytes per GGUF row", t.name(), row_bytes);
            assert!(padded_row as f64 <= row_bytes as f64 * 1.12, "{}: padding over 12%", t.name());
        }
    }
}

gpu_test! {
    async fn embedding_matches_dequantized_rows() {
        let ctx = gpu().await;
        let mut rng = Rng::new(18);
        for (t, hidden) in every_type() {
            let vocab = 1003u32;
            let raw = random_matrix(&mut rng, t, vocab, hidden);
            let table = QuantMatrix::upload(&ctx, "embd", t, &raw, vocab, hidden).unwrap();
            // First and last rows, rows of the last (partial) group, random ones, and one id past the vocabulary.
            let mut ids = vec![0u32, vocab - 1, 1000, 1001, 8, 7, vocab + 5];
            ids.extend((0..25).map(|_| rng.below(vocab as u64) as u32));
            check_embedding(&ctx, t, &table, &raw, &ids).await;
        }
    }
}

/// Looks `ids` up in `table` (the upload of the GGUF `raw`) on the GPU and compares with the CPU.
async fn check_embedding(ctx: &Context, t: GgmlType, table: &QuantMatrix, raw: &[u8], ids: &[u32]) {
    let (vocab, hidden) = (table.rows, table.cols);
    let n = ids.len() as u32;
    let idb = ctx.storage_init("ids", bytemuck::cast_slice(ids));
    let out = ctx.storage_init("out", bytemuck::cast_slice(&vec![f32::NAN; (n * hidden) as usize]));
    // Gemma's scale (√hidden) on every lookup: the kernel scales after dequantizing.
    let scale = (hidden as f32).sqrt();
    let kernels = embedding(ctx, table, (&idb, &out), n, scale).unwrap();
    let mut rec = Recorder::new(ctx, "test");
    rec.dispatch_all(&kernels);
    rec.submit();
    let got = ctx.read_f32(&out, 0, n as u64 * hidden as u64).await.unwrap();
    let want: Vec<f32> = embedding_cpu(t, raw, vocab, hidden, ids).unwrap().iter().map(|v| v * scale).collect();
    for (row, (g, w)) in got.chunks(hidden as usize).zip(want.chunks(hidden as usize)).enumerate() {
        let max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (k, (g, w)) in g.iter().zip(w).enumerate() {
            let tol = (w.abs() + max) * 2f32.powi(-22);
            assert!((g - w).abs() <= tol, "{}: token {row} (id {}), element {k}: {g} != {w}", t.name(), ids[row]);
        }
    }
    assert!(want[..hidden as usize].iter().any(|&v| v != 0.0), "{}: the reference rows must not be all zero", t.name());
}

gpu_test! {
    async fn matrices_over_the_part_limit_are_split_at_row_groups() {
        let ctx = gpu().await;
        let mut rng = Rng::new(22);
        // A 1003-row embedding table and a mixed stack, under a limit of about a quarter of each run.
        for (t, cols) in [(GgmlKind::Q8_0, 576u32), (GgmlKind::Q4_K, 768), (GgmlKind::Q6_K, 768), (GgmlKind::Q4_1, 576)] {
            let rows = 1003u32;
            let raw = random_matrix(&mut rng, t, rows, cols);
            let limit = raw.len() as u64 / 4;
            let w = QuantMatrix::upload_stacked_limited(&ctx, "w", &[(t, &raw, rows)], cols, limit).unwrap();
            assert!(w.parts.len() >= 4, "{}: {} parts under a {limit}-byte limit", t.name(), w.parts.len());
            let mut next = 0;
            for p in &w.parts {
                assert_eq!(p.row0, next, "{}: parts must tile the rows", t.name());
                assert!(p.buffer_bytes() <= limit, "{}: a part of {} bytes over {limit}", t.name(), p.buffer_bytes());
                next += p.rows;
            }
            assert_eq!(next, rows);
            for n_rows in [1, 9] {
                let x = rng.vec_uniform((n_rows * cols) as usize, -1.0, 1.0);
                let got = run_matmul(&ctx, &w, &x, n_rows, None).await;
                let what = format!("{} split in {} parts", t.name(), w.parts.len());
                assert_reference(&what, (t, &raw, rows, cols), (&x, n_rows), default_int8(&ctx, n_rows), &got);
            }
            // Ids in every part, at both sides of each boundary, and past the vocabulary.
            let mut ids: Vec<u32> = w.parts.iter().flat_map(|p| [p.row0, p.row0 + p.rows - 1]).collect();
            ids.push(rows + 3);
            check_embedding(&ctx, t, &w, &raw, &ids).await;
        }
    }
}

gpu_test! {
    async fn shape_contract_violations_are_refused() {
        let ctx = gpu().await;
        let mut rng = Rng::new(19);
        let (rows, cols) = (64u32, 96u32);
        let raw = random_matrix(&mut rng, GgmlKind::Q4_1, rows, cols);
        let err = |r: Result<QuantMatrix, pagedlm::gpu::GpuError>| r.err().expect("must be refused").to_string();
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, rows, 128));
        assert!(e.contains("bytes"), "{e}");
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw[1..], rows, cols));
        assert!(e.contains("bytes"), "{e}");
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, rows * 2, cols / 2 + 1));
        assert!(e.contains("multiple of 32"), "{e}");
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlKind::Q8_0, &raw, rows, cols));
        assert!(e.contains("Q8_0"), "{e}");
        let e = err(QuantMatrix::upload_stacked(&ctx, "qkv", &[(GgmlKind::Q4_1, &raw, rows), (GgmlKind::Q4_1, &raw, rows)], 64));
        assert!(e.contains("part 0"), "{e}");
        // A K-quant row is whole 256-value blocks; a type pagedlm does not compute with is named.
        let k = random_matrix(&mut rng, GgmlKind::Q4_K, 4, 256);
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_K, &k, 8, 128));
        assert!(e.contains("multiple of 256"), "{e}");
        let e = err(QuantMatrix::upload(&ctx, "w", GgmlType::Other(23), &k, 4, 256));
        assert!(e.contains("IQ4_XS"), "{e}");
        // A limit smaller than one row group cannot hold the matrix.
        let e = err(QuantMatrix::upload_stacked_limited(&ctx, "w", &[(GgmlKind::Q4_1, &raw, rows)], cols, 100));
        assert!(e.contains("binding limit"), "{e}");

        let w = QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, rows, cols).unwrap();
        let n_rows = 3u32;
        let x_ok = ctx.storage_zeroed("x", (n_rows * cols * 4) as u64);
        let y_ok = ctx.storage_zeroed("y", (n_rows * rows * 4) as u64);
        let x_short = ctx.storage_zeroed("x", (n_rows * cols * 4 - 4) as u64);
        let y_short = ctx.storage_zeroed("y", (n_rows * rows * 4 - 4) as u64);
        let merr = |r: Result<Vec<pagedlm::gpu::Kernel>, pagedlm::gpu::GpuError>| r.err().expect("must be refused").to_string();
        let e = merr(matmul(&ctx, &w, &x_short, &y_ok, n_rows));
        assert!(e.contains("x needs"), "{e}");
        let e = merr(matmul(&ctx, &w, &x_ok, &y_short, n_rows));
        assert!(e.contains("y needs"), "{e}");
        let e = merr(matmul(&ctx, &w, &x_ok, &y_ok, 0));
        assert!(e.contains("n_rows"), "{e}");
        let e = merr(matmul_with(&ctx, &w, &x_ok, &y_ok, n_rows, MatmulConfig { tile_rows: MAX_TILE_ROWS + 1, ..MatmulConfig::for_device(&ctx, 1) }));
        assert!(e.contains("configuration"), "{e}");
        // Subgroups: splits summed within one need a power of two that fits in one; shared loads
        // need subgroups of 8.
        let sub = |k_split, workgroup| MatmulConfig { tile_rows: 1, group_tile: 1, k_split, workgroup, subgroup: true, int8_activations: false };
        let e = merr(matmul_with(&ctx, &w, &x_ok, &y_ok, n_rows, sub(6, 48)));
        assert!(e.contains("power of two"), "{e}");
        let too_wide = ctx.info.subgroup_min_size.max(4) * 2;
        let e = merr(matmul_with(&ctx, &w, &x_ok, &y_ok, n_rows, sub(too_wide, too_wide)));
        assert!(e.contains("subgroups of at least"), "{e}");
        if !ctx.has_subgroups(8) {
            let e = merr(matmul_with(&ctx, &w, &x_ok, &y_ok, n_rows, sub(1, 16)));
            assert!(e.contains("subgroups of at least 8"), "{e}");
        }
        assert!(matmul(&ctx, &w, &x_ok, &y_ok, n_rows).is_ok());

        let ids = ctx.storage_zeroed("ids", 8);
        let table_raw = random_matrix(&mut rng, GgmlKind::Q8_0, 16, cols);
        let table = QuantMatrix::upload(&ctx, "embd", GgmlKind::Q8_0, &table_raw, 16, cols).unwrap();
        let e = embedding(&ctx, &table, (&ids, &y_ok), 3, 1.0).err().expect("short ids must be refused").to_string();
        assert!(e.contains("ids needs"), "{e}");
        let out_short = ctx.storage_zeroed("out", (2 * cols * 4 - 4) as u64);
        let e = embedding(&ctx, &table, (&ids, &out_short), 2, 1.0).err().expect("a short out must be refused").to_string();
        assert!(e.contains("out needs"), "{e}");
    }
}

/// Timing of the matmul variants (not a test), natively: `cargo test --release --test
/// kernels_matmul -- --ignored --nocapture bench_matmul` (`BENCH_CASE=prefill` runs the cases whose
/// name holds it); in Chromium (SwiftShader): `BENCH_CASE=sweep wasm-pack test --release --headless
/// --chrome --test kernels_matmul -- --include-ignored --nocapture bench_matmul` (the case filter
/// read when it compiles; the lines come through the browser console). Each case records up to
/// `REPS` dispatches in one submission and times submit + a 4-byte readback, its variants
/// alternating `ROUNDS` times; weights rotate over enough copies (> 96 MB) that decode streams them
/// from memory, as a model's layers would. Where the device has no subgroups (SwiftShader) the
/// plain variant's workgroup, activation rows and row groups per invocation are swept too
/// (`sweep …` cases), in every body (`sweep body …`).
#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore]
fn bench_matmul() {
    pollster::block_on(bench_matmul_cases(std::env::var("BENCH_CASE").unwrap_or_default()));
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen_test::wasm_bindgen_test]
#[ignore]
async fn bench_matmul() {
    bench_matmul_cases(option_env!("BENCH_CASE").unwrap_or_default().to_string()).await;
}

async fn bench_matmul_cases(filter: String) {
    const REPS: usize = 100;
    const ROUNDS: usize = 5;
    let ctx = gpu().await;
    common::report(&format!("adapter: {}", ctx.adapter_name()));
    let mut rng = Rng::new(99);
    let sg = ctx.has_subgroups(8);
    let cpu = |tile_rows| MatmulConfig { tile_rows, group_tile: 1, k_split: 1, workgroup: 16, subgroup: false, int8_activations: false };
    let split = |tile_rows| MatmulConfig { k_split: 8, workgroup: 64, ..cpu(tile_rows) };
    let int8 = |c: MatmulConfig| MatmulConfig { int8_activations: true, ..c };
    let shared = |c: MatmulConfig| MatmulConfig { subgroup: sg, ..c };
    // Per shape: the old default (f32, no sharing) and the variants around the new one.
    let around = |t: u32| vec![cpu(t), shared(cpu(t)), int8(cpu(t)), int8(shared(cpu(t)))];
    // (name, kind, rows, cols, n_rows, variants)
    type Case = (String, GgmlKind, u32, u32, u32, Vec<MatmulConfig>);
    let mut cases: Vec<Case> = vec![
        (
            "decode Q4_1 576→1536".into(),
            GgmlKind::Q4_1,
            1536,
            576,
            1,
            [around(1), vec![split(1), int8(shared(MatmulConfig { workgroup: 8, ..cpu(1) }))]].concat(),
        ),
        ("decode Q4_1 1536→576".into(), GgmlKind::Q4_1, 576, 1536, 1, around(1)),
        ("decode Q8_0 576→49152".into(), GgmlKind::Q8_0, 49152, 576, 1, around(1)),
        ("batch 4 Q4_1 576→1536".into(), GgmlKind::Q4_1, 1536, 576, 4, around(4)),
        ("batch 8 Q4_1 576→1536".into(), GgmlKind::Q4_1, 1536, 576, 8, around(8)),
        ("batch 16 Q4_1 576→1536".into(), GgmlKind::Q4_1, 1536, 576, 16, [around(16), vec![int8(shared(cpu(8)))]].concat()),
        ("batch 8 Q8_0 576→49152".into(), GgmlKind::Q8_0, 49152, 576, 8, around(8)),
        (
            "prefill 512 Q4_1 576→1536".into(),
            GgmlKind::Q4_1,
            1536,
            576,
            512,
            [vec![cpu(8)], around(16), vec![split(4), int8(shared(cpu(8))), int8(shared(MatmulConfig { workgroup: 8, ..cpu(16) }))]].concat(),
        ),
        ("prefill 512 Q4_1 1536→576".into(), GgmlKind::Q4_1, 576, 1536, 512, [vec![cpu(8)], around(16)].concat()),
        ("prefill 512 Q8_0 576→1536".into(), GgmlKind::Q8_0, 1536, 576, 512, [vec![cpu(8)], around(16)].concat()),
    ];
    // Every type in decode: 576 → 1536 (not the K-quants: 576 is not a whole number of their
    // 256-value blocks) and 1536 → 576.
    for (t, _) in every_type() {
        if t.block_size().unwrap().0 != 256 {
            cases.push((format!("type {} 576→1536", t.name()), t, 1536, 576, 1, vec![cpu(1)]));
        }
        cases.push((format!("type {} 1536→576", t.name()), t, 576, 1536, 1, vec![cpu(1), shared(cpu(1))]));
        cases.push((format!("prefill 512 type {} 1536→576", t.name()), t, 576, 1536, 512, vec![cpu(8), shared(cpu(16))]));
    }
    // Without subgroups (SwiftShader) the plain variant's workgroup and tile, swept.
    if !sg {
        let wgs = |t: u32| [4u32, 8, 32, 64].map(|workgroup| MatmulConfig { workgroup, ..cpu(t) }).to_vec();
        for (name, kind, rows, cols) in [("Q4_1 576→1536", GgmlKind::Q4_1, 1536, 576), ("Q8_0 576→49152", GgmlKind::Q8_0, 49152, 576)] {
            cases.push((format!("sweep decode {name}"), kind, rows, cols, 1, [vec![cpu(1)], wgs(1)].concat()));
        }
        let groups = |t: u32, g: u32, workgroup: u32| MatmulConfig { group_tile: g, workgroup, ..cpu(t) };
        for (name, kind, rows, cols) in
            [("Q4_1 576→1536", GgmlKind::Q4_1, 1536, 576), ("Q4_1 1536→576", GgmlKind::Q4_1, 576, 1536), ("Q8_0 576→49152", GgmlKind::Q8_0, 49152, 576)]
        {
            let v = [1u32, 2, 4].iter().flat_map(|&g| [4u32, 8, 16].map(|wg| groups(1, g, wg))).collect();
            cases.push((format!("sweep groups decode {name}"), kind, rows, cols, 1, v));
        }
        let tiles = [2u32, 4, 8].map(cpu).to_vec();
        let square = [(4u32, 4u32, 16u32), (4, 4, 8), (4, 2, 16), (8, 2, 16), (8, 2, 8), (2, 4, 16), (4, 4, 4), (8, 4, 8), (8, 4, 16), (16, 2, 8)]
            .map(|(t, g, wg)| groups(t, g, wg))
            .to_vec();
        cases.push(("sweep prefill 512 Q4_1 576→1536".into(), GgmlKind::Q4_1, 1536, 576, 512, [vec![cpu(16)], tiles, square].concat()));
        // Every body at the plain variant's two tiles: one group (tile 16 in prefill) against two
        // (tile 8).
        for (t, cols) in every_type() {
            let (rows, name) = (1536, t.name());
            cases.push((format!("sweep body decode {name} {cols}→{rows}"), t, rows, cols, 1, vec![groups(1, 1, 16), groups(1, 2, 8), groups(1, 2, 16)]));
            cases.push((
                format!("sweep body prefill 512 {name} {cols}→{rows}"),
                t,
                rows,
                cols,
                512,
                vec![groups(16, 1, 16), groups(8, 2, 16), groups(8, 2, 8)],
            ));
        }
    }
    for (name, kind, rows, cols, n_rows, configs) in cases {
        if !name.contains(&filter) {
            continue;
        }
        let raw = random_matrix(&mut rng, kind, rows, cols);
        let copies = ((96u64 << 20) / raw.len() as u64 + 1).min(256) as usize;
        let copies = if n_rows > 16 { 4 } else { copies };
        let mats: Vec<QuantMatrix> = (0..copies).map(|_| QuantMatrix::upload(&ctx, "w", kind, &raw, rows, cols).unwrap()).collect();
        let x = rng.vec_uniform((n_rows * cols) as usize, -1.0, 1.0);
        let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
        let yb = ctx.storage_zeroed("y", n_rows as u64 * rows as u64 * 4);
        let flops = 2.0 * n_rows as f64 * rows as f64 * cols as f64;
        // About 0.2 GFLOP per timed submission: a prefill case runs a few dispatches, not REPS.
        let reps = ((2e8 / flops) as usize).clamp(2, REPS);
        // The variants alternate, ROUNDS times: on a shared machine a neighbour's burst then
        // hits every variant alike. Printed: the median over rounds (wall and CPU time).
        let kernels: Vec<Vec<_>> = configs.iter().map(|&c| mats.iter().map(|m| matmul_with(&ctx, m, &xb, &yb, n_rows, c).unwrap()).collect()).collect();
        // One dispatch each first: lavapipe compiles a pipeline when it first runs.
        let mut rec = Recorder::new(&ctx, "warm-up");
        kernels.iter().for_each(|variant| rec.dispatch_all(&variant[0]));
        rec.submit();
        ctx.read_f32(&yb, 0, 1).await.unwrap();
        let mut times: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
        for _ in 0..ROUNDS {
            for (k, variant) in kernels.iter().enumerate() {
                let start = common::now_ms();
                let cpu_start = cpu_seconds();
                let mut rec = Recorder::new(&ctx, "bench");
                for i in 0..reps {
                    rec.dispatch_all(&variant[i % copies]);
                }
                rec.submit();
                ctx.read_f32(&yb, 0, 1).await.unwrap();
                times[k].push(((common::now_ms() - start) / 1e3 / reps as f64, (cpu_seconds() - cpu_start) / reps as f64));
            }
        }
        for (config, t) in configs.iter().zip(&mut times) {
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let wall = median(&mut t.iter().map(|p| p.0).collect());
            let cpu = median(&mut t.iter().map(|p| p.1).collect());
            common::report(&format!(
                "{name:30} {:7.1} KB tile {:2} groups {} split {} wg {:2} subgroup {:5} int8 {:5}: {:9.1} µs wall {:9.1} µs CPU  {:6.2} GFLOP/s  {:5.2} GB/s (wall)",
                raw.len() as f64 / 1e3,
                config.tile_rows,
                config.group_tile,
                config.k_split,
                config.workgroup,
                config.subgroup,
                config.int8_activations,
                wall * 1e6,
                cpu * 1e6,
                flops / wall / 1e9,
                raw.len() as f64 / wall / 1e9
            ));
        }
    }
}

/// CPU time of every thread of this process (lavapipe's workers included), from Linux's
/// schedstat: on a shared machine it measures the work, where wall time also measures the
/// neighbours. NaN in the browser, which does not tell.
#[cfg(target_arch = "wasm32")]
fn cpu_seconds() -> f64 {
    f64::NAN
}

#[cfg(not(target_arch = "wasm32"))]
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return f64::NAN };
    let mut ns = 0u64;
    for task in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    ns as f64 * 1e-9
}

/// The RMSNorm prologue against the norm as a dispatch of its own before the plain matmul (not a
/// test: `cargo test --release --test kernels_matmul -- --ignored --nocapture bench_norm`), on
/// SmolLM2's shapes with the device's variant: each round records REPS (norm + matmul) pairs or
/// REPS prologue matmuls in one submission, the two alternating ROUNDS times; medians of wall and
/// CPU time per matmul.
#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore]
fn bench_norm_prologue() {
    use pagedlm::gpu::ops::norm::rms_norm;
    pollster::block_on(async {
        const ROUNDS: usize = 7;
        let ctx = gpu().await;
        println!("adapter: {}", ctx.adapter_name());
        let mut rng = Rng::new(98);
        // (name, rows, cols, n_rows): the qkv and gate/up matmuls in decode and in a prefill chunk.
        let cases =
            [("qkv 576→960", 960u32, 576u32, 1u32), ("gate|up 576→3072", 3072, 576, 1), ("qkv 576→960", 960, 576, 512), ("gate|up 576→3072", 3072, 576, 512)];
        // The device's variant, and without subgroups where it has them (SwiftShader's case).
        let shared: &[bool] = if ctx.has_subgroups(8) { &[true, false] } else { &[false] };
        for ((name, rows, cols, n_rows), &subgroup) in cases.into_iter().flat_map(|c| shared.iter().map(move |s| (c, s))) {
            let raw = random_matrix(&mut rng, GgmlKind::Q4_1, rows, cols);
            let copies = if n_rows > 16 { 2 } else { ((96u64 << 20) / raw.len() as u64 + 1).min(256) as usize };
            let mats: Vec<QuantMatrix> = (0..copies).map(|_| QuantMatrix::upload(&ctx, "w", GgmlKind::Q4_1, &raw, rows, cols).unwrap()).collect();
            let (x, g) = norm_inputs(&mut rng, n_rows, cols);
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
            let gb = ctx.storage_init("g", bytemuck::cast_slice(&g));
            let hb = ctx.storage_zeroed("h", (n_rows * cols * 4) as u64);
            let yb = ctx.storage_zeroed("y", n_rows as u64 * rows as u64 * 4);
            let config = MatmulConfig { subgroup: subgroup && MatmulConfig::for_device(&ctx, n_rows).subgroup, ..MatmulConfig::for_device(&ctx, n_rows) };
            let norm = rms_norm(&ctx, &xb, &gb, &hb, n_rows, cols, 1e-5).unwrap();
            let plain: Vec<_> = mats.iter().map(|m| matmul_with(&ctx, m, &hb, &yb, n_rows, config).unwrap()).collect();
            let fused: Vec<_> = mats
                .iter()
                .map(|m| matmul_input(&ctx, m, (Input::Norm { x: &xb, weight: &gb, eps: 1e-5 }, &yb), n_rows, config, Epilogue::Store).unwrap())
                .collect();
            let reps = if n_rows > 16 { 4 } else { 200 };
            let mut rec = Recorder::new(&ctx, "warm-up");
            rec.dispatch(&norm);
            rec.dispatch_all(&plain[0]);
            rec.dispatch_all(&fused[0]);
            rec.submit();
            ctx.read_f32(&yb, 0, 1).await.unwrap();
            let mut times = [Vec::new(), Vec::new()];
            for _ in 0..ROUNDS {
                for (k, t) in times.iter_mut().enumerate() {
                    let start = std::time::Instant::now();
                    let cpu_start = cpu_seconds();
                    let mut rec = Recorder::new(&ctx, "bench");
                    for i in 0..reps {
                        if k == 0 {
                            rec.dispatch(&norm);
                            rec.dispatch_all(&plain[i % copies]);
                        } else {
                            rec.dispatch_all(&fused[i % copies]);
                        }
                    }
                    rec.submit();
                    ctx.read_f32(&yb, 0, 1).await.unwrap();
                    t.push((start.elapsed().as_secs_f64() / reps as f64, (cpu_seconds() - cpu_start) / reps as f64));
                }
            }
            let median = |v: Vec<f64>| {
                let mut v = v;
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let [a, b] = times.map(|t| (median(t.iter().map(|p| p.0).collect()), median(t.iter().map(|p| p.1).collect())));
            println!(
                "{name:18} {n_rows:3} rows {config:?}: norm + matmul {:8.1} µs wall {:8.1} µs CPU; prologue {:8.1} µs wall {:8.1} µs CPU; CPU ratio {:.3}",
                a.0 * 1e6,
                a.1 * 1e6,
                b.0 * 1e6,
                b.1 * 1e6,
                a.1 / b.1
            );
        }
    });
}
