//! Continuous batching on tiny synthetic models: requests batched together give the tokens they
//! give alone; a long randomized run with arrivals, aborts and a pool small enough to force
//! eviction and preemption keeps the cache consistent after every step and accounts for every
//! request; requests running together share a system prompt's K/V, computed once.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;

use common::tiny_model;

use pagedlm::engine::{Constraint, Event, RequestId, SchedConfig};
use pagedlm::engine::{Engine, EngineOptions, FinishReason, GenerateRequest, KvDtype};
use pagedlm::rng::Rng;
use pagedlm::sampler::SamplingParams;

fn ids(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 3 + rng.below(256) as u32).collect()
}

/// Runs every submitted request to the end, with `check_integrity()` after every step, and
/// returns its generation, whose tokens must equal what was streamed (`streamed`: tokens of
/// steps the caller ran itself).
async fn finish_all(engine: &mut Engine, mut streamed: HashMap<RequestId, Vec<u32>>) -> HashMap<RequestId, pagedlm::engine::Generation> {
    let mut done = HashMap::new();
    while engine.has_work() {
        for e in engine.step().await.unwrap() {
            match e {
                Event::Admitted { .. } => {}
                Event::Token { id, token, .. } => streamed.entry(id).or_default().push(token),
                Event::Finished { id, result } => {
                    let g = result.unwrap_or_else(|e| panic!("request {id:?} failed: {e}"));
                    assert_eq!(streamed.get(&id).cloned().unwrap_or_default(), g.tokens, "streamed tokens differ from the result");
                    done.insert(id, g);
                }
            }
        }
        engine.kv_cache().check_integrity().unwrap();
    }
    done
}

/// Tokens per request from a batched run.
async fn run_batched(engine: &mut Engine, prompts: &[(Vec<u32>, GenerateRequest)]) -> HashMap<RequestId, (Vec<u32>, FinishReason)> {
    for (p, r) in prompts {
        engine.submit(p.clone(), r.clone()).unwrap();
    }
    let done: HashMap<_, _> = finish_all(engine, HashMap::new()).await.into_iter().map(|(id, g)| (id, (g.tokens, g.finish_reason))).collect();
    assert_eq!(done.len(), prompts.len());
    done
}

gpu_test! {
    async fn batched_requests_give_the_tokens_they_give_alone() {
        let bytes = tiny_model(31);
        let mut rng = Rng::new(3);
        let system = ids(&mut rng, 12);
        let mut prompts = Vec::new();
        for i in 0..7 {
            let mut p = if i % 2 == 0 { system.clone() } else { Vec::new() };
            let n = 1 + rng.below(40) as usize;
            p.extend(ids(&mut rng, n));
            let sampling = if i == 5 { SamplingParams { temperature: 0.8, top_p: 0.9, seed: 7, ..SamplingParams::greedy() } } else { SamplingParams::greedy() };
            prompts.push((p, GenerateRequest { max_tokens: 6 + i as u32 * 3, sampling, stop: Vec::new(), ignore_eos: false, ..Default::default() }));
        }
        // Alone: one request at a time through `generate`, no prefix cache, per KV dtype.
        let mut want: HashMap<KvDtype, Vec<(Vec<u32>, FinishReason)>> = HashMap::new();
        for kv_dtype in [KvDtype::F32, KvDtype::Int8] {
            let opts = EngineOptions { max_context: 128, prefix_cache: false, kv_dtype, ..Default::default() };
            let mut alone = Engine::load(&bytes, opts).await.unwrap();
            let mut solo = Vec::new();
            for (p, r) in &prompts {
                let g = alone.generate(p, r, &mut |_| true).await.unwrap();
                solo.push((g.tokens, g.finish_reason));
            }
            want.insert(kv_dtype, solo);
        }
        // Batched: up to 4 sequences per step, prefill in chunks of at most 16 rows; INT8
        // against the INT8 solo runs (the batched attention reads the same codes).
        let configs = [(4u32, 16u32, true, KvDtype::F32), (8, 64, false, KvDtype::F32), (2, 5, true, KvDtype::F32), (4, 16, true, KvDtype::Int8)];
        for (max_batch, step_tokens, prefix_cache, kv_dtype) in configs {
            let sched = SchedConfig { max_batch, step_tokens, ..Default::default() };
            let opts = EngineOptions { max_context: 128, block_size: 8, prefix_cache, sched, check_integrity: true, kv_dtype, ..Default::default() };
            let mut engine = Engine::load(&bytes, opts).await.unwrap();
            let got = run_batched(&mut engine, &prompts).await;
            let mut ids_sorted: Vec<&RequestId> = got.keys().collect();
            ids_sorted.sort();
            for (k, id) in ids_sorted.iter().enumerate() {
                assert_eq!(
                    got[id],
                    want[&kv_dtype][k],
                    "request {k} (batch {max_batch}, step {step_tokens}, {}): tokens differ from its solo run",
                    kv_dtype.name()
                );
            }
            let stats = engine.sched_stats();
            assert_eq!(stats.finished, prompts.len() as u64);
            assert!(stats.steps > 0 && stats.running == 0 && stats.waiting == 0);
            engine.reset_cache().unwrap();
            let pool = engine.stats().pool;
            assert_eq!(pool.blocks_free, pool.blocks_total, "blocks leaked");
        }
    }
}

