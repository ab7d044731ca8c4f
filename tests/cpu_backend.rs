//! The CPU backend (`backend: Cpu`, src/cpu/) against the CPU float64 recompute and against the
//! WebGPU backend, on synthetic models written by the test: llama and Gemma 3 (windows within,
//! equal to and across blocks, heads of 256), every weight type, f32 and INT8 KV, paged and
//! contiguous caches, prefill chunks, decode, batched steps, the prefix cache with eviction and
//! preemption, sampling, constraints, and snapshots moved between the two backends. Runs natively
//! and in the browser (where the CPU backend is wasm on one thread).
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;

use pagedlm::engine::{BackendChoice, Constraint, Engine, EngineOptions, Event, GenerateRequest, KvDtype, KvLayout, SamplingParams, SchedConfig, ScoreMode};
use pagedlm::gguf::{GgmlType, Gguf};
use pagedlm::gpu::TimingMethod;
use pagedlm::model::reference::forward_cpu;
use pagedlm::model::ModelConfig;
use pagedlm::rng::Rng;
use pagedlm::sampler::argmax;
use pagedlm::synth::{tiny_llama_gguf, SynthConfig, SynthGemma};

/// |CPU backend f32 − recompute f64| on every logit (as the WebGPU backend's tests), with f32
/// activations: `EXACT` (whatever the default; int8 activations are checked on their own below).
const LOGIT_TOL: f32 = 2e-3;
const EXACT: Option<bool> = Some(false);
/// With INT8 K/V the logits move by the quantization error (as tests/gemma_synth.rs).
const INT8_TOL: f32 = 0.15;

fn cpu(opts: EngineOptions) -> EngineOptions {
    EngineOptions { backend: BackendChoice::Cpu, ..opts }
}

/// 7 layers (local 0-4 and 6, global 5), 4 query heads over 1 KV head, a window of `window`.
fn gemma(window: usize, head_dim: usize, seed: u64) -> SynthConfig {
    SynthConfig {
        n_layers: 7,
        n_heads: 4,
        n_kv_heads: 1,
        rope_base: 1_000_000.0,
        eps: 1e-6,
        seed,
        gemma: Some(SynthGemma { window, head_dim }),
        ..SynthConfig::tiny()
    }
}

