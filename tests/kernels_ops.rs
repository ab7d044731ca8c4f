//! rms_norm (and its int8 output), residual_norm, head_norm, rope, glu, argmax and kv_write against their CPU references, natively
//! (lavapipe) and in the browser (SwiftShader).
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{assert_close, gpu, variant_contexts};
use pagedlm::gpu::ops::argmax::ArgmaxPlan;
use pagedlm::gpu::ops::kv_write::KvWriteBuffers;
use pagedlm::gpu::ops::norm::NormOut;
use pagedlm::gpu::ops::pool::{PoolBuffers, PoolShape};
use pagedlm::gpu::ops::rope::RopeShape;
use pagedlm::gpu::ops::{act, argmax, kv_write, norm, rope};
use pagedlm::gpu::{Context, GpuError, Kernel, Recorder};
use pagedlm::kv::KvDtype;
use pagedlm::model::{Activation, RopePairing};
use pagedlm::rng::Rng;

fn run(ctx: &Context, kernels: &[&Kernel]) {
    let mut rec = Recorder::new(ctx, "test");
    for k in kernels {
        rec.dispatch(k);
    }
    rec.submit();
}

fn f32_buffer(ctx: &Context, data: &[f32]) -> wgpu::Buffer {
    ctx.storage_init("test.f32", bytemuck::cast_slice(data))
}

fn u32_buffer(ctx: &Context, data: &[u32]) -> wgpu::Buffer {
    ctx.storage_init("test.u32", bytemuck::cast_slice(data))
}

fn normals(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

fn expect_shape_err(result: Result<impl Sized, GpuError>, needle: &str) {
    match result {
        Ok(_) => panic!("expected a shape error mentioning {needle:?}, the launcher accepted the input"),
        Err(e @ GpuError::Shape { .. }) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
        Err(e) => panic!("expected a shape error, got {e}"),
    }
}

// ---------------------------------------------------------------- rms_norm

// f32 sum of squares over 576-2048 values plus sqrt and two products: ~1e-6 relative.
const RMS_REL_TOL: f32 = 4e-6;
const RMS_ABS_TOL: f32 = 1e-6;

gpu_test! {
    async fn rms_norm_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(11);
        // decode and prefill on SmolLM2's hidden size, odd sizes, one value per row, a wide row.
        let shapes = [(1u32, 576u32), (512, 576), (1, 1), (3, 7), (65, 64), (2, 2049)];
        for (n_rows, dim) in shapes {
            for scale in [1.0f32, 1e-3, 300.0] {
                let x = normals(&mut rng, (n_rows * dim) as usize, scale);
                let weight = rng.vec_uniform(dim as usize, 0.2, 2.0);
                let xb = f32_buffer(&ctx, &x);
                let wb = f32_buffer(&ctx, &weight);
                let ob = ctx.storage_zeroed("out", n_rows as u64 * dim as u64 * 4);
                let k = norm::rms_norm(&ctx, &xb, &wb, &ob, n_rows, dim, 1e-5).unwrap();
                run(&ctx, &[&k]);
                let got = ctx.read_f32(&ob, 0, (n_rows * dim) as u64).await.unwrap();
                let want = norm::rms_norm_cpu(&x, &weight, n_rows as usize, dim as usize, 1e-5);
                assert_close(&format!("rms_norm {n_rows}x{dim} scale {scale}"), &got, &want, RMS_ABS_TOL, RMS_REL_TOL);
            }
        }
    }
}

gpu_test! {
    async fn rms_norm_rejects_bad_shapes() {
        let ctx = gpu().await;
        let x = ctx.storage_zeroed("x", 2 * 576 * 4);
        let w = ctx.storage_zeroed("w", 576 * 4);
        let out = ctx.storage_zeroed("out", 2 * 576 * 4);
        expect_shape_err(norm::rms_norm(&ctx, &x, &w, &out, 3, 576, 1e-5), "x needs 6912 bytes");
        expect_shape_err(norm::rms_norm(&ctx, &x, &w, &out, 1, 577, 1e-5), "weight needs 2308 bytes");
        expect_shape_err(norm::rms_norm(&ctx, &x, &w, &out, 0, 576, 1e-5), "at least 1");
        expect_shape_err(norm::rms_norm(&ctx, &x, &w, &out, 2, 576, f32::NAN), "eps");
        expect_shape_err(norm::rms_norm(&ctx, &x, &w, &x, 2, 576, 1e-5), "different buffer");
    }
}

/// Asserts that `words` (int8 blocks, shaders/quantize_common.wgsl's layout) quantize `values`:
/// each block's scale is max|v| / 127 and its sum Σv (f32, up to rounding), every quant within
/// half a step (plus rounding) of v / scale. A wrong block, value or scale misses by far more.
fn assert_int8_blocks(what: &str, words: &[u32], values: &[f32]) {
    assert_eq!(words.len() / 12, values.len() / 32, "{what}: block count");
    for (b, (blk, v)) in words.chunks_exact(12).zip(values.chunks_exact(32)).enumerate() {
        let d = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let (got_d, got_s) = (f32::from_bits(blk[8]), f32::from_bits(blk[9]));
        assert!((got_d - d).abs() <= 1e-5 * d, "{what}: block {b} scale {got_d} vs {d}");
        let (s, mag) = (v.iter().sum::<f32>(), v.iter().map(|x| x.abs()).sum::<f32>());
        assert!((got_s - s).abs() <= 1e-5 * mag, "{what}: block {b} sum {got_s} vs {s}");
        for (j, &x) in v.iter().enumerate() {
            let q = (blk[j / 4] >> (8 * (j % 4))) as u8 as i8 as f32;
            let want = if d > 0.0 { x / d } else { 0.0 };
            assert!((q - want).abs() <= 0.5 + 1e-3, "{what}: block {b} value {j}: quant {q} for {want}");
        }
    }
}