gpu_test! {
    async fn a_small_pool_preempts_and_every_request_still_matches_its_solo_run() {
        let bytes = tiny_model(32);
        let mut rng = Rng::new(4);
        // Sampled (seeded): this tiny model's greedy output repeats one token, which would hide a
        // token generated twice around a preemption.
        let prompts: Vec<(Vec<u32>, GenerateRequest)> = (0..6)
            .map(|k| {
                let n = 10 + rng.below(20) as usize;
                let sampling = SamplingParams { temperature: 4.0, seed: 100 + k, ..SamplingParams::greedy() };
                (ids(&mut rng, n), GenerateRequest { max_tokens: 16, sampling, ignore_eos: true, ..Default::default() })
            })
            .collect();
        let mut alone = Engine::load(&bytes, EngineOptions { max_context: 64, prefix_cache: false, ..Default::default() }).await.unwrap();
        let mut want = Vec::new();
        for (p, r) in &prompts {
            want.push(alone.generate(p, r, &mut |_| true).await.unwrap().tokens);
        }
        let repeats: usize = want.iter().map(|t| t.windows(2).filter(|w| w[0] == w[1]).count()).sum();
        let pairs: usize = want.iter().map(|t| t.len().saturating_sub(1)).sum();
        assert!(repeats * 4 < pairs, "the solo runs repeat tokens too often ({repeats} of {pairs}) to show a duplicated one: {want:?}");
        // 12 blocks of 4 tokens: 48 slots for 6 sequences of up to 45 tokens.
        let sched = SchedConfig { max_batch: 6, step_tokens: 32, ..Default::default() };
        let opts = EngineOptions { max_context: 64, block_size: 4, pool_tokens: 48, sched, check_integrity: true, ..Default::default() };
        let mut engine = Engine::load(&bytes, opts).await.unwrap();
        let got = run_batched(&mut engine, &prompts).await;
        let mut ids_sorted: Vec<&RequestId> = got.keys().collect();
        ids_sorted.sort();
        for (k, id) in ids_sorted.iter().enumerate() {
            assert_eq!(got[id].0, want[k], "request {k}: tokens differ after preemption");
        }
        assert!(engine.sched_stats().preemptions > 0, "the pool was meant to force preemption");
    }
}

