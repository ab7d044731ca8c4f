//! Speculative decoding (src/speculate.rs, the scheduler's verification steps) on tiny synthetic
//! models, on both backends: with drafts from prompt lookup, from a prediction that is the
//! output itself, and from a prediction with mistakes in it, greedy and sampled requests (with
//! a repetition penalty, whose window then holds the draft) give exactly the tokens they give
//! with speculation off, alone and 8 at a time, on f32 and INT8 K/V; the drafts are taken where
//! they are right (the usage counts them) and the cache holds no rejected row afterwards. On the
//! GPU, verification steps are planned ahead of the step in flight with the same tokens.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;

use common::tiny_model;

use pagedlm::engine::{BackendChoice, Engine, EngineOptions, Event, GenerateRequest, Generation, KvDtype, Prediction, RequestId, SchedConfig, Speculative};
use pagedlm::rng::Rng;
use pagedlm::sampler::SamplingParams;

/// A prompt whose second half repeats pieces of its first (prompt lookup finds them).
fn prompt(rng: &mut Rng) -> Vec<u32> {
    let piece: Vec<u32> = (0..12).map(|_| 3 + rng.below(200) as u32).collect();
    let mut p = piece.clone();
    p.extend((0..5).map(|_| 3 + rng.below(200) as u32));
    p.extend(&piece[..6]);
    p
}

/// The requests: greedy, sampled, and sampled with a repetition penalty.
fn requests() -> Vec<GenerateRequest> {
    let sampled = SamplingParams { temperature: 0.9, top_p: 0.95, seed: 3, ..SamplingParams::greedy() };
    let penalized = SamplingParams { temperature: 0.7, repetition_penalty: 1.3, repetition_window: 16, seed: 4, ..SamplingParams::greedy() };
    [SamplingParams::greedy(), sampled, penalized]
        .into_iter()
        .map(|sampling| GenerateRequest { max_tokens: 24, sampling, ignore_eos: true, ..Default::default() })
        .collect()
}

/// Runs every request (8 at most at a time) to its end, checking the cache after each step.
async fn run(engine: &mut Engine, work: &[(Vec<u32>, GenerateRequest)]) -> Vec<Generation> {
    let ids: Vec<RequestId> = work.iter().map(|(p, r)| engine.submit(p.clone(), r.clone()).unwrap()).collect();
    let mut done: HashMap<RequestId, Generation> = HashMap::new();
    while engine.has_work() {
        for e in engine.step().await.unwrap() {
            if let Event::Finished { id, result } = e {
                done.insert(id, result.unwrap_or_else(|e| panic!("request {id:?} failed: {e}")));
            }
        }
        engine.kv_cache().check_integrity().unwrap();
    }
    ids.iter().map(|id| done.remove(id).expect("every request finishes")).collect()
}

fn options(backend: BackendChoice, kv_dtype: KvDtype, max_batch: u32, speculative: Speculative) -> EngineOptions {
    let sched = SchedConfig { max_batch, step_tokens: 64, speculative, ..Default::default() };
    EngineOptions { backend, max_context: 128, pool_tokens: 1024, block_size: 8, kv_dtype, sched, check_integrity: true, ..Default::default() }
}

gpu_test! {
    async fn drafts_change_no_token_alone_or_batched_on_both_backends() {
        let bytes = tiny_model(41);
        let mut rng = Rng::new(40);
        let prompts: Vec<Vec<u32>> = (0..3).map(|_| prompt(&mut rng)).collect();
        let mut work = Vec::new();
        for p in &prompts {
            for r in requests() {
                work.push((p.clone(), r));
            }
        }
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            for kv_dtype in [KvDtype::F32, KvDtype::Int8] {
                let mut off = Engine::load(&bytes, options(backend, kv_dtype, 1, Speculative::Off)).await.unwrap();
                let want = run(&mut off, &work).await;
                assert!(want.iter().all(|g| g.accepted_prediction_tokens + g.rejected_prediction_tokens == 0), "drafts with speculation off");
                // Predictions (as token ids: this byte vocabulary's random output is no UTF-8):
                // the output itself, and the output with every fifth token wrong.
                let exact: Vec<Prediction> = want.iter().map(|g| Prediction::Tokens(g.tokens.clone())).collect();
                let wrong: Vec<Prediction> = want
                    .iter()
                    .map(|g| Prediction::Tokens(g.tokens.iter().enumerate().map(|(i, &t)| if i % 5 == 4 { 3 + (t + 7) % 200 } else { t }).collect()))
                    .collect();
                for max_batch in [1u32, 8] {
                    let mut on = Engine::load(&bytes, options(backend, kv_dtype, max_batch, Speculative::Auto)).await.unwrap();
                    let what = format!("{backend:?} {kv_dtype:?} batch {max_batch}");
                    for (source, predictions) in [("prompt lookup", None), ("an exact prediction", Some(&exact)), ("a wrong prediction", Some(&wrong))] {
                        let with: Vec<(Vec<u32>, GenerateRequest)> = work
                            .iter()
                            .enumerate()
                            .map(|(k, (p, r))| (p.clone(), GenerateRequest { prediction: predictions.map(|x| x[k].clone()), ..r.clone() }))
                            .collect();
                        let got = run(&mut on, &with).await;
                        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(g.tokens, w.tokens, "{what}, {source}: request {k} ({:?}) differs from its run without drafts", work[k].1.sampling);
                        }
                        let accepted: u32 = got.iter().map(|g| g.accepted_prediction_tokens).sum();
                        let rejected: u32 = got.iter().map(|g| g.rejected_prediction_tokens).sum();
                        common::report(&format!("{what}, {source}: {accepted} draft tokens accepted, {rejected} rejected"));
                        if source == "an exact prediction" {
                            let generated: u32 = got.iter().map(|g| g.tokens.len() as u32).sum();
                            assert!(accepted * 2 > generated, "{what}: an exact prediction gave only {accepted} of {generated} tokens");
                        }
                        if source == "a wrong prediction" {
                            assert!(accepted > 0 && rejected > 0, "{what}: a partly wrong prediction: {accepted} accepted, {rejected} rejected");
                        }
                    }
                    on.reset_cache().unwrap();
                    let pool = on.stats().pool;
                    assert_eq!(pool.blocks_free, pool.blocks_total, "{what}: blocks leaked");
                }
            }
        }
    }
}