gpu_test! {
    async fn norms_quantize_their_output_for_the_next_matmul() {
        let ctx = gpu().await;
        let mut rng = Rng::new(14);
        // SmolLM2's and Gemma 3's hidden sizes, decode and a prefill chunk.
        for (n_rows, dim) in [(1u32, 576u32), (37, 640)] {
            let n = (n_rows * dim) as usize;
            let x = normals(&mut rng, n, 3.0);
            let delta = normals(&mut rng, n, 30.0);
            let weight = rng.vec_uniform(dim as usize, 0.2, 2.0);
            let post = rng.vec_uniform(dim as usize, 0.2, 2.0);
            let (xb, wb, db, pb) = (f32_buffer(&ctx, &x), f32_buffer(&ctx, &weight), f32_buffer(&ctx, &delta), f32_buffer(&ctx, &post));
            let q_bytes = pagedlm::gpu::ops::matmul::int8_bytes(n_rows, dim);
            let want = norm::rms_norm_cpu(&x, &weight, n_rows as usize, dim as usize, 1e-5);
            // Both outputs, then int8 alone.
            let ob = ctx.storage_zeroed("out", n as u64 * 4);
            let qb = ctx.storage_zeroed("q", q_bytes);
            let k = norm::rms_norm_to(&ctx, &xb, &wb, NormOut { f32: Some(&ob), int8: Some(&qb) }, n_rows, dim, 1e-5).unwrap();
            run(&ctx, &[&k]);
            let got = ctx.read_f32(&ob, 0, n as u64).await.unwrap();
            assert_close(&format!("rms_norm {n_rows}x{dim} with int8"), &got, &want, RMS_ABS_TOL, RMS_REL_TOL);
            assert_int8_blocks(&format!("rms_norm {n_rows}x{dim}"), &ctx.read_u32(&qb, 0, q_bytes / 4).await.unwrap(), &want);
            let qb = ctx.storage_zeroed("q", q_bytes);
            let k = norm::rms_norm_to(&ctx, &xb, &wb, NormOut { f32: None, int8: Some(&qb) }, n_rows, dim, 1e-5).unwrap();
            run(&ctx, &[&k]);
            assert_int8_blocks(&format!("rms_norm {n_rows}x{dim} int8 only"), &ctx.read_u32(&qb, 0, q_bytes / 4).await.unwrap(), &want);
            // The post-normed residual, then the next pre-norm quantized.
            let qb = ctx.storage_zeroed("q", q_bytes);
            let k = norm::residual_norm(&ctx, (&xb, &db), &pb, Some((&wb, NormOut { f32: None, int8: Some(&qb) })), (n_rows, dim, 1e-6)).unwrap();
            run(&ctx, &[&k]);
            let normed = norm::rms_norm_cpu(&delta, &post, n_rows as usize, dim as usize, 1e-6);
            let sum: Vec<f32> = x.iter().zip(&normed).map(|(a, b)| a + b).collect();
            let want_next = norm::rms_norm_cpu(&sum, &weight, n_rows as usize, dim as usize, 1e-6);
            assert_int8_blocks(&format!("residual_norm {n_rows}x{dim}"), &ctx.read_u32(&qb, 0, q_bytes / 4).await.unwrap(), &want_next);
        }
        let (x, w) = (ctx.storage_zeroed("x", 2 * 64 * 4), ctx.storage_zeroed("w", 64 * 4));
        let q = ctx.storage_zeroed("q", pagedlm::gpu::ops::matmul::int8_bytes(2, 64));
        expect_shape_err(norm::rms_norm_to(&ctx, &x, &w, NormOut { f32: None, int8: None }, 2, 64, 1e-5), "an f32 or an int8 output");
        expect_shape_err(norm::rms_norm_to(&ctx, &x, &w, NormOut { f32: None, int8: Some(&q) }, 3, 64, 1e-5), "x needs");
        let q_short = ctx.storage_zeroed("q", pagedlm::gpu::ops::matmul::int8_bytes(2, 64) - 16);
        expect_shape_err(norm::rms_norm_to(&ctx, &x, &w, NormOut { f32: None, int8: Some(&q_short) }, 2, 64, 1e-5), "int8 out needs");
        expect_shape_err(norm::rms_norm_to(&ctx, &x, &w, NormOut { f32: None, int8: Some(&q) }, 2, 48, 1e-5), "multiple of 32");
        expect_shape_err(norm::rms_norm_to(&ctx, &x, &w, NormOut { f32: Some(&q), int8: Some(&q) }, 2, 64, 1e-5), "different buffer");
    }
}