fn random_ids(rng: &mut Rng, n: usize, vocab: u32) -> Vec<u32> {
    (0..n).map(|_| 3 + rng.below(vocab as u64 - 3) as u32).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn vocab_of(bytes: &[u8]) -> u32 {
    ModelConfig::from_gguf(&Gguf::parse(bytes).unwrap()).unwrap().vocab
}

/// Scores `ids` on the CPU backend through prefill (chunks of 7) and decode on each layout
/// and KV dtype, every logit row against the recompute.
async fn check_against_recompute(what: &str, bytes: &[u8], ids: &[u32], layouts: &[(KvLayout, u32)], dtypes: &[KvDtype]) {
    let gguf = Gguf::parse(bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let reference = forward_cpu(&gguf, &cfg, ids).unwrap();
    for &kv_dtype in dtypes {
        let tol = if kv_dtype == KvDtype::Int8 { INT8_TOL } else { LOGIT_TOL };
        for &(kv_layout, block_size) in layouts {
            let opts =
                cpu(EngineOptions { max_context: 128, prefill_chunk: 7, kv_layout, block_size, kv_dtype, int8_activations: EXACT, ..Default::default() });
            let mut engine = Engine::load(bytes, opts).await.unwrap();
            assert_eq!(engine.backend().0, "cpu");
            for (mode, from) in [(ScoreMode::Prefill, 1), (ScoreMode::Decode, ids.len() / 2)] {
                let rows = engine.score_logits(ids, from, mode).await.unwrap();
                assert_eq!(rows.len(), ids.len() - from + 1);
                for (i, row) in rows.iter().enumerate() {
                    let d = max_diff(row, &reference[from - 1 + i]);
                    assert!(d <= tol, "{what} {kv_layout:?}/{block_size} {kv_dtype:?} {mode:?}: position {} differs by {d}", from - 1 + i);
                }
                engine.kv_cache().check_integrity().unwrap();
            }
        }
    }
}

gpu_test! {
    async fn llama_and_gemma_match_the_recompute_on_every_cache() {
        let layouts: &[(KvLayout, u32)] = &[(KvLayout::Paged, 16), (KvLayout::Paged, 4), (KvLayout::Contiguous, 16)];
        let llama = common::tiny_model(31);
        let ids = random_ids(&mut Rng::new(1), 40, vocab_of(&llama));
        check_against_recompute("llama", &llama, &ids, layouts, &[KvDtype::F32, KvDtype::Int8]).await;
        // Windows within, equal to and across blocks; 50 positions run past each.
        for (window, seed) in [(5usize, 2u64), (16, 3), (40, 4)] {
            let bytes = tiny_llama_gguf(&gemma(window, 32, seed));
            let ids = random_ids(&mut Rng::new(seed), 50, vocab_of(&bytes));
            check_against_recompute(&format!("gemma window {window}"), &bytes, &ids, layouts, &[KvDtype::F32]).await;
        }
        // Gemma 3 270M's head width, f32 and INT8 K/V.
        let wide = tiny_llama_gguf(&gemma(16, 256, 5));
        let ids = random_ids(&mut Rng::new(5), 30, vocab_of(&wide));
        check_against_recompute("gemma heads of 256", &wide, &ids, &[(KvLayout::Paged, 4)], &[KvDtype::F32, KvDtype::Int8]).await;
    }
}

gpu_test! {
    async fn every_weight_type_matches_the_recompute() {
        // Hidden and FFN widths of whole 256-value K-quant blocks.
        let base = tiny_llama_gguf(&SynthConfig { hidden: 256, ffn: 512, n_heads: 4, n_kv_heads: 2, seed: 61, ..SynthConfig::tiny() });
        let ids = random_ids(&mut Rng::new(6), 16, vocab_of(&base));
        for t in GgmlType::SUPPORTED {
            let bytes = common::retyped(&base, &|name| (name != "token_embd.weight").then_some(t), Some(t));
            check_against_recompute(&t.name(), &bytes, &ids, &[(KvLayout::Paged, 16)], &[KvDtype::F32]).await;
        }
    }
}

gpu_test! {
    async fn int8_activations_stay_within_their_rounding_of_the_recompute() {
        // Asked for (engine::CPU_INT8_ACTIVATIONS says the default) on llama, and on Gemma 3
        // whose sandwich norms quantize the next matmul's input too; prefill (four rows at a
        // time) and decode (one).
        let opts = cpu(EngineOptions { max_context: 64, prefill_chunk: 16, block_size: 4, ..Default::default() });
        let llama = common::tiny_model(35);
        let ids = random_ids(&mut Rng::new(11), 40, vocab_of(&llama));
        common::assert_int8_within_rounding("llama on the CPU", &llama, &ids, opts.clone()).await;
        let gemma = tiny_llama_gguf(&gemma(16, 32, 10));
        let ids = random_ids(&mut Rng::new(10), 40, vocab_of(&gemma));
        common::assert_int8_within_rounding("gemma on the CPU", &gemma, &ids, opts).await;
        let engine = Engine::load(&llama, cpu(EngineOptions { max_context: 64, ..Default::default() })).await.unwrap();
        assert_eq!(opts_int8(&engine), pagedlm::engine::CPU_INT8_ACTIVATIONS, "the default: {}", engine.variant_name());
    }
}

/// Whether a CPU-backend engine multiplies int8 activations (its variant says so).
fn opts_int8(engine: &Engine) -> bool {
    engine.variant_name().contains("int8")
}

/// Runs every submitted request to the end (the cache checked after each step); each request's
/// tokens and prefix hit by request id.
async fn finish_all(engine: &mut Engine) -> HashMap<u64, (Vec<u32>, u32)> {
    let mut done = HashMap::new();
    while engine.has_work() {
        for e in engine.step().await.unwrap() {
            if let Event::Finished { id, result } = e {
                let g = result.unwrap();
                done.insert(id.0, (g.tokens, g.prefix_hit_tokens));
            }
        }
        engine.kv_cache().check_integrity().unwrap();
    }
    done
}

/// Each prompt's tokens from an engine of `opts` running it alone.
async fn solo_runs(bytes: &[u8], opts: &EngineOptions, prompts: &[Vec<u32>], request: &GenerateRequest) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for p in prompts {
        let mut engine = Engine::load(bytes, EngineOptions { prefix_cache: false, ..opts.clone() }).await.unwrap();
        out.push(engine.generate(p, request, &mut |_| true).await.unwrap().tokens);
    }
    out
}

gpu_test! {
    async fn batched_steps_preemption_and_the_prefix_cache_give_the_solo_tokens() {
        // A pool too small for the four requests at once: they share a prefix, batch, and some
        // are preempted and resumed; greedy and seeded sampling with a penalty alike.
        let bytes = tiny_llama_gguf(&gemma(9, 32, 7));
        let vocab = vocab_of(&bytes);
        let mut rng = Rng::new(7);
        let system = random_ids(&mut rng, 20, vocab);
        let prompts: Vec<Vec<u32>> = (0..4).map(|k| [system.clone(), random_ids(&mut rng, 3 + 4 * k, vocab)].concat()).collect();
        let opts = cpu(EngineOptions { max_context: 96, block_size: 4, pool_tokens: 112, sched: SchedConfig { max_batch: 4, ..SchedConfig::default() }, check_integrity: true, ..Default::default() });
        let sampled = SamplingParams { temperature: 0.8, top_k: 20, top_p: 0.9, repetition_penalty: 1.2, seed: 11, ..SamplingParams::greedy() };
        for sampling in [SamplingParams::greedy(), sampled] {
            let request = GenerateRequest { max_tokens: 24, ignore_eos: true, sampling, ..Default::default() };
            let solo = solo_runs(&bytes, &opts, &prompts, &request).await;
            let mut engine = Engine::load(&bytes, opts.clone()).await.unwrap();
            let ids: Vec<_> = prompts.iter().map(|p| engine.submit(p.clone(), request.clone()).unwrap()).collect();
            let done = finish_all(&mut engine).await;
            for (k, id) in ids.iter().enumerate() {
                assert_eq!(done[&id.0].0, solo[k], "request {k}: batched tokens differ from its solo run");
            }
            assert!(engine.sched_stats().preemptions > 0, "the pool of 112 tokens preempts some of the four requests");
            // A request after them starts from the cached system prompt.
            let again = engine.generate(&prompts[0], &request, &mut |_| true).await.unwrap();
            assert!(again.prefix_hit_tokens >= 20, "a prefix hit of {} tokens", again.prefix_hit_tokens);
            assert_eq!(again.tokens, solo[0], "the cached prefix gives the tokens of a computed one");
        }
    }
}

gpu_test! {
    async fn greedy_tokens_follow_the_recompute_and_the_webgpu_backend() {
        let bytes = common::tiny_model(33);
        let gguf = Gguf::parse(&bytes).unwrap();
        let cfg = ModelConfig::from_gguf(&gguf).unwrap();
        let prompt = random_ids(&mut Rng::new(33), 12, cfg.vocab);
        let request = GenerateRequest { max_tokens: 24, ignore_eos: true, ..Default::default() };
        let mut on_cpu = Engine::load(&bytes, cpu(EngineOptions { max_context: 64, ..Default::default() })).await.unwrap();
        let got = on_cpu.generate(&prompt, &request, &mut |_| true).await.unwrap().tokens;
        let reference = forward_cpu(&gguf, &cfg, &[prompt.clone(), got.clone()].concat()).unwrap();
        for (i, &t) in got.iter().enumerate() {
            let row = &reference[prompt.len() - 1 + i];
            let margin = row[argmax(row) as usize] - row[t as usize];
            assert!(margin <= 2.0 * LOGIT_TOL, "token {i} is {t}, the recompute's argmax {} (margin {margin})", argmax(row));
        }
        let mut on_gpu = Engine::load(&bytes, EngineOptions { max_context: 64, int8_activations: Some(false), ..Default::default() }).await.unwrap();
        assert_eq!(on_gpu.backend().0, "webgpu");
        let gpu_tokens = on_gpu.generate(&prompt, &request, &mut |_| true).await.unwrap().tokens;
        assert_eq!(got, gpu_tokens, "the CPU and WebGPU backends decode the same greedy tokens");
    }
}

gpu_test! {
    async fn snapshots_move_between_the_backends() {
        for kv_dtype in [KvDtype::F32, KvDtype::Int8] {
            let bytes = tiny_llama_gguf(&gemma(9, 32, 8));
            let vocab = vocab_of(&bytes);
            let mut rng = Rng::new(8);
            let history = random_ids(&mut rng, 30, vocab);
            let prompt = [history.clone(), random_ids(&mut rng, 4, vocab)].concat();
            let request = GenerateRequest { max_tokens: 12, ignore_eos: true, ..Default::default() };
            let base = EngineOptions { max_context: 96, block_size: 4, kv_dtype, int8_activations: Some(false), ..Default::default() };
            let mut on_gpu = Engine::load(&bytes, base.clone()).await.unwrap();
            let mut on_cpu = Engine::load(&bytes, cpu(base.clone())).await.unwrap();
            let want = solo_runs(&bytes, &cpu(base.clone()), std::slice::from_ref(&prompt), &request).await.remove(0);
            // WebGPU → CPU, and CPU → WebGPU: the same bytes either way.
            let from_gpu = on_gpu.export_snapshot(&history).await.unwrap();
            let from_cpu = on_cpu.export_snapshot(&history).await.unwrap();
            assert_eq!(from_gpu.len(), from_cpu.len(), "{kv_dtype:?}: one format");
            let mut cpu_target = Engine::load(&bytes, cpu(base.clone())).await.unwrap();
            assert_eq!(cpu_target.import_snapshot(&from_gpu).unwrap(), history);
            let g = cpu_target.generate(&prompt, &request, &mut |_| true).await.unwrap();
            assert!(g.prefix_hit_tokens >= 28, "{kv_dtype:?}: the CPU engine reuses the GPU's K/V ({} tokens)", g.prefix_hit_tokens);
            assert_eq!(g.tokens, want, "{kv_dtype:?}: the GPU's K/V give the CPU backend its own tokens");
            let mut gpu_target = Engine::load(&bytes, base.clone()).await.unwrap();
            assert_eq!(gpu_target.import_snapshot(&from_cpu).unwrap(), history);
            let g = gpu_target.generate(&prompt, &request, &mut |_| true).await.unwrap();
            assert!(g.prefix_hit_tokens >= 28, "{kv_dtype:?}: the GPU engine reuses the CPU's K/V");
            assert_eq!(g.tokens, want, "{kv_dtype:?}: the CPU's K/V give the WebGPU backend the same tokens");
        }
    }
}

gpu_test! {
    async fn constrained_requests_hold_on_the_cpu() {
        let bytes = common::tiny_model(52);
        let mut engine = Engine::load(&bytes, cpu(EngineOptions { max_context: 160, ..Default::default() })).await.unwrap();
        let prompt = random_ids(&mut Rng::new(6), 8, engine.config().vocab);
        let run = |c: Constraint| GenerateRequest { max_tokens: 64, constraint: Some(c), ..Default::default() };
        let lark = "start: \"id=\" NUM (\",\" NUM)*\nNUM: /[1-9][0-9]?/\n";
        let g = engine.generate(&prompt, &run(Constraint::Lark(lark.into())), &mut |_| true).await.unwrap();
        let ok = g.text.strip_prefix("id=").is_some_and(|rest| rest.split(',').all(|n| (1..=99).contains(&n.parse::<u32>().unwrap_or(0))));
        assert!(ok, "lark: {:?} ({:?})", g.text, g.finish_reason);
        let g = engine.generate(&prompt, &run(Constraint::Regex("(yes|no|maybe)!".into())), &mut |_| true).await.unwrap();
        assert!(["yes!", "no!", "maybe!"].contains(&g.text.as_str()), "regex: {:?}", g.text);
    }
}

gpu_test! {
    async fn auto_takes_the_cpu_backend_on_a_cpu_adapter_and_says_why() {
        let bytes = common::tiny_model(34);
        let adapter_is_cpu = common::gpu().await.is_cpu_adapter();
        let auto = Engine::load(&bytes, EngineOptions { backend: BackendChoice::Auto, ..Default::default() }).await.unwrap();
        let (name, reason) = auto.backend();
        if adapter_is_cpu {
            assert_eq!(name, "cpu", "auto on a CPU emulation ({reason})");
            assert!(reason.contains("CPU emulation"), "the reason names the emulation: {reason}");
            assert!(auto.context().is_none() && auto.is_cpu());
            assert!(auto.adapter_name().starts_with("CPU backend"), "{}", auto.adapter_name());
        } else {
            assert_eq!(name, "webgpu", "auto on a real GPU ({reason})");
        }
        let webgpu = Engine::load(&bytes, EngineOptions::default()).await.unwrap();
        assert_eq!(webgpu.backend(), ("webgpu", "asked for"), "WebGPU stays the default");
        // A profile on the CPU backend: host-clock stages, no GPU work.
        let mut on_cpu = Engine::load(&bytes, cpu(EngineOptions { max_context: 64, ..Default::default() })).await.unwrap();
        let profile = on_cpu.profile(8, true).await.unwrap();
        assert_eq!(profile.method, TimingMethod::WallClockPerKernel, "no timestamps without a GPU");
        assert!(profile.adapter.starts_with("CPU backend"), "{}", profile.adapter);
        assert!(profile.decode.gpu_ms > 0.0 && profile.prefill.gpu_ms > 0.0, "the stages are timed: {profile:?}");
        assert_eq!(profile.decode.dispatches, 0, "a CPU step dispatches nothing");
        assert!(on_cpu.memory().weights_bytes > 0 && on_cpu.memory().kv_bytes > 0);
    }
}
