//! GPU sampling (`gpu::ops::sample`) against its CPU reference (`sample_cpu`, i.e.
//! `sampler::sample_row`) and against the properties of the definition, natively (lavapipe) and
//! in the browser (SwiftShader).
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{gpu, now_ms, report};
use pagedlm::gpu::ops::argmax::argmax_cpu;
use pagedlm::gpu::ops::sample::{sample, SampleBuffers};
use pagedlm::gpu::{Context, GpuError, Kernel, Recorder};
use pagedlm::rng::Rng;
use pagedlm::sampler::{order_key, SamplingParams};
use pagedlm::sampler::{sample_cpu, HistoryRing, RowParams, SampleShape};

const SMOLLM_VOCAB: u32 = 49_152;
const GEMMA_VOCAB: u32 = 262_144;
/// Sentinel in out slots no row writes.
const UNTOUCHED: u32 = 0xDEAD_BEEF;

/// One sampling op with its buffers, built once and run for any number of steps.
struct Sampling {
    shape: SampleShape,
    logits: wgpu::Buffer,
    params: wgpu::Buffer,
    history: wgpu::Buffer,
    out: wgpu::Buffer,
    mask: wgpu::Buffer,
    kernels: Vec<Kernel>,
}

impl Sampling {
    fn new(ctx: &Context, shape: SampleShape) -> Sampling {
        let n = shape.n_rows as u64;
        let logits = ctx.storage_zeroed("logits", n * shape.vocab as u64 * 4);
        let params = ctx.storage_zeroed("params", n * 64);
        let history = ctx.storage_zeroed("history", (n * shape.history_capacity as u64 * 4).max(4));
        let out_len = shape.out_offset as u64 + (n - 1) * shape.out_stride as u64 + 1;
        let out = ctx.storage_init("out", bytemuck::cast_slice(&vec![UNTOUCHED; out_len as usize]));
        let mask = ctx.storage_zeroed("mask", n * shape.vocab.div_ceil(32) as u64 * 4);
        let buffers = SampleBuffers { logits: &logits, params: &params, history: &history, out: &out, mask: &mask };
        let kernels = sample(ctx, buffers, shape).unwrap();
        Sampling { shape, logits, params, history, out, mask, kernels }
    }

    /// One step: writes the inputs, records every kernel in one submission, reads `out` back.
    async fn step(&self, ctx: &Context, logits: &[f32], params: &[RowParams], history: &[u32]) -> Vec<u32> {
        ctx.queue.write_buffer(&self.logits, 0, bytemuck::cast_slice(logits));
        ctx.queue.write_buffer(&self.params, 0, bytemuck::cast_slice(params));
        if !history.is_empty() {
            ctx.queue.write_buffer(&self.history, 0, bytemuck::cast_slice(history));
        }
        let mut rec = Recorder::new(ctx, "sample test");
        pagedlm::gpu::ops::sample::kernels_for(&self.kernels, params).for_each(|k| rec.dispatch(k));
        rec.submit();
        ctx.read_u32(&self.out, 0, self.out.size() / 4).await.unwrap()
    }

    /// Row r's token in a read-back `out`.
    fn token(&self, out: &[u32], r: usize) -> u32 {
        out[self.shape.out_offset as usize + r * self.shape.out_stride as usize]
    }
}

fn shape(n_rows: u32, vocab: u32, history_capacity: u32) -> SampleShape {
    SampleShape { n_rows, vocab, history_capacity, n_rings: n_rows, out_offset: 0, out_stride: 1 }
}

fn sampling(temperature: f32, top_k: u32, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, seed, ..Default::default() }
}

fn row(p: &SamplingParams, counter: u32) -> RowParams {
    RowParams::new(p, counter, HistoryRing::default()).unwrap()
}

