//! `bench` and `profile`: the engine's speed on the model, measured through its own paths.
//! The commands' sizes are their own (the measurements'); every engine, request and sampling
//! default comes from the library.

use std::collections::HashMap;

use anyhow::{bail, Result};
use pagedlm::engine::{Constraint, Engine, EngineOptions, Event, GenerateRequest, Profile, RequestId, Speculative, StepProfile};
use pagedlm::sampler::SamplingParams;
use serde_json::{json, Value};

use crate::args::Args;
use crate::setup::{constraint_option, load_engine, measuring_options, print_line};

/// `bench --prompt-tokens` and `--gen-tokens` (as the README's Command line section documents):
/// the prompt read for the prefill
/// rate and the tokens decoded for the decode rate.
pub(crate) const BENCH_PROMPT_TOKENS: u32 = 512;
pub(crate) const BENCH_GEN_TOKENS: u32 = 128;
/// `bench --batch`: one sequence; naming a batch (even 1) measures aggregate decode instead.
pub(crate) const BENCH_BATCH: u32 = 1;
/// `bench --interference --prompt-tokens`: a prompt that takes several steps to read at the
/// engine's default `step_tokens`, so the decoders' latency shows how it is chunked.
pub(crate) const INTERFERENCE_PROMPT_TOKENS: u32 = 2048;
/// `bench --transfer --lengths`: prompt lengths from a short turn to a long conversation.
pub(crate) const TRANSFER_LENGTHS: &[u32] = &[256, 512, 1024, 2048, 4096];
/// `profile --prompt-tokens`: the same as the package's `engine.profile()` (js/index.js).
pub(crate) const PROFILE_PROMPT_TOKENS: u32 = 512;

/// A profile of one prefill and one steady-state decode step ([`Engine::profile`]): one JSON
/// line (the `Profile` plus the summary fields CONTRACTS names and the per-kernel
/// `prefill_ms`/`decode_ms` pairs of old), or with `--table` the same for people.
pub(crate) async fn profile(args: &Args) -> Result<()> {
    if args.flag("json") && args.flag("table") {
        bail!("profile prints JSON (--json, the default) or a table (--table), not both");
    }
    let n = args.count("prompt-tokens", PROFILE_PROMPT_TOKENS);
    let mut opts = measuring_options(args);
    opts.max_context = opts.max_context.max(n + pagedlm::engine::PROFILE_EXTRA_TOKENS);
    let mut engine = load_engine(args, opts).await?;
    let p = engine.profile(n, !args.flag("no-timestamps")).await?;
    if args.flag("table") {
        print!("{}", profile_table(&p));
        return Ok(());
    }
    let pairs = |s: &StepProfile| -> Vec<(String, f64)> { s.kernels.iter().map(|k| (k.name.clone(), k.ms)).collect() };
    let mut line = serde_json::to_value(&p)?;
    if let (Value::Object(line), Value::Object(summary)) = (&mut line, serde_json::to_value(p.summary())?) {
        line.extend(summary);
    }
    line["prefill_ms"] = json!(pairs(&p.prefill));
    line["decode_ms"] = json!(pairs(&p.decode));
    line["backend"] = json!(engine.backend().0);
    line["backend_reason"] = json!(engine.backend().1);
    print_line(&line)
}