gpu_test! {
    async fn residual_norm_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(13);
        // Gemma 3's hidden size in decode and in a prefill chunk, an odd size; with and without
        // the next norm (the last layer has none).
        for (n_rows, dim) in [(1u32, 640u32), (37, 640), (3, 7)] {
            for with_next in [true, false] {
                let n = (n_rows * dim) as usize;
                let x = normals(&mut rng, n, 1.0);
                let delta = normals(&mut rng, n, 30.0);
                let post = rng.vec_uniform(dim as usize, 0.2, 2.0);
                let weight = rng.vec_uniform(dim as usize, 0.2, 2.0);
                let (xb, db, pb, wb) = (f32_buffer(&ctx, &x), f32_buffer(&ctx, &delta), f32_buffer(&ctx, &post), f32_buffer(&ctx, &weight));
                let ob = ctx.storage_zeroed("out", n as u64 * 4);
                let next = with_next.then_some((&wb, NormOut::f32(&ob)));
                let k = norm::residual_norm(&ctx, (&xb, &db), &pb, next, (n_rows, dim, 1e-6)).unwrap();
                run(&ctx, &[&k]);
                let normed = norm::rms_norm_cpu(&delta, &post, n_rows as usize, dim as usize, 1e-6);
                let want_x: Vec<f32> = x.iter().zip(&normed).map(|(a, b)| a + b).collect();
                let got_x = ctx.read_f32(&xb, 0, n as u64).await.unwrap();
                let what = format!("residual_norm {n_rows}x{dim} next {with_next}");
                // Errors of a few units of RMS_REL_TOL of |normed| ~ 1 remain where x and normed cancel.
                assert_close(&format!("{what}: x"), &got_x, &want_x, 5e-5, RMS_REL_TOL);
                let got_out = ctx.read_f32(&ob, 0, n as u64).await.unwrap();
                if with_next {
                    let want_out = norm::rms_norm_cpu(&want_x, &weight, n_rows as usize, dim as usize, 1e-6);
                    assert_close(&format!("{what}: out"), &got_out, &want_out, 5e-5, RMS_REL_TOL * 10.0);
                } else {
                    assert!(got_out.iter().all(|&v| v == 0.0), "{what}: out must not be written without a next norm");
                }
            }
        }
        let x = ctx.storage_zeroed("x", 2 * 64 * 4);
        let d = ctx.storage_zeroed("d", 2 * 64 * 4);
        let w = ctx.storage_zeroed("w", 64 * 4);
        expect_shape_err(norm::residual_norm(&ctx, (&x, &d), &w, None, (3, 64, 1e-6)), "x needs");
        expect_shape_err(norm::residual_norm(&ctx, (&x, &x), &w, None, (2, 64, 1e-6)), "different buffers");
        expect_shape_err(norm::residual_norm(&ctx, (&x, &d), &w, Some((&w, NormOut::f32(&d))), (2, 64, 1e-6)), "different buffers");
    }
}

gpu_test! {
    async fn head_norm_matches_cpu_in_place() {
        let ctx = gpu().await;
        let mut rng = Rng::new(12);
        // Gemma 3's fused qkv rows (4 q heads, 1 k head, 1 v head of 256): the q heads, then the k
        // head; a small odd layout. Columns outside the normalized heads must not move.
        for (n_rows, n_q, n_kv, hd) in [(1u32, 4u32, 1u32, 256u32), (7, 4, 1, 256), (3, 3, 2, 6)] {
            let stride = (n_q + 2 * n_kv) * hd;
            for (first, n_heads) in [(0, n_q), (n_q * hd, n_kv)] {
                let x = normals(&mut rng, (n_rows * stride) as usize, 3.0);
                let weight = rng.vec_uniform(hd as usize, 0.2, 2.0);
                let (xb, wb) = (f32_buffer(&ctx, &x), f32_buffer(&ctx, &weight));
                let shape = norm::HeadNormShape { n_rows, row_stride: stride, first, n_heads, head_dim: hd, eps: 1e-6 };
                let k = norm::head_norm(&ctx, &xb, &wb, &shape).unwrap();
                run(&ctx, &[&k]);
                let got = ctx.read_f32(&xb, 0, x.len() as u64).await.unwrap();
                let mut want = x.clone();
                norm::head_norm_cpu(&mut want, &weight, &shape);
                assert_close(&format!("head_norm {shape:?}"), &got, &want, RMS_ABS_TOL, RMS_REL_TOL);
                assert_ne!(got, x, "{shape:?}: nothing was normalized");
            }
        }
        let x = ctx.storage_zeroed("x", 6 * 256 * 4);
        let w = ctx.storage_zeroed("w", 256 * 4);
        let bad = |first, n_heads| norm::HeadNormShape { n_rows: 1, row_stride: 1536, first, n_heads, head_dim: 256, eps: 1e-6 };
        expect_shape_err(norm::head_norm(&ctx, &x, &w, &bad(1024, 3)), "do not fit");
        expect_shape_err(norm::head_norm(&ctx, &x, &w, &bad(0, 0)), "at least 1");
    }
}

// ---------------------------------------------------------------- rope

/// Absolute tolerance for |x| <= 1 inputs against the f64 reference: the reduced angle is good
/// to ~2e-7 rad at any position; sin/cos and the two products add a few f32 ulps.
const ROPE_ABS_TOL: f32 = 2e-6;

struct RopeCase {
    n_q: u32,
    n_kv: u32,
    head_dim: u32,
    base: f32,
    pairing: RopePairing,
}

const SMOLLM2: RopeCase = RopeCase { n_q: 9, n_kv: 3, head_dim: 64, base: 100_000.0, pairing: RopePairing::Norm };

/// Rotates random fused qkv rows on the GPU and on the CPU; checks the q and k heads within
/// ROPE_ABS_TOL and the v heads bit for bit (they must not move).
async fn check_rope(ctx: &Context, rng: &mut Rng, case: &RopeCase, positions: &[u32]) {
    let n_tokens = positions.len();
    let hd = case.head_dim as usize;
    let rotated = (case.n_q + case.n_kv) as usize;
    let row_stride = (case.n_q + 2 * case.n_kv) as usize * hd;
    let x = rng.vec_uniform(n_tokens * row_stride, -1.0, 1.0);
    let xb = f32_buffer(ctx, &x);
    let pb = u32_buffer(ctx, positions);
    let shape = RopeShape {
        n_tokens: n_tokens as u32,
        row_stride: row_stride as u32,
        n_heads: rotated as u32,
        head_dim: case.head_dim,
        base: case.base,
        pairing: case.pairing,
    };
    let k = rope::rope(ctx, &xb, &pb, &shape).unwrap();
    run(ctx, &[&k]);
    let got = ctx.read_f32(&xb, 0, x.len() as u64).await.unwrap();
    let mut want = x.clone();
    rope::rope_cpu(&shape, &mut want, positions);
    let what = format!("rope q{} kv{} hd{} at {:?}", case.n_q, case.n_kv, hd, &positions[..positions.len().min(4)]);
    assert_close(&what, &got, &want, ROPE_ABS_TOL, 0.0);
    for t in 0..n_tokens {
        let v = t * row_stride + rotated * hd..(t + 1) * row_stride;
        assert_eq!(got[v.clone()], x[v], "{what}: v heads of token {t} changed");
    }
}