gpu_test! {
    async fn requests_running_together_share_a_system_prompt_computed_once() {
        let bytes = tiny_model(34);
        let mut rng = Rng::new(5);
        // 40 tokens: 5 full blocks of 8.
        let system = ids(&mut rng, 40);
        let mut prompts: Vec<Vec<u32>> = (0..5)
            .map(|_| {
                let mut p = system.clone();
                let n = 3 + rng.below(10) as usize;
                p.extend(ids(&mut rng, n));
                p
            })
            .collect();
        prompts.push(ids(&mut rng, 20));
        let request = GenerateRequest { max_tokens: 8, ..Default::default() };
        let mut alone = Engine::load(&bytes, EngineOptions { max_context: 96, prefix_cache: false, ..Default::default() }).await.unwrap();
        let mut want = Vec::new();
        for p in &prompts {
            want.push(alone.generate(p, &request, &mut |_| true).await.unwrap().tokens);
        }
        // All submitted at once; prefill chunks of 16 rows, so the system prompt takes 3 steps.
        let mut prefill_total = HashMap::new();
        for cache_aware in [true, false] {
            let sched = SchedConfig { max_batch: 8, step_tokens: 16, cache_aware, ..Default::default() };
            let opts = EngineOptions { max_context: 96, block_size: 8, sched, check_integrity: true, ..Default::default() };
            let mut engine = Engine::load(&bytes, opts).await.unwrap();
            let order: Vec<RequestId> = prompts.iter().map(|p| engine.submit(p.clone(), request.clone()).unwrap()).collect();
            let done = finish_all(&mut engine, HashMap::new()).await;
            for (k, id) in order.iter().enumerate() {
                assert_eq!(done[id].tokens, want[k], "request {k} (cache-aware {cache_aware}): tokens differ from its solo run");
            }
            let hits: Vec<u32> = order[..5].iter().map(|id| done[id].prefix_hit_tokens).collect();
            if cache_aware {
                // One request computes the system prompt; the others wait for its blocks.
                assert_eq!(hits.iter().filter(|&&h| h == 0).count(), 1, "hits {hits:?}");
                assert!(hits.iter().filter(|&&h| h >= 40).count() == 4, "hits {hits:?}");
            } else {
                // Admitted together, before anything was computed: nothing to share.
                assert!(hits.iter().all(|&h| h == 0), "hits {hits:?}");
            }
            prefill_total.insert(cache_aware, done.values().map(|g| g.prefill_tokens).sum::<u32>());
        }
        assert!(prefill_total[&true] + 4 * 40 <= prefill_total[&false], "prompt tokens computed: {prefill_total:?}");

        // A request arriving while another still decodes shares the blocks its prompt published.
        let sched = SchedConfig { max_batch: 8, step_tokens: 16, ..Default::default() };
        let opts = EngineOptions { max_context: 96, block_size: 8, sched, check_integrity: true, ..Default::default() };
        let mut engine = Engine::load(&bytes, opts).await.unwrap();
        let long = GenerateRequest { max_tokens: 30, ignore_eos: true, ..Default::default() };
        let first = engine.submit(prompts[0].clone(), long).unwrap();
        let mut streamed: HashMap<RequestId, Vec<u32>> = HashMap::new();
        while engine.sched_stats().sequences.iter().any(|s| s.prefilling) || engine.sched_stats().steps == 0 {
            for e in engine.step().await.unwrap() {
                match e {
                    Event::Admitted { .. } => {}
                    Event::Token { id, token, .. } => streamed.entry(id).or_default().push(token),
                    Event::Finished { id, .. } => panic!("{id:?} ended before the second request came"),
                }
            }
        }
        assert!(engine.sched_stats().running == 1 && streamed[&first].len() == 1, "the first request should be decoding");
        let second = engine.submit(prompts[1].clone(), request.clone()).unwrap();
        let done = finish_all(&mut engine, streamed).await;
        assert!(done[&second].prefix_hit_tokens >= 40, "hit {} while the first request was running", done[&second].prefix_hit_tokens);
        assert_eq!(done[&second].tokens, want[1]);
        engine.reset_cache().unwrap();
        let pool = engine.stats().pool;
        assert_eq!(pool.blocks_free, pool.blocks_total, "blocks leaked");
    }
}

/// Steps of the randomized run: 10,000 natively; fewer in the browser, where every step costs a
/// submit-and-read of a few milliseconds more.
#[cfg(not(target_arch = "wasm32"))]
const RANDOM_STEPS: u64 = 10_000;
#[cfg(target_arch = "wasm32")]
const RANDOM_STEPS: u64 = 800;