fn normals(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

/// Runs one step and the CPU reference on the same inputs; returns (gpu, cpu) tokens of the
/// active rows, and checks the penalized logits and the rings (appended to) are the reference's.
/// `mask` ([n_rows, ceil(vocab / 32)] words) is written first unless empty.
async fn gpu_and_cpu(ctx: &Context, op: &Sampling, logits: &[f32], params: &[RowParams], history: &[u32], mask: &[u32]) -> (Vec<u32>, Vec<u32>) {
    if !mask.is_empty() {
        ctx.queue.write_buffer(&op.mask, 0, bytemuck::cast_slice(mask));
    }
    let out = op.step(ctx, logits, params, history).await;
    let mut penalized = logits.to_vec();
    let mut rings = history.to_vec();
    let want = sample_cpu(&mut penalized, params, &mut rings, mask, &op.shape);
    let got_logits = ctx.read_f32(&op.logits, 0, logits.len() as u64).await.unwrap();
    for (i, (g, w)) in got_logits.iter().zip(&penalized).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "penalized logit {i}: GPU {g} vs CPU {w}");
    }
    if !history.is_empty() {
        assert_eq!(ctx.read_u32(&op.history, 0, history.len() as u64).await.unwrap(), rings, "history rings after the step");
    }
    let mut gpu_tokens = Vec::new();
    let mut cpu_tokens = Vec::new();
    for (r, w) in want.iter().enumerate() {
        match w {
            Some(t) => {
                gpu_tokens.push(op.token(&out, r));
                cpu_tokens.push(*t);
            }
            None => assert_eq!(op.token(&out, r), UNTOUCHED, "inactive row {r} wrote its out slot"),
        }
    }
    (gpu_tokens, cpu_tokens)
}

/// The tokens in ranking order (key descending, id ascending), NaNs left out.
fn ranking(row: &[f32]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32).filter(|&i| !row[i as usize].is_nan()).collect();
    ids.sort_by(|&a, &b| order_key(row[b as usize]).cmp(&order_key(row[a as usize])).then(a.cmp(&b)));
    ids
}

/// Softmax probabilities (f64) of `row` at `temperature`, NaNs at 0.
fn softmax(row: &[f32], temperature: f64) -> Vec<f64> {
    let max = row.iter().filter(|v| !v.is_nan()).fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let e: Vec<f64> = row.iter().map(|&v| if v.is_nan() { 0.0 } else { ((v as f64 - max) / temperature).exp() }).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

fn expect_shape_err(result: Result<Vec<Kernel>, GpuError>, needle: &str) {
    match result {
        Ok(_) => panic!("expected a shape error mentioning {needle:?}, the launcher accepted the input"),
        Err(e @ GpuError::Shape { .. }) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
        Err(e) => panic!("expected a shape error, got {e}"),
    }
}

gpu_test! {
    async fn greedy_is_the_argmax_with_nans_ties_and_infinities() {
        let ctx = gpu().await;
        let mut rng = Rng::new(1);
        let vocab = SMOLLM_VOCAB as usize;
        let base = |rng: &mut Rng| rng.vec_uniform(vocab, -10.0, 10.0);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        let mut ties = base(&mut rng);
        for i in [40_000, 777, 777 + 256, 30_001] {
            ties[i] = 12.0;
        }
        rows.push(ties);
        let mut nans = base(&mut rng);
        for i in (0..vocab).step_by(97) {
            nans[i] = f32::NAN;
        }
        nans[12_345] = 10.5;
        rows.push(nans);
        rows.push(vec![f32::NAN; vocab]);
        let mut ninf = vec![f32::NEG_INFINITY; vocab];
        ninf[0] = f32::NAN;
        rows.push(ninf);
        let mut pinf = base(&mut rng);
        pinf[20_000] = f32::INFINITY;
        pinf[40_000] = f32::INFINITY;
        rows.push(pinf);
        rows.push(vec![0.5; vocab]);
        rows.push(base(&mut rng));
        let n = rows.len();
        let logits: Vec<f32> = rows.concat();
        let op = Sampling::new(&ctx, shape(n as u32, vocab as u32, 0));
        let params = vec![row(&SamplingParams::greedy(), 0); n];
        let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &[], &[]).await;
        assert_eq!(got, want, "greedy against the CPU definition");
        assert_eq!(got, argmax_cpu(&logits, n, vocab), "greedy against argmax_cpu");
        // Known by construction: the lowest tied id, the planted maximum, 0 for all NaN, the first
        // -inf after a NaN, the first +inf, 0 for all equal.
        assert_eq!(&got[..6], &[777, 12_345, 0, 1, 20_000, 0]);
        // Sampling rows whose maximum is infinite draw among the infinite ones only.
        let hot = sampling(2.0, 0, 1.0, 5);
        let params: Vec<RowParams> = (0..n as u32).map(|c| row(&hot, c)).collect();
        let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &[], &[]).await;
        assert_eq!(got, want, "sampling with NaNs and infinities against the CPU definition");
        assert_eq!(got[2], 0, "a row of NaNs gives 0");
        assert!(got[3] >= 1, "NaN is never drawn");
        assert!(got[4] == 20_000 || got[4] == 40_000, "only +inf tokens are drawn under a +inf maximum, got {}", got[4]);
        for (r, &t) in got.iter().enumerate() {
            assert!(!rows[r][t as usize].is_nan() || r == 2, "row {r} drew a NaN");
        }
    }
}