/// The profile as a table: the two steps side by side, then each step's kernels.
fn profile_table(p: &Profile) -> String {
    let (pf, d) = (&p.prefill, &p.decode);
    let mut out = format!("pagedlm profile on {}\nper-kernel times from {}\n\n", p.adapter, p.method.describe());
    out += &format!("{:<26}{:>16}{:>16}\n", "", format!("prefill {}", pf.tokens), format!("decode @{}", d.context));
    let rows: [(&str, f64, f64, usize); 12] = [
        ("wall ms", pf.wall_ms, d.wall_ms, 2),
        ("GPU ms (sum of kernels)", pf.gpu_ms, d.gpu_ms, 2),
        ("host ms (record+submit)", pf.host_ms, d.host_ms, 3),
        ("  of which in submit", pf.submit_ms, d.submit_ms, 3),
        ("dispatches", pf.dispatches as f64, d.dispatches as f64, 0),
        ("submits", pf.submits as f64, d.submits as f64, 0),
        ("readbacks", pf.readbacks as f64, d.readbacks as f64, 0),
        ("blocking readbacks", pf.blocking_readbacks as f64, d.blocking_readbacks as f64, 0),
        ("bytes read back / token", pf.bytes_read_back_per_token, d.bytes_read_back_per_token, 1),
        ("buffers created", pf.buffers_created as f64, d.buffers_created as f64, 0),
        ("bind groups created", pf.bind_groups_created as f64, d.bind_groups_created as f64, 0),
        ("tokens/s (wall)", pf.tokens as f64 * 1000.0 / pf.wall_ms, 1000.0 / d.wall_ms, 1),
    ];
    for (name, a, b, digits) in rows {
        out += &format!("{name:<26}{a:>16.digits$}{b:>16.digits$}\n");
        if name.starts_with("GPU ms") {
            let span = |s: &StepProfile| s.gpu_span_ms.map_or("n/a".to_string(), |ms| format!("{ms:.2}"));
            out += &format!("{:<26}{:>16}{:>16}\n", "GPU span ms (first..last)", span(pf), span(d));
        }
    }
    let c = &p.prefill_cold;
    out += &format!(
        "first prefill: {:.1} ms wall, {} buffers ({:.1} MiB), {} bind groups, {} pipelines compiled\n",
        c.wall_ms,
        c.buffers_created,
        c.buffer_bytes_created as f64 / (1u64 << 20) as f64,
        c.bind_groups_created,
        c.pipelines_compiled
    );
    for (what, step) in [("prefill", pf), ("decode", d)] {
        out += &format!("\n{:<32}{:>12}{:>8}{:>8}\n", format!("{what} kernel"), "ms", "calls", "share");
        for k in &step.kernels {
            let share = if step.gpu_ms > 0.0 { 100.0 * k.ms / step.gpu_ms } else { 0.0 };
            out += &format!("{:<32}{:>12.3}{:>8}{:>7.1}%\n", k.name, k.ms, k.dispatches, share);
        }
    }
    out
}

/// `bench --speculative auto`: the decode of the plain measurement again with drafts (prompt
/// lookup; greedy, end-of-generation ignored): its tokens/s, and the draft tokens taken and
/// refused.
async fn bench_speculative(engine: &mut Engine, prompt: &[u32], gen_tokens: u32) -> Result<(f64, u32, u32)> {
    let request = GenerateRequest { max_tokens: gen_tokens + 1, ignore_eos: true, speculative: Some(Speculative::Auto), ..Default::default() };
    let (g, ms) = engine.generate_timed(prompt, &request).await?;
    Ok((g.tokens.len().saturating_sub(1) as f64 / (ms / 1000.0), g.accepted_prediction_tokens, g.rejected_prediction_tokens))
}