gpu_test! {
    async fn rope_matches_cpu_at_any_start() {
        let ctx = gpu().await;
        let mut rng = Rng::new(21);
        for start in [0u32, 1, 17, 4095, 8191] {
            for n_tokens in [1u32, 7] {
                let positions: Vec<u32> = (start..start + n_tokens).collect();
                check_rope(&ctx, &mut rng, &SMOLLM2, &positions).await;
            }
        }
        // A 512-token prefill chunk that starts mid-sequence (a prefix-cache hit).
        let positions: Vec<u32> = (3000..3512).collect();
        check_rope(&ctx, &mut rng, &SMOLLM2, &positions).await;
    }
}

gpu_test! {
    async fn rope_matches_cpu_for_other_head_layouts() {
        let ctx = gpu().await;
        let mut rng = Rng::new(22);
        let cases = [
            RopeCase { n_q: 4, n_kv: 4, head_dim: 16, base: 10_000.0, pairing: RopePairing::Norm }, // MHA
            RopeCase { n_q: 8, n_kv: 1, head_dim: 32, base: 10_000.0, pairing: RopePairing::Norm }, // MQA
            RopeCase { n_q: 6, n_kv: 2, head_dim: 2, base: 500_000.0, pairing: RopePairing::Norm },
            RopeCase { n_q: 2, n_kv: 1, head_dim: 6, base: 100_000.0, pairing: RopePairing::Norm },
            RopeCase { n_q: 1, n_kv: 1, head_dim: 512, base: 1_000_000.0, pairing: RopePairing::Norm },
            // Gemma 3's heads, NEOX pairing, its global and local bases, and odd small heads.
            RopeCase { n_q: 4, n_kv: 1, head_dim: 256, base: 1_000_000.0, pairing: RopePairing::Neox },
            RopeCase { n_q: 4, n_kv: 1, head_dim: 256, base: 10_000.0, pairing: RopePairing::Neox },
            RopeCase { n_q: 2, n_kv: 1, head_dim: 6, base: 100_000.0, pairing: RopePairing::Neox },
            RopeCase { n_q: 6, n_kv: 2, head_dim: 2, base: 500_000.0, pairing: RopePairing::Neox },
        ];
        for case in &cases {
            // Unordered, repeated and very large positions, as in a batch of sequences.
            let positions = [5u32, 0, 8191, 123_456, 5, 1 << 20, u32::MAX];
            check_rope(&ctx, &mut rng, case, &positions).await;
        }
    }
}

gpu_test! {
    async fn rope_kernel_reused_with_new_positions() {
        // Decode: the kernel is built once; each step rewrites the positions buffer.
        let ctx = gpu().await;
        let mut rng = Rng::new(23);
        let hd = 64usize;
        let row_stride = 15 * hd;
        let xb = ctx.storage_zeroed("x", (row_stride * 4) as u64);
        let pb = ctx.storage_zeroed("positions", 4);
        let shape = RopeShape {
            n_tokens: 1,
            row_stride: row_stride as u32,
            n_heads: 12,
            head_dim: hd as u32,
            base: 100_000.0,
            pairing: RopePairing::Norm,
        };
        let k = rope::rope(&ctx, &xb, &pb, &shape).unwrap();
        for pos in [0u32, 1, 2, 17, 4095, 8191] {
            let x = rng.vec_uniform(row_stride, -1.0, 1.0);
            ctx.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&x));
            ctx.queue.write_buffer(&pb, 0, bytemuck::bytes_of(&pos));
            run(&ctx, &[&k]);
            let got = ctx.read_f32(&xb, 0, row_stride as u64).await.unwrap();
            let mut want = x;
            rope::rope_cpu(&shape, &mut want, &[pos]);
            assert_close(&format!("rope step at {pos}"), &got, &want, ROPE_ABS_TOL, 0.0);
        }
    }
}

gpu_test! {
    async fn rope_rejects_bad_shapes() {
        let ctx = gpu().await;
        let x = ctx.storage_zeroed("x", 2 * 960 * 4);
        let p = ctx.storage_zeroed("p", 8);
        let shape = |n_tokens, row_stride, n_heads, head_dim, base| RopeShape {
            n_tokens,
            row_stride,
            n_heads,
            head_dim,
            base,
            pairing: RopePairing::Norm,
        };
        expect_shape_err(rope::rope(&ctx, &x, &p, &shape(2, 960, 12, 63, 1e4)), "even");
        expect_shape_err(rope::rope(&ctx, &x, &p, &shape(2, 960, 16, 64, 1e4)), "do not fit");
        expect_shape_err(rope::rope(&ctx, &x, &p, &shape(3, 960, 12, 64, 1e4)), "x needs");
        expect_shape_err(rope::rope(&ctx, &x, &p, &shape(2, 960, 12, 64, -1.0)), "base");
        expect_shape_err(rope::rope(&ctx, &x, &p, &shape(2, 2048, 1, 1024, 1e4)), "head_dim");
        let p1 = ctx.storage_zeroed("p1", 4);
        expect_shape_err(rope::rope(&ctx, &x, &p1, &shape(2, 960, 12, 64, 1e4)), "positions needs 8 bytes");
    }
}