gpu_test! {
    async fn on_the_gpu_verification_steps_are_planned_ahead_with_the_same_tokens() {
        // Greedy and sampled requests without a penalty draft in steps planned ahead of the one in
        // flight: exact predictions (whole drafts taken) and wrong ones (drafts cut, the rows
        // planned past them discarded) give the tokens of a run without drafts, and the steps go
        // ahead, so the loop does not wait on a readback to draft, except past a draft likely cut.
        let bytes = tiny_model(41);
        let mut rng = Rng::new(44);
        let sampled = SamplingParams { temperature: 0.9, top_p: 0.95, seed: 5, ..SamplingParams::greedy() };
        let mut work = Vec::new();
        for _ in 0..3 {
            let p = prompt(&mut rng);
            for sampling in [SamplingParams::greedy(), sampled.clone()] {
                work.push((p.clone(), GenerateRequest { max_tokens: 40, sampling, ignore_eos: true, ..Default::default() }));
            }
        }
        let mut off = Engine::load(&bytes, options(BackendChoice::Webgpu, KvDtype::F32, 1, Speculative::Off)).await.unwrap();
        let want = run(&mut off, &work).await;
        let exact: Vec<Prediction> = want.iter().map(|g| Prediction::Tokens(g.tokens.clone())).collect();
        let wrong: Vec<Prediction> = want
            .iter()
            .map(|g| Prediction::Tokens(g.tokens.iter().enumerate().map(|(i, &t)| if i % 7 == 6 { 3 + (t + 11) % 200 } else { t }).collect()))
            .collect();
        for max_batch in [1u32, 6] {
            let mut on = Engine::load(&bytes, options(BackendChoice::Webgpu, KvDtype::F32, max_batch, Speculative::Auto)).await.unwrap();
            for (source, predictions) in [("an exact prediction", &exact), ("a wrong prediction", &wrong)] {
                let with: Vec<(Vec<u32>, GenerateRequest)> =
                    work.iter().zip(predictions).map(|((p, r), x)| (p.clone(), GenerateRequest { prediction: Some(x.clone()), ..r.clone() })).collect();
                let before = on.sched_stats();
                let got = run(&mut on, &with).await;
                let after = on.sched_stats();
                let what = format!("batch {max_batch}, {source}");
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.tokens, w.tokens, "{what}: request {k} differs from its run without drafts");
                }
                let accepted: u32 = got.iter().map(|g| g.accepted_prediction_tokens).sum();
                let rejected: u32 = got.iter().map(|g| g.rejected_prediction_tokens).sum();
                let (steps, ahead) = (after.steps - before.steps, after.steps_ahead - before.steps_ahead);
                let held = after.drafts_held - before.drafts_held;
                common::report(&format!(
                    "{what}: {ahead} of {steps} steps planned ahead, {held} times held after a doubtful draft; {accepted} draft tokens accepted, {rejected} rejected"
                ));
                assert!(accepted > 0, "{what}: no draft taken");
                if source == "a wrong prediction" {
                    assert!(rejected > 0, "{what}: no draft cut");
                } else {
                    assert_eq!(held, 0, "{what}: drafts taken whole are planned past");
                }
                // Only a request's prefill step and the step after it cannot go ahead, and a step
                // past a draft likely cut (a sequence is held for it, the others go on).
                assert!(steps - ahead <= 2 * work.len() as u64 + held, "{what}: only {ahead} of {steps} steps planned ahead");
            }
            on.reset_cache().unwrap();
            let pool = on.stats().pool;
            assert_eq!(pool.blocks_free, pool.blocks_total, "batch {max_batch}: blocks leaked");
        }
    }
}

