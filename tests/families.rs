//! The architectures beyond SmolLM2's llama and Gemma 3 (qwen2, qwen3, Llama 3.x's llama, phi3,
//! gemma2, smollm3), each on its synthetic model (`pagedlm::synth::family_model`: 4 layers, F32
//! weights, every feature of the architecture at work), teacher-forced against llama.cpp's
//! greedy steps (`tests/data/families/`, made by `scripts/family-refs.py`): the float64
//! recompute lands on llama.cpp's logits; both backends, through the decode and the prefill
//! paths, with f32 and INT8 KV, agree with llama.cpp on every step where its margin is clear;
//! batched, prefix-shared and preempted requests give the tokens they give alone.
//! Runs natively and in the browser.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use pagedlm::engine::{BackendChoice, Engine, EngineOptions, GenerateRequest, KvDtype, SamplingParams, ScoreMode};
use pagedlm::sampler::argmax;
use pagedlm::synth::{family_model, tiny_llama_gguf};

/// A step whose llama.cpp margin (top-1 minus top-2 logit) is at least this must agree.
const CLEAR_MARGIN: f32 = 0.5;
/// The largest |our logit − llama.cpp's| allowed on any logit of any step.
const LOGIT_TOL: f32 = 0.5;

/// llama.cpp's runs: one per synthetic model, and phi3's within its original context.
const REFERENCES: [&str; 7] = ["qwen2", "qwen3", "llama3", "phi3", "phi3-short", "gemma2", "smollm3"];

/// llama.cpp's greedy run on one synthetic model.
struct Reference {
    name: &'static str,
    /// The synthetic model ([`family_model`]'s name) and the context llama.cpp ran it with.
    model: String,
    n_ctx: u32,
    ids: Vec<u32>,
    /// The first generated position: rows are the logits at positions from - 1 ..= ids.len() - 1.
    from: usize,
    logits: Vec<Vec<f32>>,
}

fn json_of(name: &str) -> &'static str {
    match name {
        "qwen2" => include_str!("data/families/qwen2.json"),
        "qwen3" => include_str!("data/families/qwen3.json"),
        "llama3" => include_str!("data/families/llama3.json"),
        "phi3" => include_str!("data/families/phi3.json"),
        "phi3-short" => include_str!("data/families/phi3-short.json"),
        "gemma2" => include_str!("data/families/gemma2.json"),
        "smollm3" => include_str!("data/families/smollm3.json"),
        _ => panic!("no reference for {name}"),
    }
}

/// Standard base64 (the references' logits).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn reference(name: &'static str) -> Reference {
    let v: serde_json::Value = serde_json::from_str(json_of(name)).unwrap();
    let ids: Vec<u32> = v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let vocab = v["vocab"].as_u64().unwrap() as usize;
    let bytes = base64(v["logits_f32_base64"].as_str().unwrap());
    let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let logits: Vec<Vec<f32>> = values.chunks(vocab).map(<[f32]>::to_vec).collect();
    let from = v["from"].as_u64().unwrap() as usize;
    assert_eq!(logits.len(), ids.len() - from + 1, "{name}: a row per position from the last prompt token");
    let (model, n_ctx) = (v["model"].as_str().unwrap().to_string(), v["settings"]["n_ctx"].as_u64().unwrap() as u32);
    Reference { name, model, n_ctx, ids, from, logits }
}

fn model(name: &str) -> Vec<u8> {
    tiny_llama_gguf(&family_model(name).unwrap_or_else(|| panic!("no synthetic {name}")))
}

/// How far `rows` (one per reference row) are from llama.cpp's.
#[derive(Debug, Default)]
struct Agreement {
    steps: usize,
    agree: usize,
    clear: usize,
    clear_agree: usize,
    max_diff: f32,
}

impl Agreement {
    fn of(r: &Reference, rows: &[Vec<f32>]) -> Agreement {
        assert_eq!(rows.len(), r.logits.len(), "{}: a row per reference row", r.name);
        let mut a = Agreement::default();
        for (ours, theirs) in rows.iter().zip(&r.logits) {
            let top = argmax(theirs);
            let second = theirs.iter().enumerate().filter(|&(i, _)| i as u32 != top).map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
            let clear = theirs[top as usize] - second >= CLEAR_MARGIN;
            let same = argmax(ours) == top;
            a.steps += 1;
            a.agree += usize::from(same);
            a.clear += usize::from(clear);
            a.clear_agree += usize::from(clear && same);
            a.max_diff = ours.iter().zip(theirs).map(|(x, y)| (x - y).abs()).fold(a.max_diff, f32::max);
        }
        a
    }