gpu_test! {
    async fn a_long_random_run_keeps_the_cache_consistent_and_loses_no_request() {
        let bytes = tiny_model(33);
        let sched = SchedConfig { max_batch: 5, step_tokens: 24, age_limit: 20, ..Default::default() };
        let opts = EngineOptions { max_context: 64, block_size: 4, pool_tokens: 64, sched, check_integrity: true, ..Default::default() };
        let mut engine = Engine::load(&bytes, opts).await.unwrap();
        let mut rng = Rng::new(99);
        let systems: Vec<Vec<u32>> = (0..3).map(|k| ids(&mut Rng::new(k), 9)).collect();
        let mut submitted: Vec<RequestId> = Vec::new();
        let mut outcome: HashMap<RequestId, String> = HashMap::new();
        let (mut steps, mut aborts) = (0u64, 0u32);
        while steps < RANDOM_STEPS {
            // Arrivals: bursts, shared system prompts, lengths up to the context limit.
            if rng.below(16) == 0 {
                for _ in 0..1 + rng.below(2) {
                    let mut p = if rng.below(2) == 0 { systems[rng.below(3) as usize].clone() } else { Vec::new() };
                    let n = 1 + rng.below(40) as usize;
                    p.extend(ids(&mut rng, n));
                    let max_tokens = 1 + rng.below(30) as u32;
                    let sampling = if rng.below(4) == 0 { SamplingParams { temperature: 1.0, seed: rng.below(1000), ..SamplingParams::greedy() } } else { SamplingParams::greedy() };
                    submitted.push(engine.submit(p, GenerateRequest { max_tokens, sampling, stop: Vec::new(), ignore_eos: false, ..Default::default() }).unwrap());
                }
            }
            // Aborts of random requests, waiting or running.
            if rng.below(25) == 0 && !submitted.is_empty() {
                let id = submitted[rng.below(submitted.len() as u64) as usize];
                if let Some(g) = engine.abort(id).unwrap() {
                    assert_eq!(g.finish_reason, FinishReason::Abort);
                    assert!(outcome.insert(id, "abort".into()).is_none(), "{id:?} ended twice");
                    aborts += 1;
                }
                engine.kv_cache().check_integrity().unwrap();
            }
            for e in engine.step().await.unwrap() {
                if let Event::Finished { id, result } = e {
                    let what = match result {
                        Ok(g) => format!("{:?}", g.finish_reason),
                        Err(e) => format!("error: {e}"),
                    };
                    assert!(outcome.insert(id, what).is_none(), "{id:?} ended twice");
                }
            }
            engine.kv_cache().check_integrity().unwrap_or_else(|e| panic!("step {steps}: {e}"));
            let s = engine.sched_stats();
            assert!(s.running <= 5);
            steps += 1;
        }
        while engine.has_work() {
            for e in engine.step().await.unwrap() {
                if let Event::Finished { id, result } = e {
                    outcome.insert(id, result.map(|g| format!("{:?}", g.finish_reason)).unwrap_or_else(|e| format!("error: {e}")));
                }
            }
        }
        for id in &submitted {
            assert!(outcome.contains_key(id), "request {id:?} was lost");
        }
        let stats = engine.sched_stats();
        let errors: Vec<&String> = outcome.values().filter(|v| v.starts_with("error")).collect();
        println!(
            "{} requests over {} steps: {} aborted, {} preemptions, {} errors, prefix {:?}",
            submitted.len(), stats.steps, aborts, stats.preemptions, errors.len(), engine.stats().prefix
        );
        assert!(stats.preemptions > 0, "the pool was meant to force preemption");
        assert!(engine.stats().prefix.evictions > 0, "the pool was meant to force eviction");
        assert!(errors.is_empty(), "requests ended with errors although each fits the pool alone: {errors:?}");
        engine.reset_cache().unwrap();
        let pool = engine.stats().pool;
        assert_eq!(pool.blocks_free, pool.blocks_total, "blocks leaked");
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn real_model_batched_requests_give_their_solo_tokens() {
    use pagedlm::tokenizer::ChatMessage;
    pollster::block_on(async {
        let bytes = common::real_model_bytes().await;
        let questions =
            ["What is the capital of France?", "Name a primary color.", "Write one word that rhymes with cat.", "How many legs does a spider have?"];
        let opts = EngineOptions { max_context: 256, ..Default::default() };
        let mut engine = Engine::load(&bytes, opts.clone()).await.unwrap();
        let request = GenerateRequest { max_tokens: 16, ..Default::default() };
        let prompts: Vec<(Vec<u32>, GenerateRequest)> =
            questions.iter().map(|q| (engine.chat_prompt(&[ChatMessage { role: "user".into(), content: (*q).into() }]).unwrap(), request.clone())).collect();
        let mut solo = Engine::load(&bytes, EngineOptions { prefix_cache: false, ..opts }).await.unwrap();
        let mut want = Vec::new();
        for (p, r) in &prompts {
            want.push(solo.generate(p, r, &mut |_| true).await.unwrap().tokens);
        }
        let got = run_batched(&mut engine, &prompts).await;
        let mut ids_sorted: Vec<&RequestId> = got.keys().collect();
        ids_sorted.sort();
        for (k, id) in ids_sorted.iter().enumerate() {
            assert_eq!(got[id].0, want[k], "{}: batched tokens differ from the solo run", questions[k]);
        }
        engine.kv_cache().check_integrity().unwrap();
    });
}

/// One lookahead-equivalence workload on `engine`: every request submitted at once, one of them
/// aborted after `abort_after` steps. Returns each request's (tokens, text, finish reason,
/// prefix hit) in submission order, and the pool's and prefix cache's counters at the end.
/// Also returns the scheduler's (steps, steps planned ahead).
async fn lookahead_run(
    engine: &mut Engine,
    prompts: &[(Vec<u32>, GenerateRequest)],
    abort_after: u32,
) -> (Vec<(Vec<u32>, String, FinishReason, u32)>, String, (u64, u64)) {
    let order: Vec<RequestId> = prompts.iter().map(|(p, r)| engine.submit(p.clone(), r.clone()).unwrap()).collect();
    let mut done: HashMap<RequestId, pagedlm::engine::Generation> = HashMap::new();
    let mut steps = 0;
    while engine.has_work() {
        if steps == abort_after {
            if let Some(g) = engine.abort(order[1]).unwrap() {
                done.insert(order[1], g);
            }
        }
        for e in engine.step().await.unwrap() {
            if let Event::Finished { id, result } = e {
                done.insert(id, result.unwrap_or_else(|e| panic!("{id:?} failed: {e}")));
            }
        }
        engine.kv_cache().check_integrity().unwrap();
        steps += 1;
    }
    let out = order.iter().map(|id| {
        let g = &done[id];
        (g.tokens.clone(), g.text.clone(), g.finish_reason, g.prefix_hit_tokens)
    });
    let stats = engine.stats();
    let counters = format!("pool {:?} prefix {:?}", (stats.pool.blocks_free, stats.pool.blocks_cached, stats.pool.blocks_total), stats.prefix);
    let sched = engine.sched_stats();
    (out.collect(), counters, (sched.steps, sched.steps_ahead))
}

gpu_test! {
    async fn planning_ahead_changes_no_output_and_no_cache_state() {
        // The decode step planned while the one before is on the GPU, fed its token there, must
        // leave every generation and the cache as stepping one at a time does: requests that end
        // at their token limit, at a stop string (found from a first run), at the context limit,
        // by an abort while a step planned ahead is in flight, alone and batched, f32 and INT8.
        // Constrained requests go ahead too (their masks chosen after the step before commits),
        // ending when their grammar completes or at their token limit.
        let bytes = tiny_model(35);
        let mut rng = Rng::new(6);
        let probe = ids(&mut rng, 9);
        let mut first = Engine::load(&bytes, EngineOptions { max_context: 64, ..Default::default() }).await.unwrap();
        let seen = first.generate(&probe, &GenerateRequest { max_tokens: 6, ignore_eos: true, ..Default::default() }, &mut |_| true).await.unwrap();
        let stop = first.tokenizer().decode(&seen.tokens[2..3]).unwrap_or_default();
        assert!(!stop.is_empty(), "the probe's third token has no text: {:?}", seen.tokens);
        let mut prompts = vec![(probe.clone(), GenerateRequest { max_tokens: 20, stop: vec![stop], ..Default::default() })];
        for k in 0..5 {
            let n = 3 + rng.below(20) as usize;
            let max_tokens = [1, 4, 9, 17, 40][k];
            prompts.push((ids(&mut rng, n), GenerateRequest { max_tokens, ignore_eos: k % 2 == 0, ..Default::default() }));
        }
        // Sampled on the GPU, one with a repetition penalty (its window kept in a ring there).
        for (k, penalty) in [(0u64, 1.0f32), (1, 1.3)] {
            let sampling = SamplingParams { temperature: 1.5, top_k: 40, top_p: 0.95, repetition_penalty: penalty, seed: 11 + k, ..SamplingParams::greedy() };
            prompts.push((ids(&mut rng, 6 + k as usize), GenerateRequest { max_tokens: 14, sampling, ..Default::default() }));
        }
        let lark = "start: \"id=\" NUM (\",\" NUM)*\nNUM: /[1-9][0-9]?/\n";
        let colors = serde_json::json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": false});
        let constrained = [
            (Constraint::Regex("(yes|no|maybe)!".into()), SamplingParams::greedy(), 10),
            (Constraint::Lark(lark.into()), SamplingParams { temperature: 1.2, seed: 5, ..SamplingParams::greedy() }, 12),
            (Constraint::JsonSchema(colors), SamplingParams::greedy(), 24),
        ];
        for (k, (constraint, sampling, max_tokens)) in constrained.into_iter().enumerate() {
            prompts.push((ids(&mut rng, 4 + k), GenerateRequest { max_tokens, sampling, constraint: Some(constraint), ..Default::default() }));
        }
        for (max_batch, kv_dtype, block_size) in [(1u32, KvDtype::F32, 4u32), (4, KvDtype::F32, 8), (6, KvDtype::Int8, 5)] {
            let mut results = Vec::new();
            for lookahead in [false, true] {
                let sched = SchedConfig { max_batch, step_tokens: 32, lookahead, ..Default::default() };
                let opts = EngineOptions { max_context: 48, block_size, kv_dtype, sched, check_integrity: true, ..Default::default() };
                let mut engine = Engine::load(&bytes, opts).await.unwrap();
                results.push(lookahead_run(&mut engine, &prompts, 7).await);
            }
            let what = format!("batch {max_batch}, {}, blocks of {block_size}", kv_dtype.name());
            for (k, (off, on)) in results[0].0.iter().zip(&results[1].0).enumerate() {
                assert_eq!(off, on, "{what}: request {k} differs with lookahead");
            }
            assert_eq!(results[0].1, results[1].1, "{what}: the cache ends differently with lookahead");
            let ((steps_off, ahead_off), (steps_on, ahead_on)) = (results[0].2, results[1].2);
            assert_eq!(ahead_off, 0, "{what}: planned ahead with lookahead off");
            // One sequence at a time decodes ahead in most steps; batches go ahead less often
            // here (short requests keep arriving into the batch, and a prefill stops the
            // lookahead); a row undone at an end costs at most a step per request.
            let enough = if max_batch == 1 { ahead_on * 2 > steps_on } else { ahead_on > 0 };
            assert!(enough && steps_on <= steps_off + prompts.len() as u64, "{what}: {ahead_on} of {steps_on} steps planned ahead ({steps_off} without)");
            let reasons: Vec<FinishReason> = results[1].0.iter().map(|r| r.2).collect();
            assert!(reasons.contains(&FinishReason::Stop) && reasons.contains(&FinishReason::Length), "{what}: the workload must end both ways: {reasons:?}");
        }
    }
}

gpu_test! {
    async fn sampling_on_the_gpu_follows_the_cpu_definition() {
        // Generations sampled on the GPU (temperature, top-k, top-p, a repetition penalty whose
        // window lives in a ring on the GPU, the draw counted by position), replayed on the CPU:
        // each token must be what `sample_row` picks from the same step's logits (teacher-forced),
        // the same window and the same counter. The two may differ only where exp's rounding
        // moves a cumulative weight across a target, which random logits almost never hit.
        let bytes = tiny_model(36);
        let mut rng = Rng::new(7);
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 64, ..Default::default() }).await.unwrap();
        let cases = [
            SamplingParams { temperature: 1.5, seed: 1, ..SamplingParams::greedy() },
            SamplingParams { temperature: 0.9, top_k: 8, top_p: 0.8, seed: 2, ..SamplingParams::greedy() },
            SamplingParams { temperature: 1.2, repetition_penalty: 1.8, repetition_window: 6, seed: 3, ..SamplingParams::greedy() },
            SamplingParams { temperature: 0.0, repetition_penalty: 2.5, repetition_window: 64, ..SamplingParams::greedy() },
        ];
        let (mut checked, mut differ) = (0, 0);
        for (k, sampling) in cases.iter().enumerate() {
            let prompt = ids(&mut rng, 5 + k);
            let request = GenerateRequest { max_tokens: 12, sampling: sampling.clone(), ignore_eos: true, ..Default::default() };
            let g = engine.generate(&prompt, &request, &mut |_| true).await.unwrap();
            let mut all = prompt.clone();
            all.extend(&g.tokens);
            let rows = engine.score_logits(&all, prompt.len(), pagedlm::engine::ScoreMode::Decode).await.unwrap();
            for (i, &token) in g.tokens.iter().enumerate() {
                let at = prompt.len() + i;
                let window = &all[at.saturating_sub(sampling.repetition_window as usize)..at];
                let mut logits = rows[i].clone();
                let want = pagedlm::sampler::sample_row(sampling, &mut logits, window, at as u32);
                checked += 1;
                differ += (want != token) as u32;
            }
        }
        assert!(differ <= 1, "{differ} of {checked} GPU-sampled tokens differ from the CPU definition");
    }
}