// ---------------------------------------------------------------- glu (silu and gelu_tanh)

// exp is allowed 3 + 2|x| ulp in WGSL; with |g| <= 30 that is ~1e-5 relative at worst.
const SILU_REL_TOL: f32 = 2e-5;
const SILU_ABS_TOL: f32 = 1e-6;

gpu_test! {
    async fn glu_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(31);
        let cases = [(1u32, 1536u32), (512, 1536), (1, 1), (3, 5), (2, 4099)];
        for ((n_rows, ffn), act) in cases.into_iter().flat_map(|c| [(c, Activation::Silu), (c, Activation::GeluTanh)]) {
            let n = (n_rows * ffn) as usize;
            let gu: Vec<f32> = (0..2 * n).map(|_| rng.normal() * 4.0).collect();
            let gub = f32_buffer(&ctx, &gu);
            let ob = ctx.storage_zeroed("out", n as u64 * 4);
            let k = act::glu(&ctx, (&gub, &ob), n_rows, ffn, act).unwrap();
            run(&ctx, &[&k]);
            let got = ctx.read_f32(&ob, 0, n as u64).await.unwrap();
            let want = act::glu_cpu(&gu, n_rows as usize, ffn as usize, act);
            assert_close(&format!("glu {act:?} {n_rows}x{ffn}"), &got, &want, SILU_ABS_TOL, SILU_REL_TOL);
        }
    }
}

gpu_test! {
    async fn glu_is_finite_for_extreme_gates() {
        let ctx = gpu().await;
        let gates = [0.0f32, -0.0, 1e-30, -1e-30, 30.0, -30.0, 88.0, -88.0, 89.0, -89.0, 1e4, -1e4, 3e38, -3e38];
        let ffn = gates.len();
        let ups: Vec<f32> = (0..ffn).map(|i| if i % 2 == 0 { 1.5 } else { -0.75 }).collect();
        let gu: Vec<f32> = gates.iter().chain(&ups).copied().collect();
        let gub = f32_buffer(&ctx, &gu);
        let ob = ctx.storage_zeroed("out", ffn as u64 * 4);
        for act in [Activation::Silu, Activation::GeluTanh] {
            let k = act::glu(&ctx, (&gub, &ob), 1, ffn as u32, act).unwrap();
            run(&ctx, &[&k]);
            let got = ctx.read_f32(&ob, 0, ffn as u64).await.unwrap();
            let want = act::glu_cpu(&gu, 1, ffn, act);
            // The f64 reference of act(3e38) * 1.5 overflows f32 to inf: only compare finite references.
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                if w.is_finite() {
                    assert_close(&format!("glu {act:?} gate {}", gates[i]), &[*g], &[*w], SILU_ABS_TOL, SILU_REL_TOL);
                } else {
                    assert!(!g.is_nan(), "glu {act:?} gate {}: NaN", gates[i]);
                }
            }
        }
    }
}

gpu_test! {
    async fn glu_rejects_bad_shapes() {
        let ctx = gpu().await;
        let gu = ctx.storage_zeroed("gu", 2 * 1536 * 4);
        let out = ctx.storage_zeroed("out", 1536 * 4);
        expect_shape_err(act::glu(&ctx, (&gu, &out), 2, 1536, Activation::Silu), "gu needs 24576 bytes");
        expect_shape_err(act::glu(&ctx, (&gu, &gu), 1, 1536, Activation::Silu), "different buffer");
        expect_shape_err(act::glu(&ctx, (&gu, &out), 1, 0, Activation::Silu), "at least 1");
    }
}

// ---------------------------------------------------------------- argmax

async fn gpu_argmax(ctx: &Context, logits: &[f32], n_rows: u32, vocab: u32, plan: ArgmaxPlan) -> Vec<u32> {
    let lb = f32_buffer(ctx, logits);
    let ob = ctx.storage_init("out", &vec![0xAAu8; n_rows as usize * 4]);
    let kernels = argmax::argmax_with(ctx, (&lb, &ob), n_rows, vocab, plan).unwrap();
    run(ctx, &kernels.iter().collect::<Vec<_>>());
    ctx.read_u32(&ob, 0, n_rows as u64).await.unwrap()
}

/// Every argmax plan to check on `ctx`: its class's own (for SmolLM2's vocab), the two passes,
/// and one dispatch in a small workgroup (more columns per invocation).
fn argmax_plans(ctx: &Context) -> [ArgmaxPlan; 3] {
    [ArgmaxPlan::auto(ctx, 49_152), ArgmaxPlan::TwoPasses, ArgmaxPlan::OneDispatch(8)]
}

gpu_test! {
    async fn argmax_matches_cpu_on_random_rows() {
        for ctx in variant_contexts().await {
            let mut rng = Rng::new(41);
            // SmolLM2's vocab, vocabs off the 256 partials, smaller than them, a single logit.
            for (n_rows, vocab) in [(1u32, 49_152u32), (4, 49_152), (3, 49_153), (2, 1000), (5, 255), (2, 257), (3, 1), (1, 7)] {
                let logits = normals(&mut rng, (n_rows * vocab) as usize, 3.0);
                for plan in argmax_plans(&ctx) {
                    let got = gpu_argmax(&ctx, &logits, n_rows, vocab, plan).await;
                    let what = format!("{} {plan:?} argmax {n_rows}x{vocab}", ctx.variant_name());
                    assert_eq!(got, argmax::argmax_cpu(&logits, n_rows as usize, vocab as usize), "{what}");
                }
            }
        }
    }
}