    /// 100% of the clear steps (or `clear_share` of them), ≥ 95% of all, max |Δlogit| ≤ 0.5.
    fn check(&self, what: &str, clear_share: f64) {
        common::report(&format!(
            "{what}: top-1 {}/{} steps, {}/{} clear steps, max |Δlogit| vs llama.cpp {:.4}",
            self.agree, self.steps, self.clear_agree, self.clear, self.max_diff
        ));
        assert!(self.clear >= self.steps / 4, "{what}: only {} of {} steps are clear: a reference that tests little", self.clear, self.steps);
        assert!(self.clear_agree as f64 >= clear_share * self.clear as f64, "{what}: {self:?}");
        if clear_share == 1.0 {
            assert!(self.agree as f64 >= 0.95 * self.steps as f64, "{what}: {self:?}");
            assert!(self.max_diff <= LOGIT_TOL, "{what}: {self:?}");
        }
    }
}

/// Every model teacher-forced through an engine of `opts`, in both score modes.
async fn engines_agree(what: &str, opts: EngineOptions, clear_share: f64) {
    for name in REFERENCES {
        let r = reference(name);
        let mut engine = Engine::load(&model(&r.model), EngineOptions { max_context: r.n_ctx, ..opts.clone() }).await.unwrap();
        assert_eq!(engine.config().arch, if r.model == "llama3" { "llama" } else { &r.model });
        for mode in [ScoreMode::Decode, ScoreMode::Prefill] {
            let rows = engine.score_logits(&r.ids, r.from, mode).await.unwrap();
            Agreement::of(&r, &rows).check(&format!("{name} {what} {mode:?}"), clear_share);
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn the_float64_recompute_lands_on_llamacpp() {
    use pagedlm::gguf::Gguf;
    use pagedlm::model::reference::forward_cpu_from;
    use pagedlm::model::ModelConfig;
    for name in REFERENCES {
        let r = reference(name);
        let bytes = model(&r.model);
        let gguf = Gguf::parse(&bytes).unwrap();
        let mut cfg = ModelConfig::from_gguf(&gguf).unwrap();
        // The context llama.cpp ran with (phi3's factors depend on it).
        cfg.use_context(r.n_ctx);
        let rows = forward_cpu_from(&gguf, &cfg, &r.ids, r.from - 1).unwrap();
        let a = Agreement::of(&r, &rows[..r.logits.len()]);
        // Gemma 2's GELU is llama.cpp's table of f16 values.
        let tol = if name == "gemma2" { 0.04 } else { 1e-3 };
        common::report(&format!("{name} float64: max |Δlogit| vs llama.cpp {:.5} ({}/{} top-1)", a.max_diff, a.agree, a.steps));
        assert!(a.max_diff <= tol, "{name}: {a:?}");
        assert_eq!(a.agree, a.steps, "{name}: {a:?}");
    }
}

gpu_test! {
    async fn the_cpu_backend_matches_llamacpp() {
        engines_agree("cpu f32 KV", EngineOptions { backend: BackendChoice::Cpu, ..Default::default() }, 1.0).await;
    }
}

gpu_test! {
    async fn the_cpu_backend_with_int8_kv_matches_llamacpp_on_the_clear_steps() {
        let opts = EngineOptions { backend: BackendChoice::Cpu, kv_dtype: KvDtype::Int8, ..Default::default() };
        engines_agree("cpu int8 KV", opts, 0.98).await;
    }
}

gpu_test! {
    async fn the_webgpu_backend_matches_llamacpp() {
        engines_agree("webgpu f32 KV", EngineOptions { backend: BackendChoice::Webgpu, ..Default::default() }, 1.0).await;
    }
}

// Natively only, as the batched test below: the browser runs the same kernels in the f32 test.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn the_webgpu_backend_with_int8_kv_matches_llamacpp_on_the_clear_steps() {
    let opts = EngineOptions { backend: BackendChoice::Webgpu, kv_dtype: KvDtype::Int8, ..Default::default() };
    pollster::block_on(engines_agree("webgpu int8 KV", opts, 0.98));
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn batched_shared_and_preempted_requests_give_their_solo_tokens() {
    use pagedlm::engine::{Event, SchedConfig};
    use pagedlm::rng::Rng;
    use pagedlm::synth::FAMILY_MODELS;
    use std::collections::HashMap;
    pollster::block_on(async {
        // On the GPU, the architectures whose kernels differ (biases, partial rotary with
        // factors, soft-caps with windows, NoPE); on the CPU, every one.
        for (backend, names) in [(BackendChoice::Webgpu, &["qwen2", "phi3", "gemma2", "smollm3"][..]), (BackendChoice::Cpu, &FAMILY_MODELS[..])] {
            for &name in names {
                let bytes = model(name);
                let mut rng = Rng::new(77);
                let system: Vec<u32> = (0..12).map(|_| 3 + rng.below(250) as u32).collect();
                let prompts: Vec<(Vec<u32>, GenerateRequest)> = (0..5u32)
                    .map(|i| {
                        let mut p = if i % 2 == 0 { system.clone() } else { Vec::new() };
                        p.extend((0..1 + rng.below(20)).map(|_| 3 + rng.below(250) as u32));
                        let sampling = if i == 3 {
                            SamplingParams { temperature: 0.8, top_p: 0.9, seed: 7, ..SamplingParams::greedy() }
                        } else {
                            SamplingParams::greedy()
                        };
                        (p, GenerateRequest { max_tokens: 6 + 2 * i, sampling, stop: Vec::new(), ignore_eos: true, ..Default::default() })
                    })
                    .collect();
                let solo_opts = EngineOptions { backend, max_context: 128, prefix_cache: false, ..Default::default() };
                let mut solo = Engine::load(&bytes, solo_opts).await.unwrap();
                let mut want = Vec::new();
                for (p, r) in &prompts {
                    want.push(solo.generate(p, r, &mut |_| true).await.unwrap().tokens);
                }
                // Four sequences a step, chunks of 16 rows, a pool of 80 slots: the requests
                // cannot all hold their blocks at once.
                let sched = SchedConfig { max_batch: 4, step_tokens: 16, ..Default::default() };
                let opts = EngineOptions {
                    backend,
                    max_context: 128,
                    block_size: 8,
                    pool_tokens: 80,
                    prefix_cache: true,
                    sched,
                    check_integrity: true,
                    ..Default::default()
                };
                let mut engine = Engine::load(&bytes, opts).await.unwrap();
                let order: Vec<_> = prompts.iter().map(|(p, r)| engine.submit(p.clone(), r.clone()).unwrap()).collect();
                let mut done = HashMap::new();
                while engine.has_work() {
                    for e in engine.step().await.unwrap() {
                        if let Event::Finished { id, result } = e {
                            done.insert(id, result.unwrap().tokens);
                        }
                    }
                }
                for (k, id) in order.iter().enumerate() {
                    assert_eq!(done[id], want[k], "{name} on {backend:?}: request {k} batched differs from its solo run");
                }
                let stats = engine.sched_stats();
                common::report(&format!("{name} on {backend:?}: {} steps, {} preemptions", stats.steps, stats.preemptions));
                assert!(stats.preemptions > 0, "{name}: the small pool preempts");
            }
        }
    });
}

gpu_test! {
    async fn a_scripted_model_follows_its_script() {
        // The synthetic writer's scripted weights (what the package's reasoning and tool-call
        // tests in Chromium build on): after 5 comes 6, after 6 comes 7, after 7 comes 5.
        let cfg = pagedlm::synth::SynthConfig { script: vec![(5, 6), (6, 7), (7, 5)], ..family_model("qwen3").unwrap() };
        let bytes = tiny_llama_gguf(&cfg);
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            let mut engine = Engine::load(&bytes, EngineOptions { backend, ..Default::default() }).await.unwrap();
            let request = GenerateRequest { max_tokens: 7, sampling: SamplingParams::greedy(), stop: Vec::new(), ignore_eos: true, ..Default::default() };
            let got = engine.generate(&[40, 41, 6], &request, &mut |_| true).await.unwrap().tokens;
            assert_eq!(got, [7, 5, 6, 7, 5, 6, 7], "{backend:?}");
        }
    }
}