gpu_test! {
    async fn repetition_penalty_applies_once_per_distinct_window_token() {
        let ctx = gpu().await;
        let mut rng = Rng::new(2);
        let (vocab, cap) = (1000u32, 16u32);
        let n = 4usize;
        let logits: Vec<f32> = normals(&mut rng, n * vocab as usize, 2.0);
        // Row 0: repeats, a token past the vocabulary, the ring wrapped (head mid-way, full).
        // Row 1: a window shorter than the ring's contents. Row 2: an empty ring. Row 3: the
        // penalty off (the logits must stay untouched).
        let mut history = vec![0u32; n * cap as usize];
        let top0 = ranking(&logits[..vocab as usize])[0];
        let ring0 = [top0, 5, 5, top0, 999, 4000, 7, 7, 7, 1, 2, 3, top0, 8, 9, 10];
        history[..16].copy_from_slice(&ring0);
        for (i, h) in history[16..32].iter_mut().enumerate() {
            *h = (i * 37 % vocab as usize) as u32;
        }
        let penalized = |window| SamplingParams { repetition_penalty: 1.7, repetition_window: window, ..Default::default() };
        let params = vec![
            RowParams::new(&penalized(64), 0, HistoryRing { head: 5, len: 16, ring: 0 }).unwrap(),
            RowParams::new(&SamplingParams { temperature: 0.8, seed: 3, ..penalized(6) }, 9, HistoryRing { head: 11, len: 14, ring: 1 }).unwrap(),
            RowParams::new(&penalized(64), 0, HistoryRing { head: 0, len: 0, ring: 2 }).unwrap(),
            RowParams::new(&SamplingParams { repetition_penalty: 1.0, ..penalized(64) }, 0, HistoryRing { head: 3, len: 16, ring: 3 }).unwrap(),
        ];
        let op = Sampling::new(&ctx, shape(n as u32, vocab, cap));
        let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &history, &[]).await;
        assert_eq!(got, want);
        // The reference itself, on row 0: each distinct token scaled once, the ones outside untouched.
        let mut penalized_row = logits[..vocab as usize].to_vec();
        sample_cpu(&mut penalized_row, &params[..1], &mut history[..16].to_vec(), &[], &shape(1, vocab, cap));
        for t in 0..vocab as usize {
            let (before, after) = (logits[t], penalized_row[t]);
            let expected = if ring0.contains(&(t as u32)) { if before > 0.0 { before * (1.0 / 1.7) } else { before * 1.7 } } else { before };
            assert_eq!(after, expected, "token {t}");
        }
        assert_ne!(got[0], top0, "the penalized maximum still won");
    }
}

