//! Profiles tell the truth: the context's counters move with what it creates, submits and reads
//! back; a captured step times exactly the dispatches its graph records (and computes what an
//! uncaptured one does); the engine's profile accounts for every dispatch, reports the buffers,
//! bind groups and bytes its real decode path creates and reads, and both timing methods see the
//! same kernels. Natively (lavapipe) and in the browser (SwiftShader), on a tiny synthetic model.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{report, tiny_model};
use pagedlm::engine::{kv_shape, Engine, EngineOptions, Event, GenerateRequest, Profile, SchedConfig, StepProfile, PROFILE_EXTRA_TOKENS};
use pagedlm::gguf::Gguf;
use pagedlm::gpu::{ops::elementwise, Counters, GpuError, Recorder, TimingMethod};
use pagedlm::kv::{CacheConfig, KvCache, KvDtype, KvLayout};
use pagedlm::model::{Logits, ModelConfig, StepRow};
use pagedlm::sampler::SamplingParams;
use pagedlm::webgpu::{AttentionKind, ForwardGraph, Weights};

const SEED: u64 = 0x9f0f;
/// Prompt tokens of the engine profiles, in prefill passes of `CHUNK` rows (3 passes).
const PROMPT: u32 = 20;
const CHUNK: u32 = 8;

fn options() -> EngineOptions {
    EngineOptions { max_context: 64, prefill_chunk: CHUNK, ..Default::default() }
}

gpu_test!(
    async fn counters_move_with_what_the_context_creates_submits_and_reads() {
        let ctx = common::counting_gpu_with(Default::default()).await;
        let c0 = ctx.counters();
        let x = ctx.storage_zeroed("x", 1000);
        let y = ctx.storage_init("y", &[7u8; 1000]);
        let c1 = ctx.counters().since(&c0);
        assert_eq!((c1.buffers_created, c1.buffer_bytes_created, c1.bind_groups_created), (2, 2000, 0));

        // The add kernel makes its uniform and its bind group.
        let add = elementwise::add(&ctx, &x, &y, 250).unwrap();
        let c2 = ctx.counters().since(&c0);
        assert_eq!((c2.buffers_created, c2.bind_groups_created), (3, 1));

        let mut rec = Recorder::new(&ctx, "test");
        rec.dispatch(&add);
        rec.dispatch(&add);
        rec.submit();
        let c3 = ctx.counters().since(&c0);
        assert_eq!((c3.dispatches, c3.submits, c3.readbacks), (2, 1, 0));

        // x = 0 + 7·0x07070707 as f32 twice; what matters here is the readback's count.
        let got = ctx.read_bytes(&x, 16, 32).await.unwrap();
        assert_eq!(got.len(), 32);
        let c4 = ctx.counters().since(&c0);
        assert_eq!((c4.readbacks, c4.bytes_read_back, c4.submits, c4.buffers_created), (1, 32, 2, 4), "{c4:?}");
        assert!(c4.record_submit_ns >= c3.record_submit_ns);
        assert!(c4.submit_ns <= c4.record_submit_ns, "the submit call is part of recording and submitting: {c4:?}");
    }
);