gpu_test! {
    async fn argmax_edge_cases() {
        for ctx in variant_contexts().await {
            for plan in argmax_plans(&ctx) {
                argmax_edge_cases_with(&ctx, plan).await;
            }
        }
    }
}

async fn argmax_edge_cases_with(ctx: &Context, plan: ArgmaxPlan) {
    {
        let mut rng = Rng::new(42);
        let vocab = 49_152usize;
        let mut rows: Vec<(&str, Vec<f32>)> = Vec::new();
        let base = |rng: &mut Rng| rng.vec_uniform(vocab, -10.0, 10.0);
        let mut last = base(&mut rng);
        last[vocab - 1] = 11.0;
        rows.push(("max is the last element", last));
        let mut first = base(&mut rng);
        first[0] = 11.0;
        rows.push(("max is the first element", first));
        // Ties in the same partial (stride 256) and across partials: the lowest index wins.
        let mut tie = base(&mut rng);
        for i in [40_000, 777, 777 + 256, 30_001] {
            tie[i] = 12.0;
        }
        rows.push(("ties", tie));
        rows.push(("all equal", vec![0.5; vocab]));
        let mut nans = base(&mut rng);
        for i in (0..vocab).step_by(97) {
            nans[i] = f32::NAN;
        }
        nans[12_345] = 10.5;
        nans[0] = f32::NAN;
        rows.push(("NaNs are skipped", nans));
        rows.push(("all NaN", vec![f32::NAN; vocab]));
        let mut ninf = vec![f32::NEG_INFINITY; vocab];
        ninf[3] = f32::NAN;
        ninf[9_000] = -1e30;
        rows.push(("-inf below a number", ninf.clone()));
        ninf[9_000] = f32::NEG_INFINITY;
        rows.push(("-inf above NaN", ninf));
        let mut pinf = base(&mut rng);
        pinf[20_000] = f32::INFINITY;
        pinf[40_000] = f32::INFINITY;
        rows.push(("+inf", pinf));
        let mut zeros = vec![-1.0f32; vocab];
        zeros[5_000] = -0.0;
        zeros[600] = 0.0;
        zeros[100] = -0.0;
        rows.push(("-0 ties +0", zeros));
        let logits: Vec<f32> = rows.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        let got = gpu_argmax(ctx, &logits, rows.len() as u32, vocab as u32, plan).await;
        let want = argmax::argmax_cpu(&logits, rows.len(), vocab);
        for (i, (what, _)) in rows.iter().enumerate() {
            assert_eq!(got[i], want[i], "{} {plan:?} argmax: {what}", ctx.variant_name());
        }
        // The reference itself on the cases whose answer is known by construction.
        assert_eq!(want[0] as usize, vocab - 1);
        assert_eq!(want[1], 0);
        assert_eq!(want[2], 777);
        assert_eq!(want[3], 0);
        assert_eq!(want[4], 12_345);
        assert_eq!(want[5], 0);
        assert_eq!(want[6], 9_000);
        assert_eq!(want[7], 0);
        assert_eq!(want[8], 20_000);
        assert_eq!(want[9], 100);
    }
}

/// Time of one argmax (µs) per plan on SmolLM2's and Gemma 3's vocabularies, 1 and 8 rows,
/// natively: `cargo test --test kernels_ops -- --ignored --nocapture argmax_time`. A figure.
#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore = "measurement: argmax plans"]
fn argmax_time() {
    pollster::block_on(async {
        let ctx = gpu().await;
        let mut rng = Rng::new(43);
        for (n_rows, vocab) in [(1u32, 49_152u32), (8, 49_152), (1, 262_144), (8, 262_144)] {
            let lb = f32_buffer(&ctx, &normals(&mut rng, (n_rows * vocab) as usize, 3.0));
            let ob = ctx.storage_zeroed("out", n_rows as u64 * 4);
            let mut line = format!("argmax {n_rows} x {vocab}:");
            let plans = [ArgmaxPlan::TwoPasses, ArgmaxPlan::OneDispatch(64), ArgmaxPlan::OneDispatch(256)];
            let kernels: Vec<Vec<Kernel>> = plans.iter().map(|&p| argmax::argmax_with(&ctx, (&lb, &ob), n_rows, vocab, p).unwrap()).collect();
            let mut best = [f64::INFINITY; 3];
            for _ in 0..7 {
                for (k, b) in kernels.iter().zip(best.iter_mut()) {
                    let t0 = common::now_ms();
                    let mut rec = pagedlm::gpu::Recorder::new(&ctx, "time");
                    for _ in 0..20 {
                        rec.dispatch_all(k);
                    }
                    rec.submit();
                    ctx.read_u32(&ob, 0, 1).await.unwrap();
                    *b = b.min((common::now_ms() - t0) * 1e3 / 20.0);
                }
            }
            for (p, b) in plans.iter().zip(best) {
                line += &format!("  {p:?} {b:.1} µs");
            }
            common::report(&line);
        }
    })
}

gpu_test! {
    async fn argmax_rejects_bad_shapes() {
        let ctx = gpu().await;
        let logits = ctx.storage_zeroed("logits", 2 * 1000 * 4);
        let out = ctx.storage_zeroed("out", 4);
        expect_shape_err(argmax::argmax(&ctx, &logits, &out, 2, 1000), "out needs 8 bytes");
        expect_shape_err(argmax::argmax(&ctx, &logits, &out, 1, 2001), "logits needs");
        expect_shape_err(argmax::argmax(&ctx, &logits, &out, 1, 0), "at least 1");
        expect_shape_err(argmax::argmax(&ctx, &logits, &logits, 1, 10), "different buffer");
    }
}

// ---------------------------------------------------------------- kv_write

struct KvCase {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    /// The sequence's capacity: the table row maps ceil(max_len / block_size) blocks.
    max_len: u32,
    block_size: u32,
}