gpu_test! {
    async fn top_k_one_is_greedy_and_sets_are_respected() {
        let ctx = gpu().await;
        let mut rng = Rng::new(3);
        let (n, vocab) = (64usize, 4096u32);
        let logits: Vec<f32> = (0..n).flat_map(|_| normals(&mut rng, vocab as usize, 2.0)).collect();
        let op = Sampling::new(&ctx, shape(n as u32, vocab, 0));
        let greedy = argmax_cpu(&logits, n, vocab as usize);
        // top_k = 1 at a high temperature, every row at its own counter.
        let params: Vec<RowParams> = (0..n as u32).map(|c| row(&sampling(3.0, 1, 1.0, 11), c)).collect();
        let out = op.step(&ctx, &logits, &params, &[]).await;
        assert_eq!((0..n).map(|r| op.token(&out, r)).collect::<Vec<_>>(), greedy, "top-k 1 is greedy");
        // top-k 5 and top-p 0.5 at a flat temperature: every row, 8 counters each.
        for counter_base in 0..8u32 {
            let params: Vec<RowParams> = (0..n as u32)
                .map(|r| row(&if r % 2 == 0 { sampling(4.0, 5, 1.0, 12) } else { sampling(1.5, 0, 0.5, 13) }, counter_base * 100 + r))
                .collect();
            let out = op.step(&ctx, &logits, &params, &[]).await;
            for r in 0..n {
                let t = op.token(&out, r);
                let values = &logits[r * vocab as usize..(r + 1) * vocab as usize];
                let ranked = ranking(values);
                if r % 2 == 0 {
                    assert!(ranked[..5].contains(&t), "row {r}: token {t} is outside the top 5");
                } else {
                    // The nucleus of 0.5, widened by 1e-5 of probability for rounding.
                    let p = softmax(values, 1.5);
                    let mut cum = 0.0;
                    let allowed: Vec<u32> = ranked.iter().copied().take_while(|&i| { let inside = cum < 0.5 + 1e-5; cum += p[i as usize]; inside }).collect();
                    assert!(allowed.contains(&t), "row {r}: token {t} is outside the nucleus of {} tokens", allowed.len());
                }
            }
        }
    }
}

gpu_test! {
    async fn draws_are_a_function_of_seed_and_counter() {
        let ctx = gpu().await;
        let mut rng = Rng::new(4);
        let (n, vocab) = (32usize, 2000u32);
        let one_row = normals(&mut rng, vocab as usize, 0.5);
        let logits: Vec<f32> = (0..n).flat_map(|_| one_row.iter().copied()).collect();
        let op = Sampling::new(&ctx, shape(n as u32, vocab, 0));
        let p = sampling(1.0, 0, 0.95, 77);
        // Rows 0..16 at counters 0..16, rows 16..32 at the same counters in reverse.
        let params: Vec<RowParams> = (0..n as u32).map(|r| row(&p, if r < 16 { r } else { 31 - r })).collect();
        let first = op.step(&ctx, &logits, &params, &[]).await;
        let again = op.step(&ctx, &logits, &params, &[]).await;
        assert_eq!(first, again, "the same inputs must give the same tokens");
        for r in 0..16 {
            assert_eq!(first[r], first[31 - r], "rows {r} and {} share seed and counter", 31 - r);
        }
        let distinct: std::collections::BTreeSet<u32> = first[..16].iter().copied().collect();
        assert!(distinct.len() >= 8, "16 counters on a flat row gave only {} distinct tokens", distinct.len());
        let other_seed: Vec<RowParams> = (0..n as u32).map(|r| row(&SamplingParams { seed: 78, ..p.clone() }, r % 16)).collect();
        let other = op.step(&ctx, &logits, &other_seed, &[]).await;
        assert_ne!(&other[..16], &first[..16], "another seed must give other draws");
    }
}

gpu_test! {
    async fn frequencies_follow_the_softmax() {
        let ctx = gpu().await;
        // A small vocabulary, 4096 draws (one row per counter) per case.
        let logits_row = [1.0f32, 0.0, 2.0, -1.0, 0.5, 1.5, -3.0, 0.25];
        let n = 4096usize;
        let logits: Vec<f32> = (0..n).flat_map(|_| logits_row).collect();
        let op = Sampling::new(&ctx, shape(n as u32, logits_row.len() as u32, 0));
        for (temperature, top_k) in [(1.0f32, 0u32), (0.7, 0), (1.3, 4)] {
            let p = sampling(temperature, top_k, 1.0, 21);
            let params: Vec<RowParams> = (0..n as u32).map(|c| row(&p, c)).collect();
            let out = op.step(&ctx, &logits, &params, &[]).await;
            let mut probs = softmax(&logits_row, temperature as f64);
            if top_k > 0 {
                let kept = &ranking(&logits_row)[..top_k as usize];
                for (i, q) in probs.iter_mut().enumerate() {
                    if !kept.contains(&(i as u32)) {
                        *q = 0.0;
                    }
                }
                let z: f64 = probs.iter().sum();
                probs.iter_mut().for_each(|q| *q /= z);
            }
            for (t, &q) in probs.iter().enumerate() {
                let freq = out[..n].iter().filter(|&&x| x == t as u32).count() as f64 / n as f64;
                // 4.5 standard deviations of a frequency over 4096 draws (at most 0.035).
                let bound = 4.5 * (q * (1.0 - q) / n as f64).sqrt() + 1e-9;
                assert!((freq - q).abs() <= bound, "T={temperature} k={top_k} token {t}: frequency {freq:.4} vs probability {q:.4} (bound {bound:.4})");
            }
        }
    }
}