gpu_test! {
    async fn stop_strings_and_token_limits_end_inside_an_accepted_draft() {
        let bytes = tiny_model(42);
        let mut rng = Rng::new(41);
        let p = prompt(&mut rng);
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            let mut off = Engine::load(&bytes, options(backend, KvDtype::F32, 1, Speculative::Off)).await.unwrap();
            let base = GenerateRequest { max_tokens: 20, ignore_eos: true, ..Default::default() };
            let full = off.generate(&p, &base, &mut |_| true).await.unwrap();
            let text = full.text.clone();
            // A stop string from the middle of the output, and a token limit mid-draft.
            let cut = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
            let stop: String = text[cut..].chars().take(2).collect();
            let stopped = GenerateRequest { stop: vec![stop.clone()], ..base.clone() };
            let limited = GenerateRequest { max_tokens: 9, ..base.clone() };
            let mut on = Engine::load(&bytes, options(backend, KvDtype::F32, 1, Speculative::Auto)).await.unwrap();
            for r in [stopped, limited] {
                let want = off.generate(&p, &r, &mut |_| true).await.unwrap();
                let got = on.generate(&p, &GenerateRequest { prediction: Some(Prediction::Tokens(full.tokens.clone())), ..r.clone() }, &mut |_| true).await.unwrap();
                assert_eq!((&got.tokens, &got.text, got.finish_reason), (&want.tokens, &want.text, want.finish_reason), "{backend:?}: stop {:?}, max_tokens {}", r.stop, r.max_tokens);
                assert!(got.accepted_prediction_tokens > 0, "{backend:?}: the prediction was never taken");
                let seqs = on.sched_stats();
                assert_eq!(seqs.running, 0);
            }
            // A predicted token outside the vocabulary is refused when the request is submitted.
            let bad = GenerateRequest { prediction: Some(Prediction::Tokens(vec![5, 1 << 30])), ..base.clone() };
            assert!(on.submit(p.clone(), bad).is_err(), "{backend:?}: a prediction past the vocabulary");
        }
    }
}

gpu_test! {
    // Constrained requests draft too: every verified row chooses under the mask of the
    // constraint's state after the draft tokens before it, and a draft token the grammar
    // forbids ends the draft there. Greedy and sampled, on both backends: the tokens of
    // speculation off, and the output still matches.
    async fn constrained_requests_draft_under_each_rows_mask() {
        let bytes = tiny_model(44);
        let prompt: Vec<u32> = (0..12).map(|i| 3 + (i * 11) % 90).collect();
        let lark = "start: \"id=\" NUM (\",\" NUM)*\nNUM: /[1-9][0-9]?/\n";
        let constraint = Some(pagedlm::engine::Constraint::Lark(lark.into()));
        let sampled = SamplingParams { temperature: 0.8, seed: 9, ..SamplingParams::greedy() };
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            for sampling in [SamplingParams::greedy(), sampled.clone()] {
                let base = GenerateRequest { max_tokens: 24, sampling, constraint: constraint.clone(), ..Default::default() };
                let mut off = Engine::load(&bytes, options(backend, KvDtype::F32, 1, Speculative::Off)).await.unwrap();
                let want = off.generate(&prompt, &base, &mut |_| true).await.unwrap();
                let mut on = Engine::load(&bytes, options(backend, KvDtype::F32, 1, Speculative::Auto)).await.unwrap();
                // The output as its prediction, then with a token no grammar state allows ("x")
                // in its middle: drafts taken, then cut before the forbidden token.
                let mut broken = want.tokens.clone();
                let x = off.tokenizer().encode("x").unwrap();
                assert_eq!(x.len(), 1);
                broken.insert(broken.len() / 2, x[0]);
                for (what, prediction) in [("its own output", want.tokens.clone()), ("a forbidden token in it", broken)] {
                    let r = GenerateRequest { prediction: Some(Prediction::Tokens(prediction)), ..base.clone() };
                    let got = on.generate(&prompt, &r, &mut |_| true).await.unwrap();
                    let case = format!("{backend:?}, {:?}, {what}", base.sampling.temperature);
                    assert_eq!((&got.tokens, &got.text), (&want.tokens, &want.text), "{case}");
                    assert!(got.text.starts_with("id="), "{case}: {:?}", got.text);
                    assert!(got.accepted_prediction_tokens > 0, "{case}: no draft was taken");
                }
            }
        }
    }
}