/// Writes random qkv rows into pools pre-filled with random values (slack past the pool's end
/// included), through a shuffled block table whose row starts at a table_base > 0, and checks
/// every pool element against the CPU reference, exactly. `table_tail` entries follow the row
/// (0: the table ends with the row, so positions past the capacity find no entry).
async fn check_kv_write(ctx: &Context, rng: &mut Rng, case: &KvCase, positions: &[u32], table_tail: usize) {
    let n_tokens = positions.len();
    let (nh, nkv, hd, bs) = (case.n_heads as usize, case.n_kv as usize, case.head_dim as usize, case.block_size as usize);
    let row_blocks = case.max_len.div_ceil(case.block_size) as usize;
    let n_blocks = row_blocks + 2;
    let mut perm: Vec<u32> = (0..n_blocks as u32).collect();
    for i in (1..n_blocks).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    if perm[..row_blocks].iter().enumerate().all(|(i, &b)| b == i as u32) {
        perm.rotate_left(1);
    }
    let table_base = 1 + rng.below(5) as u32;
    // Entries of other sequences around the row, and one that maps past the pool.
    let mut table: Vec<u32> = (0..table_base).map(|_| rng.below(n_blocks as u64) as u32).collect();
    table.extend_from_slice(&perm[..row_blocks]);
    table.extend((0..table_tail).map(|i| if i == 0 { n_blocks as u32 + 3 } else { rng.below(n_blocks as u64) as u32 }));

    let row = (nh + 2 * nkv) * hd;
    let slack = 37;
    let pool_len = n_blocks * nkv * bs * hd + slack;
    let qkv = rng.vec_uniform(n_tokens * row, -1.0, 1.0);
    let k0 = rng.vec_uniform(pool_len, 5.0, 6.0);
    let v0 = rng.vec_uniform(pool_len, 7.0, 8.0);
    let (qb, kb, vb, pb) = (f32_buffer(ctx, &qkv), f32_buffer(ctx, &k0), f32_buffer(ctx, &v0), u32_buffer(ctx, positions));
    let tb = u32_buffer(ctx, &table);
    let step = u32_buffer(ctx, &vec![table_base; n_tokens]);
    let pool = PoolShape {
        n_heads: case.n_heads,
        n_kv_heads: case.n_kv,
        head_dim: case.head_dim,
        max_len: case.max_len,
        block_size: case.block_size,
        n_blocks: n_blocks as u32,
        dtype: KvDtype::F32,
        window: 0,
        softcap: 0.0,
    };
    let buffers = KvWriteBuffers { qkv: &qb, pool: PoolBuffers { k: &kb, v: &vb, block_table: &tb }, positions: &pb, row_tables: &step };
    let kernel = kv_write::write_paged(ctx, &buffers, &pool, n_tokens as u32).unwrap();
    run(ctx, &[&kernel]);
    let got_k = ctx.read_f32(&kb, 0, pool_len as u64).await.unwrap();
    let got_v = ctx.read_f32(&vb, 0, pool_len as u64).await.unwrap();
    let (mut want_k, mut want_v) = (k0.clone(), v0);
    kv_write::write_paged_cpu(&pool, &qkv, &mut want_k, &mut want_v, positions, &table, table_base);
    let what = format!("kv_write h{nh} kv{nkv} hd{hd} block {bs} table {table:?} at {positions:?}");
    assert!(want_k != k0, "{what}: the case writes nothing");
    assert_eq!(got_k, want_k, "{what}: k pool");
    assert_eq!(got_v, want_v, "{what}: v pool");
}

gpu_test! {
    async fn kv_write_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(51);
        // Block sizes 1, 16, 32, 64 and max_len (the contiguous cache: one block).
        for block_size in [1u32, 16, 32, 64, 256] {
            let smollm2 = KvCase { n_heads: 9, n_kv: 3, head_dim: 64, max_len: 256, block_size };
            check_kv_write(&ctx, &mut rng, &smollm2, &[0], 2).await;
            check_kv_write(&ctx, &mut rng, &smollm2, &[255], 2).await;
            for len in [1u32, 15, 16, 17, 33, 100] {
                // A decode token at the end of a `len`-token sequence, and a prefill after history.
                check_kv_write(&ctx, &mut rng, &smollm2, &[len - 1], 2).await;
                check_kv_write(&ctx, &mut rng, &smollm2, &(len..len + 20).collect::<Vec<_>>(), 2).await;
            }
            // Past the row: the first entry after it maps past the pool, then the table ends.
            let past = [254, 255, 255 + block_size, 255 + 2 * block_size, 256 + 3 * block_size, u32::MAX, 3];
            check_kv_write(&ctx, &mut rng, &smollm2, &past, 1).await;
            check_kv_write(&ctx, &mut rng, &smollm2, &past, 0).await;
        }
        let cases = [
            KvCase { n_heads: 4, n_kv: 4, head_dim: 16, max_len: 10, block_size: 4 }, // MHA
            KvCase { n_heads: 8, n_kv: 1, head_dim: 32, max_len: 9, block_size: 2 },  // MQA
            KvCase { n_heads: 2, n_kv: 1, head_dim: 6, max_len: 5, block_size: 3 },   // head_dim not a multiple of 4
            KvCase { n_heads: 1, n_kv: 1, head_dim: 2, max_len: 1, block_size: 1 },
        ];
        for case in &cases {
            // Two rows never write one position (a step's rows are distinct tokens): on a real
            // GPU the order of two writers is undefined, so the test must not give it one.
            let mut positions = vec![case.max_len - 1, 0, case.max_len];
            positions.dedup();
            check_kv_write(&ctx, &mut rng, case, &positions, 0).await;
        }
    }
}