/// Random rows of several kinds and parameters; GPU and CPU must agree except where a
/// cumulative weight straddles a target within exp's rounding: at most 1 row in 64 (0 expected).
async fn agreement(ctx: &Context, vocab: u32, n: usize, seed: u64) -> (usize, usize) {
    let mut rng = Rng::new(seed);
    let settings = [
        sampling(1.0, 0, 1.0, 1),
        sampling(0.7, 40, 0.9, 2),
        sampling(1.3, 0, 0.6, 3),
        sampling(1.0, 1000, 1.0, 4),
        SamplingParams { repetition_penalty: 1.3, ..sampling(0.9, 50, 0.95, 5) },
        sampling(0.0, 0, 1.0, 6),
        sampling(2.5, 20_000, 0.99, 7),
        sampling(0.4, 0, 0.999, 8),
    ];
    let cap = 64u32;
    let logits: Vec<f32> = (0..n).flat_map(|r| normals(&mut rng, vocab as usize, [3.0, 1.0, 6.0][r % 3])).collect();
    let history: Vec<u32> = (0..n * cap as usize).map(|_| rng.below(vocab as u64) as u32).collect();
    let params: Vec<RowParams> = (0..n)
        .map(|r| RowParams::new(&settings[r % settings.len()], 1000 + r as u32, HistoryRing { head: r as u32 % cap, len: cap, ring: r as u32 }).unwrap())
        .collect();
    let op = Sampling::new(ctx, shape(n as u32, vocab, cap));
    let (got, want) = gpu_and_cpu(ctx, &op, &logits, &params, &history, &[]).await;
    let mismatches = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    (mismatches, got.len())
}

gpu_test! {
    async fn gpu_agrees_with_cpu_on_random_rows() {
        let ctx = gpu().await;
        let (bad, rows) = agreement(&ctx, SMOLLM_VOCAB, 32, 5).await;
        report(&format!("sample: GPU vs CPU at vocab {SMOLLM_VOCAB}: {bad} of {rows} rows differ"));
        assert!(bad * 64 <= rows, "{bad} of {rows} rows differ");
        let (bad, rows) = agreement(&ctx, GEMMA_VOCAB, 4, 6).await;
        report(&format!("sample: GPU vs CPU at vocab {GEMMA_VOCAB}: {bad} of {rows} rows differ"));
        assert_eq!(bad, 0, "vocab {GEMMA_VOCAB}: {bad} of {rows} rows differ");
    }
}

gpu_test! {
    async fn gpu_equals_cpu_without_near_ties() {
        let ctx = gpu().await;
        let mut rng = Rng::new(7);
        let vocab = SMOLLM_VOCAB as usize;
        let n = 8usize;
        let mut rows = Vec::new();
        // A few well-separated tokens above a floor no draw reaches.
        for r in 0..3 {
            let mut v = vec![-60.0f32; vocab];
            for j in 0..6 {
                v[(r * 977 + j * 7919) % vocab] = 8.0 - j as f32;
            }
            rows.push(v);
        }
        // Every token tied (weights exactly equal: resolved by id, more than CAP of them).
        rows.push(vec![1.25; vocab]);
        // Ties in groups (logits on a grid of 1/8): buckets of one key with thousands of members.
        rows.push((0..vocab).map(|_| (rng.normal() * 8.0).round() / 8.0).collect());
        rows.push((0..vocab).map(|_| (rng.normal() * 2.0).round()).collect());
        // bf16-rounded logits.
        rows.push((0..vocab).map(|_| f32::from_bits((rng.normal() * 3.0).to_bits() & 0xffff_0000)).collect());
        rows.push(vec![-2.0; vocab]);
        let logits: Vec<f32> = rows.concat();
        let op = Sampling::new(&ctx, shape(n as u32, vocab as u32, 0));
        for (step, p) in [sampling(1.0, 0, 1.0, 31), sampling(0.8, 3000, 1.0, 32), sampling(1.2, 0, 0.3, 33), sampling(1.0, 30_000, 0.9, 34)].iter().enumerate() {
            let params: Vec<RowParams> = (0..n as u32).map(|r| row(p, r * 13 + step as u32)).collect();
            let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &[], &[]).await;
            // Equal weights tie exactly (exp is not involved), and separated rows leave no near-ties.
            for r in [0usize, 1, 2, 3, 7] {
                assert_eq!(got[r], want[r], "{p:?} row {r}");
            }
            let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert!(bad <= 1, "{p:?}: {bad} of {n} rows differ: {got:?} vs {want:?}");
        }
    }
}

