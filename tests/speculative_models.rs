//! Speculative decoding on the real models (SmolLM2-135M, Gemma 3 270M), natively on both
//! backends (the CPU kernels, and WebGPU on lavapipe), with f32 and INT8 K/V: greedy replies to
//! eight prompts that ask the model to copy or edit text are token for token the ones speculation
//! off gives, each request alone and the eight in one batch, with drafts taken (prompt lookup
//! finds the text being copied). A χ² test on a tiny model checks that sampled tokens keep their
//! distribution.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::collections::HashMap;

use common::{gemma_model_bytes, real_model_bytes, tiny_model};
use pagedlm::engine::{BackendChoice, Engine, EngineOptions, Event, GenerateRequest, KvDtype, Prediction, RequestId, SchedConfig, Speculative};
use pagedlm::sampler::SamplingParams;

const SENTENCES: [&str; 8] = [
    "Alice was beginning to get very tired of sitting by her sister on the bank.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please rename the variable count to total in this line: count = count + 1",
    "Turn this list into JSON: apples 3, pears 5, plums 7.",
    "Fix the typos: Teh cat sat on teh mat adn slept all day.",
    "Copy this exactly: one two three four five six seven eight nine ten.",
    "Say it again: the rain in Spain stays mainly in the plain.",
    "Repeat: to be or not to be, that is the question.",
];
const TOKENS: u32 = 12;

/// Runs the requests to their ends, with `max_batch` at a time; tokens and drafts taken, in order.
async fn run(engine: &mut Engine, prompts: &[Vec<u32>], request: &GenerateRequest) -> Vec<(Vec<u32>, u32)> {
    let ids: Vec<RequestId> = prompts.iter().map(|p| engine.submit(p.clone(), request.clone()).unwrap()).collect();
    let mut done = HashMap::new();
    while engine.has_work() {
        for e in engine.step().await.unwrap() {
            if let Event::Finished { id, result } = e {
                let g = result.unwrap();
                done.insert(id, (g.tokens, g.accepted_prediction_tokens));
            }
        }
    }
    ids.iter().map(|id| done.remove(id).unwrap()).collect()
}

fn options(backend: BackendChoice, kv_dtype: KvDtype, max_batch: u32, speculative: Speculative) -> EngineOptions {
    let sched = SchedConfig { max_batch, speculative, ..Default::default() };
    EngineOptions { backend, kv_dtype, max_context: 256, sched, check_integrity: true, ..Default::default() }
}

async fn same_tokens_with_drafts(name: &str, bytes: &[u8]) {
    let request = GenerateRequest { max_tokens: TOKENS, ..Default::default() };
    for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
        for kv_dtype in [KvDtype::F32, KvDtype::Int8] {
            let what = format!("{name} {backend:?} {kv_dtype:?}");
            let mut off = Engine::load(bytes, options(backend, kv_dtype, 8, Speculative::Off)).await.unwrap();
            let prompts: Vec<Vec<u32>> = SENTENCES.iter().map(|s| off.text_prompt(&format!("Text: {s}\nThe same text again: ")).unwrap()).collect();
            let want = run(&mut off, &prompts, &request).await;
            drop(off);
            for max_batch in [1u32, 8] {
                let mut on = Engine::load(bytes, options(backend, kv_dtype, max_batch, Speculative::Auto)).await.unwrap();
                let got = run(&mut on, &prompts, &request).await;
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.0, w.0, "{what}, batch {max_batch}: prompt {k} ({:?}) differs with drafts", SENTENCES[k]);
                }
                let taken: u32 = got.iter().map(|g| g.1).sum();
                common::report(&format!("{what}, batch {max_batch}: {taken} of {} tokens from drafts", TOKENS * 8));
                assert!(taken > 0, "{what}, batch {max_batch}: no draft was ever taken");
            }
        }
    }
}

#[test]
fn smollm2_greedy_replies_are_the_same_with_drafts() {
    pollster::block_on(async { same_tokens_with_drafts("SmolLM2", &real_model_bytes().await).await });
}

