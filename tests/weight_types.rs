//! Every weight type through the whole engine, on synthetic llama models written by the test: each
//! type alone against the CPU float64 recompute of the same file, and a mixed file as a "Q4_K_M"
//! one is (a different type per role, stacks of parts of different types, an untied output
//! projection of a third type) through every path: contiguous and paged KV, INT8 KV, the prefix
//! cache, batching and snapshots, whose fingerprint tells files apart. The mixed file runs natively
//! and in the browser; each type alone natively (in the browser tests/kernels_matmul.rs checks
//! every type's kernels, and the mixed file holds 9 of the 13 types).
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;

use pagedlm::engine::{Engine, EngineError, EngineOptions, Event, GenerateRequest, KvDtype, KvLayout, ScoreMode};
use pagedlm::gguf::{GgmlType, Gguf};
use pagedlm::kv::snapshot::SnapshotError;
use pagedlm::kv::KvError;
use pagedlm::model::reference::forward_cpu;
use pagedlm::model::ModelConfig;
use pagedlm::rng::Rng;
use pagedlm::synth::{tiny_llama_gguf, SynthConfig};

/// |GPU f32 − CPU f64| on every logit: both dequantize the same blocks; what remains is f32
/// accumulation over a few hundred terms per dot product (as in tests/tiny_model.rs).
const LOGIT_TOL: f32 = 2e-3;

/// A synthetic model whose matrices can be any type: hidden and FFN whole 256-value K-quant blocks.
fn base_model(seed: u64) -> Vec<u8> {
    let synth = SynthConfig { hidden: 256, ffn: 512, n_heads: 4, n_kv_heads: 2, seed, ..SynthConfig::tiny() };
    tiny_llama_gguf(&synth)
}

/// The roles of a llama.cpp "Q4_K_M" file, each a different type here: q and k Q5_0 with v Q8_0
/// (one stack, two types), gate Q4_K with up Q5_K, down Q6_K, the output Q2_K, the embedding Q3_K.
fn mixed_type(name: &str) -> Option<GgmlType> {
    let role = name.rsplit('.').nth(1).unwrap_or("");
    Some(match role {
        "token_embd" => GgmlType::Q3_K,
        "attn_q" | "attn_k" => GgmlType::Q5_0,
        "attn_v" => GgmlType::Q8_0,
        "attn_output" => GgmlType::BF16,
        "ffn_gate" => GgmlType::Q4_K,
        "ffn_up" => GgmlType::Q5_K,
        "ffn_down" => GgmlType::Q6_K,
        _ => return None,
    })
}

fn mixed_model(seed: u64) -> Vec<u8> {
    common::retyped(&base_model(seed), &mixed_type, Some(GgmlType::Q2_K))
}

fn random_ids(rng: &mut Rng, n: usize, vocab: u32) -> Vec<u32> {
    (0..n).map(|_| 3 + rng.below(vocab as u64 - 3) as u32).collect()
}