gpu_test! {
    async fn rows_with_different_params_share_one_dispatch() {
        let ctx = gpu().await;
        let mut rng = Rng::new(8);
        let (n, vocab, cap) = (6usize, 3000u32, 8u32);
        let logits: Vec<f32> = normals(&mut rng, n * vocab as usize, 2.0);
        let history: Vec<u32> = (0..n * cap as usize).map(|_| rng.below(vocab as u64) as u32).collect();
        // Rings in reverse row order: a row reads and appends to the ring it names, not its own.
        let ring = |row: u32| HistoryRing { head: 2, len: 8, ring: n as u32 - 1 - row };
        let appending = |p: RowParams| RowParams { flags: p.flags | RowParams::APPEND_HISTORY, ..p };
        let params = vec![
            RowParams::new(&SamplingParams::greedy(), 0, ring(0)).unwrap(),
            appending(RowParams::new(&sampling(1.0, 0, 1.0, 1), 10, ring(1)).unwrap()),
            RowParams::INACTIVE,
            RowParams::new(&SamplingParams { repetition_penalty: 1.5, ..sampling(0.8, 10, 0.9, 2) }, 11, ring(3)).unwrap(),
            appending(RowParams::new(&SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() }, 12, ring(4)).unwrap()),
            RowParams::new(&sampling(0.5, 2, 0.5, 3), 13, ring(5)).unwrap(),
        ];
        // Tokens land at 3, 5, 7, ...: the slots between stay untouched.
        let op = Sampling::new(&ctx, SampleShape { n_rows: n as u32, vocab, history_capacity: cap, n_rings: n as u32, out_offset: 3, out_stride: 2 });
        let out = op.step(&ctx, &logits, &params, &history).await;
        let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &history, &[]).await;
        assert_eq!(got, want);
        assert_eq!(op.token(&out, 0), argmax_cpu(&logits[..vocab as usize], 1, vocab as usize)[0]);
        for (i, &v) in out.iter().enumerate() {
            let written = i >= 3 && (i - 3) % 2 == 0 && (i - 3) / 2 != 2;
            assert_eq!(v == UNTOUCHED, !written, "out slot {i} = {v:#x}");
        }
        // Rows 1 and 4 appended their token at their ring's head; the others left their rings.
        let rings = ctx.read_u32(&op.history, 0, history.len() as u64).await.unwrap();
        for r in 0..n {
            let slot = (n - 1 - r) * cap as usize + 2;
            let want = if r == 1 || r == 4 { op.token(&out, r) } else { history[slot] };
            assert_eq!(rings[slot], want, "row {r}'s ring head");
        }
    }
}