gpu_test! {
    async fn kv_write_rejects_bad_shapes() {
        let ctx = gpu().await;
        let qkv = ctx.storage_zeroed("qkv", 2 * 15 * 64 * 4);
        // 4 blocks of 25 keys.
        let k = ctx.storage_zeroed("k", 3 * 100 * 64 * 4);
        let v = ctx.storage_zeroed("v", 3 * 100 * 64 * 4);
        let p = ctx.storage_zeroed("p", 8);
        let t = ctx.storage_zeroed("t", 16);
        let st = ctx.storage_zeroed("row_tables", 8);
        let w = |k: &wgpu::Buffer, v: &wgpu::Buffer, n_tokens, n_kv_heads, block_size, n_blocks| {
            let pool = PoolShape { n_heads: 9, n_kv_heads, head_dim: 64, max_len: 100, block_size, n_blocks, dtype: KvDtype::F32, window: 0, softcap: 0.0 };
            let buffers = KvWriteBuffers { qkv: &qkv, pool: PoolBuffers { k, v, block_table: &t }, positions: &p, row_tables: &st };
            kv_write::write_paged(&ctx, &buffers, &pool, n_tokens)
        };
        assert!(w(&k, &v, 2, 3, 25, 4).is_ok());
        expect_shape_err(w(&k, &v, 2, 3, 25, 5), "k_pool needs");
        expect_shape_err(w(&k, &v, 2, 3, 26, 4), "k_pool needs");
        expect_shape_err(w(&k, &v, 3, 3, 25, 4), "qkv needs");
        expect_shape_err(w(&k, &k, 2, 3, 25, 4), "different buffers");
        expect_shape_err(w(&k, &v, 2, 0, 25, 4), "at least 1");
        expect_shape_err(w(&k, &v, 2, 3, 0, 4), "at least 1");
        expect_shape_err(w(&k, &v, 2, 3, 25, 0), "at least 1");
    }
}

gpu_test!(
    async fn adapter_class_and_optional_features_follow_the_options() {
        use pagedlm::gpu::{AdapterClass, ContextOptions};
        let own = gpu().await;
        for class in [AdapterClass::Cpu, AdapterClass::Integrated, AdapterClass::Discrete] {
            let ctx = common::gpu_with(ContextOptions { class: Some(class), ..Default::default() }).await;
            assert_eq!(ctx.class(), class);
            assert_eq!(ctx.is_cpu(), class == AdapterClass::Cpu);
            assert!(ctx.variant_name().starts_with(class.name()), "{}", ctx.variant_name());
            // The features requested are those the adapter offers, whatever the class.
            assert_eq!(ctx.has_f16(), own.has_f16());
            assert_eq!(ctx.has_subgroups(1), own.has_subgroups(1));
            let plain = common::gpu_with(ContextOptions { class: Some(class), optional_features: false, ..Default::default() }).await;
            assert!(!plain.has_f16() && !plain.has_subgroups(1), "{}", plain.variant_name());
            assert_eq!(plain.variant_name(), class.name());
        }
        assert_eq!(own.class(), AdapterClass::of(own.info.device_type));
        assert_eq!(common::variant_contexts().await.len(), if own.has_f16() || own.has_subgroups(1) { 6 } else { 3 });
    }
);

/// Lets a destroyed device report its loss: natively the next poll runs the device-lost
/// callback; in the browser the `lost` promise resolves in a later task.
async fn settle(ctx: &Context) {
    #[cfg(not(target_arch = "wasm32"))]
    let _ = ctx.device.poll(wgpu::PollType::Poll);
    #[cfg(target_arch = "wasm32")]
    {
        let _ = ctx;
        for _ in 0..3 {
            let tick = js_sys::Promise::new(&mut |resolve, _| {
                web_sys::window().expect("a window").set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, 10).expect("setTimeout");
            });
            wasm_bindgen_futures::JsFuture::from(tick).await.expect("timer");
        }
    }
}

gpu_test!(
    async fn shared_contexts_follow_the_options_and_leave_when_lost() {
        use pagedlm::gpu::ContextOptions;
        use std::sync::Arc;
        // Options no other test asks for, so that destroying this device touches no other test.
        let options = ContextOptions { max_storage_binding: Some(96 << 20), ..Default::default() };
        let first = Context::shared(options.clone()).await.unwrap();
        let again = Context::shared(options.clone()).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the same options share one context");
        let other = Context::shared(ContextOptions { int8_activations: Some(true), ..options.clone() }).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &other), "other options get a context of their own");
        assert_eq!(other.int8_activations, Some(true));
        assert_eq!(first.limits.max_storage_buffer_binding_size as u64, 96 << 20);

        // A pipeline compiled on the shared context is there for the next caller.
        let compiled = first.pipeline_count();
        let gu = f32_buffer(&again, &[1.0; 8]);
        let out = again.storage_zeroed("out", 16);
        run(&again, &[&act::glu(&again, (&gu, &out), 1, 4, Activation::Silu).unwrap()]);
        assert_eq!(first.pipeline_count(), compiled + 1);
        assert_close(
            "glu on the shared context",
            &again.read_f32(&out, 0, 4).await.unwrap(),
            &act::glu_cpu(&[1.0; 8], 1, 4, Activation::Silu),
            SILU_ABS_TOL,
            SILU_REL_TOL,
        );

        assert!(!first.is_lost());
        first.device.destroy();
        settle(&first).await;
        assert!(first.is_lost(), "a destroyed device reports its loss");
        let fresh = Context::shared(options).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &fresh) && !fresh.is_lost(), "a lost context leaves the registry");
        assert_eq!(fresh.pipeline_count(), 0);
    }
);