/// Aggregate decode throughput of `batch` sequences decoding together: every request gets its
/// own `context`-token prompt and decodes `gen_tokens` tokens (end-of-generation ignored);
/// the clock runs from the step after the last prompt finished prefilling to the first
/// request's end, over the tokens all of them produced meanwhile.
async fn bench_batch(args: &Args, mut opts: EngineOptions, batch: u32, context: u32, gen_tokens: u32) -> Result<()> {
    opts.sched.max_batch = batch;
    opts.pool_tokens = opts.pool_tokens.max(batch * (context + gen_tokens + 16));
    let mut engine = load_engine(args, opts).await?;
    let vocab = engine.config().vocab;
    let make = |n: u32, salt: u32| -> Vec<u32> { (0..n).map(|i| 100 + (i * 7919 + salt * 104_729) % (vocab - 200).max(1)).collect() };
    let request = GenerateRequest { max_tokens: gen_tokens.max(2), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    // Warm-up: compiles pipelines and builds graphs for this batch size.
    for salt in 0..batch {
        engine.submit(make(8, 1000 + salt), GenerateRequest { max_tokens: 3, ..request.clone() })?;
    }
    engine.run_to_completion(&mut |_| {}).await?;
    let mut started = std::collections::HashSet::new();
    for salt in 0..batch {
        engine.submit(make(context, salt), request.clone())?;
    }
    let (mut t0, mut tokens, mut t1) = (None, 0u64, None);
    while engine.has_work() && t1.is_none() {
        for e in engine.step().await? {
            match e {
                Event::Token { id, .. } => {
                    if t0.is_some() {
                        tokens += 1;
                    }
                    started.insert(id);
                }
                Event::Finished { result, .. } => {
                    result?;
                    t1.get_or_insert(pagedlm::time::now_ms());
                }
                Event::Admitted { .. } => {}
            }
        }
        if t0.is_none() && started.len() as u32 == batch {
            t0 = Some(pagedlm::time::now_ms());
        }
    }
    let ms = t1.unwrap_or_else(pagedlm::time::now_ms) - t0.unwrap_or(0.0);
    print_line(&json!({
        "adapter": engine.adapter_name(), "variant": engine.variant_name(), "backend": engine.backend().0, "backend_reason": engine.backend().1,
        "batch": batch,
        "context": context,
        "decode_tok_s": tokens as f64 / (ms / 1000.0),
        "decode_tok_s_per_sequence": tokens as f64 / (ms / 1000.0) / batch as f64,
        "tokens": tokens,
        "decode_ms": ms,
        "steps": engine.sched_stats().steps,
        "kv_dtype": engine.kv_cache().dtype().name(),
        "architecture": engine.config().arch,
    }))
}

/// Per prompt length: snapshot size, and export + import time against recomputing the
/// prefill (`pagedlm bench --transfer --lengths 256,1024,4096`; [`TRANSFER_LENGTHS`] when absent).
async fn bench_transfer(args: &Args) -> Result<()> {
    let lengths = args.counts("lengths").unwrap_or(TRANSFER_LENGTHS).to_vec();
    let longest = lengths.iter().copied().max().unwrap_or(256);
    let mut opts = measuring_options(args);
    if opts.max_context == 0 {
        opts.max_context = longest + 16;
    }
    let mut source = load_engine(args, opts.clone()).await?;
    let mut target = load_engine(args, opts).await?;
    let vocab = source.config().vocab;
    // Warm-up: compile the prefill pipelines.
    let warm: Vec<u32> = (0..32).map(|i| 100 + i).collect();
    source.cache_prefix(&warm).await?;
    for (k, &n) in lengths.iter().enumerate() {
        let tokens: Vec<u32> = (0..n).map(|i| 100 + (i * 7919 + k as u32 * 31) % (vocab - 200).max(1)).collect();
        source.reset_cache()?;
        target.reset_cache()?;
        let t0 = pagedlm::time::now_ms();
        source.cache_prefix(&tokens).await?;
        let t1 = pagedlm::time::now_ms();
        let snapshot = source.export_snapshot(&tokens).await?;
        let t2 = pagedlm::time::now_ms();
        target.import_snapshot(&snapshot)?;
        // Wait for the uploads to land.
        if let (Some(ctx), Some(table)) = (target.context(), target.kv_cache().table_buffer()) {
            ctx.read_u32(table, 0, 1).await?;
        }
        let t3 = pagedlm::time::now_ms();
        print_line(&json!({
            "tokens": n,
            "kv_dtype": source.kv_cache().dtype().name(),
            "architecture": source.config().arch,
            "snapshot_bytes": snapshot.len(),
            "bytes_per_token": snapshot.len() as f64 / n as f64,
            "recompute_ms": t1 - t0,
            "export_ms": t2 - t1,
            "import_ms": t3 - t2,
            "transfer_vs_recompute": (t3 - t1) / (t1 - t0),
        }))?;
    }
    Ok(())
}

/// Four sequences decode; after a few tokens a `prompt-tokens` prompt arrives. Prints the
/// decoding sequences' inter-token latency (median and worst) while the long prompt is being
/// read, for the configured `--step-tokens` (chunked prefill) — run it with a small and a
/// large value to compare.
async fn bench_interference(args: &Args) -> Result<()> {
    let long = args.count("prompt-tokens", INTERFERENCE_PROMPT_TOKENS);
    let mut opts = measuring_options(args);
    opts.prefix_cache = false;
    opts.sched.max_batch = 5;
    // Room for everything at once: the point is the schedule, not preemption.
    const DECODE_TOKENS: u32 = 1024;
    if opts.max_context == 0 {
        opts.max_context = long.max(DECODE_TOKENS + 64) + 16;
    }
    opts.pool_tokens = opts.pool_tokens.max(long + 4 * (DECODE_TOKENS + 64) + 256);
    let mut engine = load_engine(args, opts.clone()).await?;
    let vocab = engine.config().vocab;
    let make = |n: u32, salt: u32| -> Vec<u32> { (0..n).map(|i| 100 + (i * 7919 + salt * 104_729) % (vocab - 200).max(1)).collect() };
    let request = GenerateRequest { max_tokens: DECODE_TOKENS, ignore_eos: true, ..Default::default() };
    // Warm-up (pipelines for decode and prefill chunks).
    engine.submit(make(64, 99), GenerateRequest { max_tokens: 2, ..request.clone() })?;
    engine.run_to_completion(&mut |_| {}).await?;
    let decoders: Vec<_> = (0..4).map(|k| engine.submit(make(32, k), request.clone())).collect::<Result<_, _>>()?;
    // Let them reach steady decoding.
    for _ in 0..8 {
        engine.step().await?;
    }
    let long_id = engine.submit(make(long, 7), GenerateRequest { max_tokens: 1, ..request.clone() })?;
    let mut gaps = Vec::new();
    let t0 = pagedlm::time::now_ms();
    // Gaps count from the long prompt's arrival, so a decoder that gets no token until the
    // prompt is read shows that whole wait.
    let mut last: HashMap<RequestId, f64> = decoders.iter().map(|&id| (id, t0)).collect();
    let mut long_done = false;
    while !long_done {
        for e in engine.step().await? {
            let now = pagedlm::time::now_ms();
            match e {
                Event::Token { id, .. } if decoders.contains(&id) => {
                    if let Some(prev) = last.insert(id, now) {
                        gaps.push(now - prev);
                    }
                }
                Event::Finished { id, .. } if id == long_id => long_done = true,
                _ => {}
            }
        }
    }
    let end = pagedlm::time::now_ms();
    let prefill_ms = end - t0;
    // A decoder still waiting when the prompt finished waited at least this long.
    gaps.extend(last.values().filter(|&&t| t == t0).map(|_| prefill_ms));
    for id in decoders {
        engine.abort(id)?;
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| gaps.get(((gaps.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    print_line(&json!({
        "adapter": engine.adapter_name(), "variant": engine.variant_name(), "backend": engine.backend().0, "backend_reason": engine.backend().1,
        "step_tokens": opts.sched.step_tokens,
        "long_prompt_tokens": long,
        "long_prompt_ms": prefill_ms,
        "inter_token_ms_p50": pct(0.5),
        "inter_token_ms_p90": pct(0.9),
        "inter_token_ms_max": pct(1.0),
        "decode_tokens_meanwhile": gaps.len(),
    }))
}

/// The constrained half of `bench --json-schema FILE | --grammar FILE`: decodes from
/// `prompt` under `constraint` as the free decode did, then replays its tokens through a fresh
/// matcher to time the CPU's mask work alone. Returns (tok/s, tokens decoded after the first,
/// ms to build the constraint engine, mask ms per token, the share of its steps planned
/// ahead of the token before).
async fn bench_constrained(engine: &mut Engine, prompt: &[u32], gen_tokens: u32, constraint: Constraint) -> Result<(f64, usize, f64, f64, f64)> {
    let before = engine.sched_stats();
    let (tokens, ms) = engine.generate_ignoring_eos_under(prompt, gen_tokens, Some(constraint.clone())).await?;
    let after = engine.sched_stats();
    let ahead = (after.steps_ahead - before.steps_ahead) as f64 / (after.steps - before.steps).max(1) as f64;
    let build_ms = engine.grammar_build_ms().unwrap_or(0.0);
    let mut matcher = engine.grammars()?.start(&constraint)?;
    let t0 = pagedlm::time::now_ms();
    for &t in &tokens {
        matcher.advance(t)?;
    }
    let mask_ms = (pagedlm::time::now_ms() - t0) / tokens.len().max(1) as f64;
    let decoded = tokens.len().saturating_sub(1);
    Ok((decoded as f64 / (ms / 1000.0).max(1e-9), decoded, build_ms, mask_ms, ahead))
}

pub(crate) async fn bench(args: &Args) -> Result<()> {
    let prompt_tokens = args.count("prompt-tokens", BENCH_PROMPT_TOKENS);
    let gen_tokens = args.count("gen-tokens", BENCH_GEN_TOKENS);
    // Absent: decode right after the prompt.
    let context = args.given_count("context").unwrap_or(0);
    let batch = args.count("batch", BENCH_BATCH);
    if batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.flag("transfer") {
        return bench_transfer(args).await;
    }
    if args.flag("interference") {
        return bench_interference(args).await;
    }
    let mut opts = measuring_options(args);
    let needed = prompt_tokens.max(context) + gen_tokens + 1;
    if opts.max_context == 0 {
        opts.max_context = needed;
    }
    // Raw speed: no request may reuse another's K/V.
    opts.prefix_cache = false;
    if batch > 1 || args.given("batch") {
        return bench_batch(args, opts, batch, context.max(prompt_tokens).max(1), gen_tokens).await;
    }
    let speculative = args.given("speculative") && opts.sched.speculative != Speculative::Off;
    let mut engine = load_engine(args, opts).await?;
    // A deterministic prompt of ordinary tokens (ids cycle through a mid-vocabulary range).
    let vocab = engine.config().vocab;
    let make = |n: u32| -> Vec<u32> { (0..n).map(|i| 100 + (i * 7919) % (vocab - 200).max(1)).collect() };
    let request = GenerateRequest { max_tokens: gen_tokens, sampling: SamplingParams::greedy(), ..Default::default() };
    let never_stop = |_: &pagedlm::engine::TokenEvent<'_>| true;
    // Warm-up: compiles pipelines and builds graphs.
    engine.generate(&make(prompt_tokens.clamp(1, 16)), &GenerateRequest { max_tokens: 4, ..request.clone() }, &mut |e| never_stop(e)).await?;
    let prefill = engine.generate(&make(prompt_tokens.max(1)), &GenerateRequest { max_tokens: 1, ..request.clone() }, &mut |e| never_stop(e)).await?;
    let decode_ctx = if context > 0 { context } else { prompt_tokens.max(1) };
    let mut decode = engine.generate_ignoring_eos(&make(decode_ctx), gen_tokens).await?;
    decode.0 = decode.0.max(1);
    let constrained = match constraint_option(args)? {
        Some(c) => Some(bench_constrained(&mut engine, &make(decode_ctx), gen_tokens, c).await?),
        None => None,
    };
    let drafted = match speculative {
        true => Some(bench_speculative(&mut engine, &make(decode_ctx), gen_tokens).await?),
        false => None,
    };
    let memory = engine.memory();
    let mut line = json!({
        "adapter": engine.adapter_name(), "variant": engine.variant_name(), "backend": engine.backend().0, "backend_reason": engine.backend().1,
        "prefill_tok_s": prompt_tokens as f64 / (prefill.prefill_ms / 1000.0),
        "decode_tok_s": decode.0 as f64 / (decode.1 / 1000.0),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": decode.0,
        "context": decode_ctx,
        "batch": batch,
        "prefill_ms": prefill.prefill_ms,
        "decode_ms": decode.1,
        "kv_layout": engine.kv_cache().layout,
        "block_size": engine.kv_cache().block_size(),
        "kv_dtype": engine.kv_cache().dtype().name(),
        "architecture": engine.config().arch,
        "weights_bytes": memory.weights_bytes,
        "kv_bytes": memory.kv_bytes,
        "graph_bytes": memory.graph_bytes,
    });
    if let Some((tok_s, tokens, build_ms, mask_ms, ahead)) = constrained {
        line["constrained"] = json!({
            "decode_tok_s": tok_s, "tokens": tokens, "ratio": tok_s / (decode.0 as f64 / (decode.1 / 1000.0)),
            "grammar_build_ms": build_ms, "mask_ms_per_token": mask_ms, "steps_ahead_share": ahead,
        });
    }
    if let Some((tok_s, accepted, rejected)) = drafted {
        let plain = decode.0 as f64 / (decode.1 / 1000.0);
        line["speculative"] = json!({
            "decode_tok_s": tok_s, "ratio": tok_s / plain, "accepted": accepted, "rejected": rejected,
            "acceptance": accepted as f64 / (accepted + rejected).max(1) as f64,
        });
    }
    print_line(&line)
}