gpu_test! {
    async fn bad_shapes_are_refused() {
        let ctx = gpu().await;
        let logits = ctx.storage_zeroed("logits", 2 * 1000 * 4);
        let params = ctx.storage_zeroed("params", 2 * 64);
        let history = ctx.storage_zeroed("history", 2 * 8 * 4);
        let out = ctx.storage_zeroed("out", 2 * 4);
        let mask = ctx.storage_zeroed("mask", 2 * 1000_u64.div_ceil(32) * 4);
        let buffers = || SampleBuffers { logits: &logits, params: &params, history: &history, out: &out, mask: &mask };
        let ok = shape(2, 1000, 8);
        assert!(sample(&ctx, buffers(), ok).is_ok());
        expect_shape_err(sample(&ctx, buffers(), SampleShape { vocab: 0, ..ok }), "at least 1");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { n_rows: 0, ..ok }), "at least 1");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { vocab: 1001, ..ok }), "logits needs");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { n_rows: 3, ..ok }), "logits needs");
        // Rows whose scratch no binding limit allows (9 GB), before any buffer is looked at.
        expect_shape_err(sample(&ctx, buffers(), SampleShape { n_rows: 1_000_000, ..ok }), "the scratch of 1000000 rows");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { history_capacity: 9, ..ok }), "history needs");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { out_offset: 1, ..ok }), "out needs");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { out_stride: 2, ..ok }), "out needs");
        expect_shape_err(sample(&ctx, buffers(), SampleShape { out_stride: 0, ..ok }), "out_stride 0");
        let small_params = ctx.storage_zeroed("params", 64);
        expect_shape_err(sample(&ctx, SampleBuffers { params: &small_params, ..buffers() }, ok), "params needs");
        expect_shape_err(sample(&ctx, SampleBuffers { out: &logits, ..buffers() }, ok), "different buffers");
        expect_shape_err(sample(&ctx, SampleBuffers { history: &logits, ..buffers() }, ok), "different buffers");
        expect_shape_err(sample(&ctx, SampleBuffers { out: &history, ..buffers() }, ok), "different buffers");
        expect_shape_err(sample(&ctx, SampleBuffers { mask: &logits, ..buffers() }, ok), "different buffers");
        let small_mask = ctx.storage_zeroed("mask", 2 * 31 * 4);
        expect_shape_err(sample(&ctx, SampleBuffers { mask: &small_mask, ..buffers() }, ok), "mask needs");
    }
}

gpu_test! {
    // Constrained decoding's masks: a masked row chooses among the tokens its mask allows
    // (greedy, sampled, top-k, penalized with disallowed tokens in its window, one allowed token
    // in the vocabulary's last partial word), exactly as the CPU reference, while an unmasked
    // row in the same dispatch ignores the mask buffer's contents. The last trial's rows are all
    // greedy (two penalized): the step records no search, and chooses the same.
    async fn masked_rows_choose_only_allowed_tokens() {
        let ctx = gpu().await;
        let (n, vocab, cap) = (6u32, 5_003u32, 16u32);
        let words = vocab.div_ceil(32) as usize;
        let op = Sampling::new(&ctx, shape(n, vocab, cap));
        let mut rng = Rng::new(41);
        for trial in 0..4u32 {
            let logits = normals(&mut rng, (n * vocab) as usize, 3.0);
            let mut mask = vec![0u32; n as usize * words];
            for (t, bit) in (0..n as usize * words * 32).map(|b| (b, rng.below(10) == 0)) {
                if bit {
                    mask[t / 32] |= 1 << (t % 32);
                }
            }
            // Row 4: only the vocabulary's last token; row 5 unmasked, its mask words all clear.
            let row_words = |r: usize| r * words..(r + 1) * words;
            mask[row_words(4)].fill(0);
            mask[4 * words + (vocab as usize - 1) / 32] = 1 << ((vocab - 1) % 32);
            mask[row_words(5)].fill(0);
            let history: Vec<u32> = (0..n * cap).map(|_| rng.below(vocab as u64) as u32).collect();
            let ring = |r: u32| HistoryRing { head: 3, len: cap, ring: r };
            let penalized = SamplingParams { repetition_penalty: 1.7, repetition_window: cap, ..sampling(0.9, 0, 1.0, 5) };
            let mut settings = [SamplingParams::greedy(), sampling(1.0, 0, 1.0, 7 + trial as u64), sampling(0.7, 5, 0.9, 9), penalized, sampling(1.0, 0, 1.0, 3), SamplingParams::greedy()];
            let all_greedy = trial == 3;
            if all_greedy {
                let penalized_greedy = SamplingParams { repetition_penalty: 1.7, repetition_window: cap, ..SamplingParams::greedy() };
                settings = [SamplingParams::greedy(), penalized_greedy.clone(), SamplingParams::greedy(), penalized_greedy, SamplingParams::greedy(), SamplingParams::greedy()];
            }
            let params: Vec<RowParams> = settings
                .iter()
                .enumerate()
                .map(|(r, p)| {
                    let mut row = RowParams::new(p, 100 + r as u32, ring(r as u32)).unwrap();
                    if r != 5 {
                        row.flags |= RowParams::MASKED;
                    }
                    row
                })
                .collect();
            let recorded = pagedlm::gpu::ops::sample::kernels_for(&op.kernels, &params).count();
            assert_eq!(recorded < op.kernels.len(), all_greedy, "trial {trial}: {recorded} of {} kernels recorded", op.kernels.len());
            let (got, want) = gpu_and_cpu(&ctx, &op, &logits, &params, &history, &mask).await;
            assert_eq!(got, want, "trial {trial}: GPU tokens vs the CPU reference");
            for (r, &t) in got.iter().enumerate().take(5) {
                assert!(mask[r * words + t as usize / 32] >> (t % 32) & 1 == 1, "trial {trial}: row {r} chose token {t}, which its mask forbids");
            }
            assert_eq!(got[4], vocab - 1, "the one allowed token");
            assert_eq!(got[5], argmax_cpu(&logits[5 * vocab as usize..], 1, vocab as usize)[0], "the unmasked row's argmax");
        }
    }
}