gpu_test! {
    async fn aborting_the_last_request_leaves_no_work_behind_a_step_planned_ahead() {
        // A step planned ahead is on the GPU when the only request is aborted: the engine has
        // nothing left to do, its blocks are free at once, and a new request runs as usual.
        let bytes = tiny_model(37);
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 64, check_integrity: true, ..Default::default() }).await.unwrap();
        let prompt = ids(&mut Rng::new(8), 7);
        let request = GenerateRequest { max_tokens: 30, ignore_eos: true, ..Default::default() };
        let id = engine.submit(prompt.clone(), request.clone()).unwrap();
        for _ in 0..4 {
            engine.step().await.unwrap();
        }
        assert!(engine.sched_stats().steps_ahead > 0, "the decode steps should go ahead");
        let g = engine.abort(id).unwrap().expect("running");
        assert_eq!(g.finish_reason, FinishReason::Abort);
        assert!(!engine.has_work(), "nothing to step after the last request was aborted");
        let pool = engine.stats().pool;
        assert_eq!(pool.blocks_free + pool.blocks_cached, pool.blocks_total, "its blocks are released at once");
        engine.kv_cache().check_integrity().unwrap();
        let again = engine.generate(&prompt, &GenerateRequest { max_tokens: 5, ..request }, &mut |_| true).await.unwrap();
        assert_eq!(again.tokens.len(), 5);
        let k = g.tokens.len().min(5);
        assert!(k > 0, "the aborted request had streamed tokens");
        assert_eq!(&again.tokens[..k], &g.tokens[..k], "greedy: the same first tokens again");
    }
}
