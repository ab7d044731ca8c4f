//! The engine on a device whose storage-binding and buffer limits are lowered
//! (`EngineOptions::max_binding_bytes`, [`pagedlm::gpu::ContextOptions::max_storage_binding`]):
//! a matrix larger than one binding is split across bindings, and the model computes what it
//! computes with the device's own limits. Phones offer 128 MiB per binding; Gemma 3's embedding
//! alone is 178 MB. Here the limits are lowered far enough that the models' matrices must split.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::{assert_close, real_model_bytes, report, tiny_model};
use pagedlm::engine::{Engine, EngineOptions, GenerateRequest, ScoreMode};
use pagedlm::gguf::Gguf;
use pagedlm::synth::{tiny_llama_gguf, SynthConfig};
use serde_json::Value;

const LLAMACPP: &str = include_str!("data/llamacpp_public.json");

/// |lowered − default| per logit: abs + rel·|default|. The same blocks are multiplied either way;
/// only the split of a dispatch may change the order of a few f32 additions.
const ABS_TOL: f32 = 1e-4;
const REL_TOL: f32 = 1e-4;

/// The largest tensor of a GGUF file in bytes, with its name.
fn largest_tensor(bytes: &[u8]) -> (String, u64) {
    let gguf = Gguf::parse(bytes).unwrap();
    gguf.tensors.iter().map(|t| (t.name.clone(), gguf.tensor_data(t).len() as u64)).max_by_key(|t| t.1).unwrap()
}

/// Loads `bytes` with the binding limit lowered to `limit`, failing with what must change when
/// the engine cannot run there.
async fn load_lowered(bytes: &[u8], opts: &EngineOptions, limit: u64) -> Engine {
    let (name, size) = largest_tensor(bytes);
    assert!(size > limit, "the test is void: the largest tensor ({name}, {size} bytes) fits the {limit}-byte limit");
    let engine = Engine::load(bytes, EngineOptions { max_binding_bytes: Some(limit), ..opts.clone() }).await.unwrap_or_else(|e| {
        panic!(
            "with the storage-binding limit lowered to {limit} bytes the engine does not load: {e}. \
             The largest tensor, {name}, is {size} bytes: a matrix over the limit must be split across bindings (issue 14, item 3)"
        )
    });
    let limits = &engine.context().expect("a WebGPU engine").limits;
    assert!(
        limits.max_storage_buffer_binding_size <= limit && limits.max_buffer_size <= limit,
        "the context reports limits of {} (binding) and {} (buffer) bytes, above the {limit} asked for",
        limits.max_storage_buffer_binding_size,
        limits.max_buffer_size
    );
    engine
}

/// Greedy tokens from `prompt`, then the teacher-forced logits of the whole sequence through
/// the decode path: (tokens, rows).
async fn greedy_and_logits(engine: &mut Engine, prompt: &[u32], n: u32) -> (Vec<u32>, Vec<Vec<f32>>) {
    let request = GenerateRequest { max_tokens: n, ignore_eos: true, ..Default::default() };
    let g = engine.generate(prompt, &request, &mut |_| true).await.unwrap_or_else(|e| panic!("generation failed: {e}"));
    let ids = [prompt, &g.tokens].concat();
    let rows = engine.score_logits(&ids, prompt.len(), ScoreMode::Decode).await.unwrap_or_else(|e| panic!("scoring failed: {e}"));
    (g.tokens, rows)
}

async fn same_as_default(what: &str, bytes: &[u8], opts: EngineOptions, limit: u64, prompt: &[u32], n: u32) {
    let (want_tokens, want_rows) = greedy_and_logits(&mut Engine::load(bytes, opts.clone()).await.unwrap(), prompt, n).await;
    let mut lowered = load_lowered(bytes, &opts, limit).await;
    let (tokens, rows) = greedy_and_logits(&mut lowered, prompt, n).await;
    assert_eq!(tokens, want_tokens, "{what}: greedy tokens with a {limit}-byte binding limit differ from the device's own limits");
    assert_eq!(rows.len(), want_rows.len());
    let mut max_diff = 0f32;
    for (i, (row, want)) in rows.iter().zip(&want_rows).enumerate() {
        assert_close(&format!("{what}: logits at scored position {i}"), row, want, ABS_TOL, REL_TOL);
        max_diff = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(max_diff, f32::max);
    }
    report(&format!("binding limit {what}: {limit} bytes, {} greedy tokens equal, max |Δlogit| {max_diff:.2e}", tokens.len()));
}

#[test]
fn smollm2_with_a_16_mib_binding_limit_matches_the_default_limits() {
    pollster::block_on(async {
        let bytes = real_model_bytes().await;
        let l: Value = serde_json::from_str(LLAMACPP).unwrap();
        let r = l["results"].as_array().unwrap().iter().find(|r| r["id"] == "pub_raw_capital").expect("pub_raw_capital");
        let prompt: Vec<u32> = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let opts = EngineOptions { max_context: 128, ..Default::default() };
        same_as_default("SmolLM2", &bytes, opts, 16 << 20, &prompt, 8).await;
    });
}

#[test]
fn a_synthetic_model_with_a_64_kib_binding_limit_matches_the_default_limits() {
    pollster::block_on(async {
        // Wide enough that the embedding (259 × 512 Q8_0, 141 KB) and the attention projections
        // (512 × 512 Q4_1, 164 KB) are over 64 KiB; short prefill chunks keep the activations
        // under it.
        let synth = SynthConfig { hidden: 512, ffn: 256, n_heads: 8, n_kv_heads: 4, seed: 21, ..SynthConfig::tiny() };
        let bytes = tiny_llama_gguf(&synth);
        let opts = EngineOptions { max_context: 64, prefill_chunk: 16, ..Default::default() };
        let prompt: Vec<u32> = (0..20).map(|i| 3 + (i * 37) % 250).collect();
        same_as_default("synthetic", &bytes, opts, 64 << 10, &prompt, 12).await;
    });
}

/// A limit under what any device offers is refused with the reason, not run.
#[test]
fn a_binding_limit_below_the_minimum_is_refused() {
    pollster::block_on(async {
        let err = Engine::load(&tiny_model(1), EngineOptions { max_binding_bytes: Some(1024), ..Default::default() }).await.err();
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("1024 bytes"), "a 1 KiB limit must be refused naming it, got {message:?}");
    });
}