/// The tiny model's config and weights, and a cache of 64 tokens for up to two sequences.
fn tiny_parts(ctx: &Arc<pagedlm::gpu::Context>) -> (ModelConfig, Weights, KvCache) {
    let bytes = tiny_model(SEED);
    let gguf = Gguf::parse(&bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let weights = Weights::upload(ctx, &gguf, &cfg).unwrap();
    let cache = CacheConfig {
        layout: KvLayout::Paged,
        dtype: KvDtype::F32,
        block_size: 16,
        pool_tokens: 64,
        max_seqs: 2,
        max_seq_len: 64,
        prefix_cache: false,
        local_pool_tokens: 0,
    };
    let kv = KvCache::new(ctx, &kv_shape(&cfg), cache).unwrap();
    (cfg, weights, kv)
}

gpu_test!(
    async fn a_captured_step_times_every_dispatch_its_graph_records() {
        let ctx = common::counting_gpu_with(Default::default()).await;
        let (cfg, weights, mut kv) = tiny_parts(&ctx);
        let seq = kv.allocate().unwrap();
        let n = 5u32;
        kv.append(seq, n).unwrap();
        let table_base = kv.table_base(seq);
        let rows: Vec<StepRow> = (0..n).map(|i| StepRow { token: 10 + 3 * i, position: i, table_base, slot: seq.0 }).collect();
        let mut graph = ForwardGraph::build(&ctx, (&cfg, &weights), &kv, AttentionKind::Sequence, n, 1).unwrap();
        let plain = graph.run(&ctx, &rows, &[n - 1], Logits::Full).await.unwrap();
        if !ctx.has_timestamps() {
            let refused = ctx.begin_capture(100);
            assert!(matches!(refused, Err(GpuError::Timestamps(_))), "{refused:?}");
            report(&format!("{}: no timestamp queries; captures are refused", ctx.adapter_name()));
            return;
        }
        ctx.begin_capture(graph.dispatch_count() as u32).unwrap();
        assert!(matches!(ctx.begin_capture(1), Err(GpuError::Timestamps(_))), "a second capture while one is armed");
        let c0 = ctx.counters();
        let timed = graph.run(&ctx, &rows, &[n - 1], Logits::Full).await.unwrap();
        let step = ctx.counters().since(&c0);
        let captured = ctx.end_capture().await.unwrap();
        let times = &captured.dispatches;
        let names: Vec<&str> = times.iter().map(|t| t.0).collect();
        assert_eq!(names, graph.kernel_names(), "the capture's kernels are the graph's, in order");
        assert_eq!(step.dispatches as usize, graph.dispatch_count());
        assert_eq!((step.submits, step.readbacks, step.buffers_created, step.bind_groups_created), (1, 1, 0, 0), "{step:?}");
        assert!(times.iter().all(|t| t.1.is_finite() && t.1 >= 0.0), "{times:?}");
        // Timing changes nothing the step computes.
        assert_eq!(timed[0].0, plain[0].0);
        assert_eq!(timed[0].1, plain[0].1);
        assert!(matches!(ctx.end_capture().await, Err(GpuError::Timestamps(_))), "ending a capture twice");
        let total: f64 = times.iter().map(|t| t.1).sum();
        assert!(captured.span_ms >= times.iter().map(|t| t.1).fold(0.0, f64::max), "the span holds every dispatch: {captured:?}");
        report(&format!("{}: {} dispatches captured, {total:.3} ms of GPU time in a span of {:.3} ms", ctx.adapter_name(), times.len(), captured.span_ms));

        // A capture armed for fewer dispatches than the step records refuses to report.
        ctx.begin_capture(3).unwrap();
        graph.run(&ctx, &rows, &[n - 1], Logits::Argmax).await.unwrap();
        assert!(matches!(ctx.end_capture().await, Err(GpuError::Timestamps(_))));
    }
);

gpu_test!(
    async fn a_decode_step_ropes_and_writes_its_heads_inside_attention() {
        // The tiny model has 2 query heads per KV head: a one-row step's attention owns each KV
        // head in one workgroup and ropes and writes the heads itself (no qkv_heads dispatch); a
        // five-row step's cannot (10 lanes per KV head) and records qkv_heads in every layer,
        // its other dispatches the same. Then batched steps.
        let ctx = common::gpu().await;
        let (cfg, weights, mut kv) = tiny_parts(&ctx);
        let seq = kv.allocate().unwrap();
        kv.append(seq, 9).unwrap();
        let table_base = kv.table_base(seq);
        let row = |i: u32| StepRow { token: 10 + 3 * i, position: i, table_base, slot: seq.0 };
        let mut chunk = ForwardGraph::build(&ctx, (&cfg, &weights), &kv, AttentionKind::Sequence, 5, 1).unwrap();
        chunk.run(&ctx, &(0..5).map(row).collect::<Vec<_>>(), &[4], Logits::Argmax).await.unwrap();
        let mut decode = ForwardGraph::build(&ctx, (&cfg, &weights), &kv, AttentionKind::Sequence, 1, 1).unwrap();
        decode.run(&ctx, &[row(8)], &[0], Logits::Argmax).await.unwrap();
        let heads = |names: &[&str]| names.iter().filter(|&&n| n == "qkv_heads").count();
        let (chunk_names, decode_names) = (chunk.kernel_names(), decode.kernel_names());
        assert_eq!(heads(&decode_names), 0, "{decode_names:?}");
        assert_eq!(heads(&chunk_names), cfg.n_layers as usize, "{chunk_names:?}");
        assert_eq!(chunk_names.len(), decode_names.len() + cfg.n_layers as usize, "{chunk_names:?} against {decode_names:?}");
        // A batch: with one row per sequence its attention does the heads' work; with two rows of
        // one sequence it cannot, and qkv_heads runs in every layer.
        let other = kv.allocate().unwrap();
        kv.append(other, 4).unwrap();
        let other_row = StepRow { token: 7, position: 3, table_base: kv.table_base(other), slot: other.0 };
        let mut batch = ForwardGraph::build(&ctx, (&cfg, &weights), &kv, AttentionKind::Batch, 3, 3).unwrap();
        batch.run(&ctx, &[row(8), other_row], &[0, 1], Logits::Argmax).await.unwrap();
        assert_eq!(heads(&batch.kernel_names()), 0, "{:?}", batch.kernel_names());
        batch.run(&ctx, &[row(7), row(8), other_row], &[1, 2], Logits::Argmax).await.unwrap();
        assert_eq!(heads(&batch.kernel_names()), cfg.n_layers as usize, "{:?}", batch.kernel_names());
        report(&format!("{}: a decode step of the tiny model ({} layers) records {} dispatches", ctx.adapter_name(), cfg.n_layers, decode_names.len()));
    }
);

/// Kernel name → dispatches of a step's profile.
fn calls(step: &StepProfile) -> BTreeMap<String, u32> {
    step.kernels.iter().map(|k| (k.name.clone(), k.dispatches)).collect()
}

fn check_accounts(what: &str, p: &Profile) {
    for (step, name) in [(&p.prefill, "prefill"), (&p.decode, "decode")] {
        let listed: u64 = step.kernels.iter().map(|k| k.dispatches as u64).sum();
        assert_eq!(listed, step.dispatches, "{what} {name}: the kernels listed cover every dispatch the step recorded");
        assert_eq!(step.gpu_span_ms.is_some(), p.method == TimingMethod::Timestamps, "{what} {name}: a span only from a capture");
        let sum: f64 = step.kernels.iter().map(|k| k.ms).sum();
        assert!((sum - step.gpu_ms).abs() <= 1e-9 * sum.max(1.0), "{what} {name}: gpu_ms {} is the kernels' sum {sum}", step.gpu_ms);
    }
    let (d, pf) = (&p.decode, &p.prefill);
    // One greedy decode row: one readback of its argmax, 4 bytes.
    assert_eq!((d.tokens, d.readbacks, d.submits, d.bytes_read_back), (1, 1, 1, 4), "{what}: {d:?}");
    assert_eq!(d.bytes_read_back_per_token, 4.0);
    // One of the 5 measured steps after 4 warm-up steps (the one of median wall time).
    assert!((PROMPT + 5..=PROMPT + 9).contains(&d.context), "{what}: decode context {}", d.context);
    // Three prefill passes, each reading one 4-byte argmax (the last pass's is the prompt's).
    let passes = PROMPT.div_ceil(CHUNK) as u64;
    assert_eq!((pf.readbacks, pf.submits, pf.bytes_read_back), (passes, passes, 4 * passes), "{what}: {pf:?}");
    assert_eq!(pf.bytes_read_back_per_token, (4 * passes) as f64 / PROMPT as f64);
    // Steps planned ahead: the token is read while the next step runs (without, every readback
    // leaves the GPU idle).
    let lookahead = p.lookahead;
    assert_eq!(d.blocking_readbacks, if lookahead { 0 } else { 1 }, "{what}: {d:?}");
    assert_eq!(p.summary().blocking_readbacks_per_token, if lookahead { 0.0 } else { 1.0 });
    assert_eq!(p.summary().dispatches_per_decode_step, d.dispatches);
}

gpu_test!(
    async fn the_profile_accounts_for_every_dispatch_with_either_method() {
        let bytes = tiny_model(SEED);
        // A new device: the first prefill's compiles are part of what the profile accounts for.
        let mut engine = common::load_fresh(&bytes, options()).await.unwrap();
        let with = engine.profile(PROMPT, true).await.unwrap();
        let want = if engine.context().expect("a WebGPU engine").has_timestamps() { TimingMethod::Timestamps } else { TimingMethod::WallClockPerKernel };
        assert_eq!(with.method, want);
        check_accounts("timestamps where offered", &with);
        let cold = &with.prefill_cold;
        assert!(cold.buffers_created > 0 && cold.bind_groups_created > 0 && cold.pipelines_compiled > 0, "the first prefill builds its graphs: {cold:?}");
        let without = engine.profile(PROMPT, false).await.unwrap();
        assert_eq!(without.method, TimingMethod::WallClockPerKernel);
        check_accounts("host clock", &without);
        assert_eq!((without.prefill_cold.buffers_created, without.prefill_cold.pipelines_compiled), (0, 0), "the graphs of a length seen before are kept");
        // Both methods time the same kernels the same number of times.
        assert_eq!(calls(&with.decode), calls(&without.decode));
        assert_eq!(calls(&with.prefill), calls(&without.prefill));
        assert_eq!(with.decode.dispatches, without.decode.dispatches);
        report(&format!(
            "{}: {:?}, decode {} dispatches, {:.3} ms GPU, {:.3} ms wall",
            with.adapter, with.method, with.decode.dispatches, with.decode.gpu_ms, with.decode.wall_ms
        ));

        // Without steps planned ahead every decode readback blocks.
        let mut plain =
            common::load_counting(&bytes, EngineOptions { sched: SchedConfig { lookahead: false, ..Default::default() }, ..options() }).await.unwrap();
        let p = plain.profile(PROMPT, true).await.unwrap();
        assert!(!p.lookahead);
        check_accounts("no lookahead", &p);
        assert_eq!(calls(&p.decode), calls(&with.decode), "the same kernels either way");

        // Refusals: one token too long for the context, and an empty prompt.
        assert!(engine.profile(64 - PROFILE_EXTRA_TOKENS + 1, true).await.is_err());
        assert!(engine.profile(0, true).await.is_err());
    }
);

/// What one of `steps` more decode steps of the engine's own loop costs, from the counters
/// around two benchmark generations that differ only in those steps (both long enough to reach
/// the steady state: a step planned ahead behind every step read).
async fn per_decode_step(engine: &mut Engine, prompt: &[u32], steps: u32) -> Counters {
    let run = async |engine: &mut Engine, n: u32| {
        let c0 = engine.context().expect("a WebGPU engine").counters();
        engine.generate_ignoring_eos(prompt, n).await.unwrap();
        engine.context().expect("a WebGPU engine").counters().since(&c0)
    };
    // Host times differ run to run; only the counts are compared.
    // Once first, so that both measured runs find the prompt in the prefix cache alike.
    run(engine, 4).await;
    let short = Counters { record_submit_ns: 0, submit_ns: 0, ..run(engine, 4).await };
    let long = Counters { record_submit_ns: 0, submit_ns: 0, ..run(engine, 4 + steps).await };
    let d = long.since(&short);
    let per = |x: u64| {
        assert_eq!(x % steps as u64, 0, "every decode step costs the same: {d:?} over {steps} steps");
        x / steps as u64
    };
    Counters {
        buffers_created: per(d.buffers_created),
        buffer_bytes_created: per(d.buffer_bytes_created),
        bind_groups_created: per(d.bind_groups_created),
        submits: per(d.submits),
        dispatches: per(d.dispatches),
        readbacks: per(d.readbacks),
        bytes_read_back: per(d.bytes_read_back),
        blocking_readbacks: per(d.blocking_readbacks),
        record_submit_ns: 0,
        submit_ns: 0,
    }
}

gpu_test!(
    async fn the_decode_profile_reports_what_the_engine_really_creates_and_reads() {
        let bytes = tiny_model(SEED);
        let mut engine = common::load_counting(&bytes, options()).await.unwrap();
        let p = engine.profile(PROMPT, true).await.unwrap();
        let prompt: Vec<u32> = (0..PROMPT).map(|i| 5 + 7 * i).collect();
        let real = per_decode_step(&mut engine, &prompt, 4).await;
        let d = &p.decode;
        let reported = (d.buffers_created, d.buffer_bytes_created, d.bind_groups_created, d.submits, d.dispatches, d.readbacks, d.bytes_read_back);
        let seen =
            (real.buffers_created, real.buffer_bytes_created, real.bind_groups_created, real.submits, real.dispatches, real.readbacks, real.bytes_read_back);
        assert_eq!(reported, seen, "(buffers, bytes, bind groups, submits, dispatches, readbacks, bytes read): profile vs the decode loop");
        // Steady-state decode creates nothing and waits on nothing the GPU has finished early.
        assert_eq!((real.buffers_created, real.bind_groups_created, real.blocking_readbacks), (0, 0, 0), "{real:?}");
        report(&format!("steady-state decode step: {} buffers, {} bind groups, {} bytes read back", seen.0, seen.2, seen.6));
    }
);

gpu_test!(
    async fn a_greedy_step_reads_back_four_bytes_per_row() {
        let bytes = tiny_model(SEED);
        let mut engine = common::load_counting(&bytes, options()).await.unwrap();
        let request = GenerateRequest { max_tokens: 6, sampling: SamplingParams::greedy(), stop: Vec::new(), ignore_eos: true, ..Default::default() };
        for salt in 0..3u32 {
            let prompt: Vec<u32> = (0..4 + salt).map(|i| 3 + 11 * i + salt).collect();
            engine.submit(prompt, request.clone()).unwrap();
        }
        let mut widest = 0;
        while engine.has_work() {
            let c0 = engine.context().expect("a WebGPU engine").counters();
            let events = engine.step().await.unwrap();
            let step = engine.context().expect("a WebGPU engine").counters().since(&c0);
            let tokens = events.iter().filter(|e| matches!(e, Event::Token { .. })).count() as u64;
            if step.readbacks > 0 {
                // Each token is a logit row's argmax; a pass with none reads its last row's.
                assert_eq!((step.readbacks, step.bytes_read_back), (1, 4 * tokens.max(1)), "a step of {tokens} tokens: {step:?}");
            }
            widest = widest.max(tokens);
        }
        assert_eq!(widest, 3, "the three requests decoded together");
    }
);