gpu_test! {
    async fn time_per_step() {
        let ctx = gpu().await;
        let mut rng = Rng::new(9);
        report(&format!("sample timing on {} (min and median of 9 steps, each with upload and readback)", ctx.adapter_name()));
        for (vocab, n) in [(SMOLLM_VOCAB, 1usize), (GEMMA_VOCAB, 1), (SMOLLM_VOCAB, 8)] {
            let logits: Vec<f32> = normals(&mut rng, n * vocab as usize, 3.0);
            let op = Sampling::new(&ctx, shape(n as u32, vocab, 64));
            let history: Vec<u32> = (0..n * 64).map(|_| rng.below(vocab as u64) as u32).collect();
            // The greedy baseline: the argmax op alone on the same buffers.
            let argmax_out = ctx.storage_zeroed("argmax out", n as u64 * 4);
            let argmax_kernels = pagedlm::gpu::ops::argmax::argmax(&ctx, &op.logits, &argmax_out, n as u32, vocab).unwrap();
            let mut times = Vec::new();
            for _ in 0..9 {
                let t0 = now_ms();
                ctx.queue.write_buffer(&op.logits, 0, bytemuck::cast_slice(&logits));
                let mut rec = Recorder::new(&ctx, "argmax");
                rec.dispatch_all(&argmax_kernels);
                rec.submit();
                ctx.read_u32(&argmax_out, 0, n as u64).await.unwrap();
                times.push(now_ms() - t0);
            }
            times.sort_by(|a, b| a.total_cmp(b));
            report(&format!("sample vocab {vocab:>7} x {n} rows {:28}: min {:6.2} ms, median {:6.2} ms", "argmax op alone", times[0], times[4]));
            for (what, p) in [
                ("greedy", SamplingParams::greedy()),
                ("T=1", sampling(1.0, 0, 1.0, 1)),
                ("T=0.8 k=40 p=0.95 pen=1.1", SamplingParams { repetition_penalty: 1.1, ..sampling(0.8, 40, 0.95, 2) }),
                ("T=1 p=0.9", sampling(1.0, 0, 0.9, 3)),
            ] {
                let params: Vec<RowParams> = (0..n as u32).map(|r| RowParams::new(&p, r, HistoryRing { head: 0, len: 64, ring: r }).unwrap()).collect();
                let mut times = Vec::new();
                let mut tokens = Vec::new();
                for _ in 0..9 {
                    let t0 = now_ms();
                    tokens = op.step(&ctx, &logits, &params, &history).await;
                    times.push(now_ms() - t0);
                }
                times.sort_by(|a, b| a.total_cmp(b));
                let mut penalized = logits.clone();
                let want = sample_cpu(&mut penalized, &params, &mut history.clone(), &[], &op.shape);
                let bad = (0..n).filter(|&r| Some(tokens[r]) != want[r]).count();
                assert!(bad * 8 <= n, "{what}: {bad} of {n} rows differ from the CPU");
                report(&format!("sample vocab {vocab:>7} x {n} rows {what:28}: min {:6.2} ms, median {:6.2} ms", times[0], times[4]));
            }
        }
    }
}