/// Asserts that the engine's logits of `ids` (prefill, then decode from the middle) are the CPU recompute's.
async fn assert_matches_cpu(what: &str, bytes: &[u8], opts: EngineOptions, ids: &[u32]) {
    let gguf = Gguf::parse(bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let reference = forward_cpu(&gguf, &cfg, ids).unwrap();
    // The matmuls multiply the activations themselves (the default, asked for explicitly): int8
    // activations are further from the f64 recompute than LOGIT_TOL.
    let mut engine = Engine::load(bytes, EngineOptions { int8_activations: Some(false), ..opts }).await.unwrap();
    for (mode, from) in [(ScoreMode::Prefill, 1), (ScoreMode::Decode, ids.len() / 2)] {
        let rows = engine.score_logits(ids, from, mode).await.unwrap();
        for (i, row) in rows.iter().enumerate() {
            let want = &reference[from - 1 + i];
            let d = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(d <= LOGIT_TOL, "{what} {mode:?}: position {} differs by {d}", from - 1 + i);
        }
        engine.kv_cache().check_integrity().unwrap();
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn every_type_alone_matches_the_cpu_recompute() {
    pollster::block_on(async {
        let base = base_model(51);
        let vocab = ModelConfig::from_gguf(&Gguf::parse(&base).unwrap()).unwrap().vocab;
        let ids = random_ids(&mut Rng::new(5), 20, vocab);
        for t in GgmlType::SUPPORTED {
            let bytes = common::retyped(&base, &|name| mixed_type(name).map(|_| t), None);
            let held = Gguf::parse(&bytes).unwrap().tensors.iter().filter(|i| i.ggml_type == t).count();
            assert!(held >= 15, "{}: only {held} tensors re-encoded", t.name());
            let opts = EngineOptions { prefill_chunk: 8, max_context: 64, ..Default::default() };
            assert_matches_cpu(&t.name(), &bytes, opts, &ids).await;
        }
    })
}

gpu_test! {
    async fn a_mixed_file_matches_the_cpu_recompute_with_contiguous_and_paged_kv() {
        let bytes = mixed_model(52);
        let vocab = ModelConfig::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap().vocab;
        let ids = random_ids(&mut Rng::new(6), 40, vocab);
        for (layout, block_size) in [(KvLayout::Contiguous, 16), (KvLayout::Paged, 16), (KvLayout::Paged, 5)] {
            let opts = EngineOptions { prefill_chunk: 7, max_context: 64, kv_layout: layout, block_size, ..Default::default() };
            assert_matches_cpu(&format!("mixed {layout:?} block {block_size}"), &bytes, opts, &ids).await;
        }
    }
}

/// Runs every submitted request to the end; tokens and prefix hits per request.
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

gpu_test! {
    async fn a_mixed_file_runs_int8_kv_the_prefix_cache_batching_and_snapshots() {
        let bytes = mixed_model(53);
        let mut rng = Rng::new(7);
        let system = random_ids(&mut rng, 24, 259);
        let prompts: Vec<Vec<u32>> = (0..3).map(|_| [system.clone(), random_ids(&mut rng, 6, 259)].concat()).collect();
        let request = GenerateRequest { max_tokens: 8, ignore_eos: true, ..Default::default() };
        for kv_dtype in [KvDtype::F32, KvDtype::Int8] {
            let opts = EngineOptions { max_context: 96, kv_dtype, block_size: 8, ..Default::default() };
            // Alone, one after the other: the second and third reuse the shared system prompt.
            let mut alone = Engine::load(&bytes, opts.clone()).await.unwrap();
            let mut want = Vec::new();
            for (i, p) in prompts.iter().enumerate() {
                let g = alone.generate(p, &request, &mut |_| true).await.unwrap();
                if i > 0 {
                    assert!(g.prefix_hit_tokens >= 16, "{kv_dtype:?}: prompt {i} reused {} tokens", g.prefix_hit_tokens);
                }
                want.push(g.tokens);
            }
            // Batched: the same tokens.
            let mut batched = Engine::load(&bytes, opts.clone()).await.unwrap();
            let ids: Vec<u64> = prompts.iter().map(|p| batched.submit(p.clone(), request.clone()).unwrap().0).collect();
            let done = finish_all(&mut batched).await;
            for (i, id) in ids.iter().enumerate() {
                assert_eq!(done[id].0, want[i], "{kv_dtype:?}: batched request {i} differs from running alone");
            }
            // A snapshot of the first conversation continues in a fresh engine as it does in place.
            let history = [prompts[0].clone(), want[0].clone()].concat();
            let snapshot = alone.export_snapshot(&history).await.unwrap();
            let next = [history.clone(), random_ids(&mut rng, 4, 259)].concat();
            let in_place = alone.generate(&next, &request, &mut |_| true).await.unwrap();
            let mut target = Engine::load(&bytes, opts.clone()).await.unwrap();
            assert_eq!(target.import_snapshot(&snapshot).unwrap(), history);
            let moved = target.generate(&next, &request, &mut |_| true).await.unwrap();
            assert_eq!(moved.prefix_hit_tokens as usize, history.len());
            assert_eq!(moved.tokens, in_place.tokens, "{kv_dtype:?}: tokens differ after the transfer");
            // The same shapes with other weights (here: all Q4_1) have another fingerprint.
            let plain = common::retyped(&base_model(53), &|name| mixed_type(name).map(|_| GgmlType::Q4_1), None);
            let mut other = Engine::load(&plain, opts).await.unwrap();
            match other.import_snapshot(&snapshot) {
                Err(EngineError::Kv(KvError::Snapshot(SnapshotError::Mismatch { what, .. }))) => {
                    assert!(what.contains("model"), "{kv_dtype:?}: refused for {what}, not the model")
                }
                other => panic!("{kv_dtype:?}: a snapshot of another file must be refused, got {:?}", other.map(|t| t.len())),
            }
        }
    }
}