#[test]
fn gemma3_greedy_replies_are_the_same_with_drafts() {
    pollster::block_on(same_tokens_with_drafts("Gemma 3", &gemma_model_bytes()));
}

/// Sampled tokens keep their distribution: over 400 seeds each (two disjoint sets), the fourth
/// token a tiny model samples (T 0.5), with its greedy reply as the prediction (drafts taken and
/// refused), is distributed as with speculation off: a two-sample χ² over the tokens seen at
/// least 10 times (the rest pooled) under the 0.999 quantile, with drafts taken often enough to
/// matter.
#[test]
fn sampled_tokens_keep_their_distribution() {
    pollster::block_on(async {
        let bytes = tiny_model(43);
        let prompt: Vec<u32> = (0..16).map(|i| 3 + (i * 7) % 50).collect();
        let mut counts: [HashMap<u32, f64>; 2] = [HashMap::new(), HashMap::new()];
        let mut taken = 0u32;
        let greedy = GenerateRequest { max_tokens: 4, ignore_eos: true, ..Default::default() };
        let mut first = Engine::load(&bytes, options(BackendChoice::Cpu, KvDtype::F32, 1, Speculative::Off)).await.unwrap();
        let reply = first.generate(&prompt, &greedy, &mut |_| true).await.unwrap().tokens;
        for (mode, speculative) in [Speculative::Off, Speculative::Auto].into_iter().enumerate() {
            let mut engine = Engine::load(&bytes, options(BackendChoice::Cpu, KvDtype::F32, 8, speculative)).await.unwrap();
            // Seeds in two disjoint sets: the two runs are independent samples.
            let seeds: Vec<u64> = (0..400).map(|s| 1000 * mode as u64 + s).collect();
            let requests: Vec<GenerateRequest> = seeds
                .iter()
                .map(|&seed| {
                    let sampling = SamplingParams { temperature: 0.5, seed, ..SamplingParams::greedy() };
                    // The greedy reply as the prediction: taken often, refused often.
                    GenerateRequest { sampling, prediction: Some(Prediction::Tokens(reply.clone())), ..greedy.clone() }
                })
                .collect();
            for chunk in requests.chunks(8) {
                for r in chunk {
                    engine.submit(prompt.clone(), r.clone()).unwrap();
                }
                while engine.has_work() {
                    for e in engine.step().await.unwrap() {
                        if let Event::Finished { result, .. } = e {
                            let g = result.unwrap();
                            taken += g.accepted_prediction_tokens;
                            *counts[mode].entry(g.tokens[3]).or_default() += 1.0;
                        }
                    }
                }
            }
        }
        assert!(taken >= 20, "drafts were taken {taken} times: too few to test anything");
        // χ² of a two-sample test over the pooled categories.
        let mut tokens: Vec<u32> = counts[0].keys().chain(counts[1].keys()).copied().collect();
        tokens.sort();
        tokens.dedup();
        let (mut cats, mut rest) = (Vec::new(), [0.0f64; 2]);
        for t in tokens {
            let (a, b) = (counts[0].get(&t).copied().unwrap_or(0.0), counts[1].get(&t).copied().unwrap_or(0.0));
            if a + b >= 10.0 {
                cats.push([a, b]);
            } else {
                rest[0] += a;
                rest[1] += b;
            }
        }
        if rest[0] + rest[1] > 0.0 {
            cats.push(rest);
        }
        // Two samples of the same size: χ² = Σ (a - b)² / (a + b).
        let chi2: f64 = cats.iter().map(|c| (c[0] - c[1]).powi(2) / (c[0] + c[1])).sum();
        let df = cats.len().saturating_sub(1).max(1) as f64;
        // The 0.999 quantile of χ²(df), by Wilson-Hilferty.
        let z = 3.09;
        let limit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        common::report(&format!("χ² {chi2:.1} over {} categories (limit {limit:.1}); {taken} draft tokens taken", cats.len()));
        assert!(cats.len() >= 3, "too few distinct tokens to compare: {cats:?}");
        assert!(chi2 < limit, "the sampled tokens' distribution moved with drafts: χ² {chi2:.1} ≥ {limit:.1} ({cats:?})");
    });
}
