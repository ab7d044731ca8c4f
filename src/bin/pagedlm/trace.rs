//! `trace`: conversations replayed through the scheduler, as many users would send them.

use std::collections::{HashMap, VecDeque};

use anyhow::{anyhow, bail, Context as _, Result};
use pagedlm::engine::{Engine, Event, GenerateRequest, Generation, RequestId};
use pagedlm::sampler::SamplingParams;
use pagedlm::tokenizer::ChatMessage;
use serde_json::{json, Value};

use crate::args::Args;
use crate::setup::{engine_options, load_engine, print_line};

/// `trace --max-batch`: one request at a time unless asked (the interface the README's Command
/// line section documents), so that a trace
/// replays as a single user would see it; the engine's own default batches 8.
pub(crate) const TRACE_MAX_BATCH: u32 = 1;

/// Replays conversations: each line `{id, conversation, system?, user, max_tokens}` continues its
/// conversation (system prompt, earlier turns with the engine's own replies, then this turn),
/// greedy. A conversation's turns run in file order, each after the previous one finished;
/// different conversations run concurrently, up to `--max-batch` ([`TRACE_MAX_BATCH`]).
pub(crate) async fn trace(args: &Args) -> Result<()> {
    let path = args.text("input").ok_or_else(|| anyhow!("--input FILE.jsonl is required"))?;
    let max_batch = args.count("max-batch", TRACE_MAX_BATCH);
    if max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    let requests = read_trace(path)?;
    let mut opts = engine_options(args);
    opts.sched.max_batch = max_batch;
    let mut engine = load_engine(args, opts.clone()).await?;
    // --disaggregate: a second engine only prefills; each prompt's K/V travel to the decoding
    // engine as a snapshot, which then recomputes only the prompt's last token.
    let mut prefill_engine = if args.flag("disaggregate") {
        if !engine.kv_cache().prefix_cache_enabled() {
            bail!("--disaggregate moves K/V through the prefix cache: it needs the paged layout and no --no-prefix-cache");
        }
        Some(load_engine(args, opts).await?)
    } else {
        None
    };
    let mut conversations = Conversations::new(&requests);
    let mut in_flight: HashMap<RequestId, Turn<'_>> = HashMap::new();
    let mut totals = TraceTotals { integrity_ok: true, ..TraceTotals::default() };
    loop {
        // Submit the next request of every conversation that has none running.
        for (conversation, line) in conversations.next_turns(|c| in_flight.values().any(|t| t.conversation == c)) {
            let prompt = engine.chat_prompt(conversations.add_user_turn(&conversation, line))?;
            let transfer = match prefill_engine.as_mut() {
                Some(p) => Some(transfer_prefix(p, &mut engine, &prompt).await?),
                None => None,
            };
            let mut request = GenerateRequest { sampling: SamplingParams::greedy(), ..Default::default() };
            request.max_tokens = line.get("max_tokens").and_then(Value::as_u64).map_or(request.max_tokens, |n| n as u32);
            let prompt_len = prompt.len();
            let id = engine.submit(prompt, request)?;
            in_flight.insert(id, Turn { line, conversation, prompt_len, transfer });
        }
        if !engine.has_work() {
            break;
        }
        for event in engine.step().await? {
            let Event::Finished { id, result } = event else { continue };
            let turn = in_flight.remove(&id).ok_or_else(|| anyhow!("an unknown request finished"))?;
            let g = result.with_context(|| format!("request {}", turn.line["id"].as_str().unwrap_or_default()))?;
            totals.prompt_tokens += turn.prompt_len as u64;
            totals.prefix_hit_tokens += g.prefix_hit_tokens as u64;
            conversations.add_reply(&turn.conversation, &g.text);
            print_line(&finished_line(&turn, &g))?;
        }
        if let Err(e) = engine.kv_cache().check_integrity() {
            eprintln!("KV cache integrity check failed: {e}");
            totals.integrity_ok = false;
        }
    }
    print_line(&trace_summary(&engine, requests.len(), &totals, max_batch))
}

/// The trace file's requests, each checked for the keys every line needs.
fn read_trace(path: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let mut requests = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{path}:{}: not valid JSON", n + 1))?;
        for key in ["id", "conversation", "user"] {
            if !v.get(key).is_some_and(Value::is_string) {
                bail!("{path}:{}: \"{key}\" (a string) is required", n + 1);
            }
        }
        requests.push(v);
    }
    Ok(requests)
}

/// Per conversation, in order of first appearance: its requests still to run (in file order)
/// and its messages so far.
struct Conversations<'a> {
    order: Vec<String>,
    queues: HashMap<String, VecDeque<&'a Value>>,
    history: HashMap<String, Vec<ChatMessage>>,
}

impl<'a> Conversations<'a> {
    fn new(requests: &'a [Value]) -> Conversations<'a> {
        let mut order: Vec<String> = Vec::new();
        let mut queues: HashMap<String, VecDeque<&Value>> = HashMap::new();
        for v in requests {
            let c = v["conversation"].as_str().unwrap_or_default().to_string();
            if !queues.contains_key(&c) {
                order.push(c.clone());
            }
            queues.entry(c).or_default().push_back(v);
        }
        Conversations { order, queues, history: HashMap::new() }
    }

    /// Takes the next request of every conversation that is not `busy`.
    fn next_turns(&mut self, busy: impl Fn(&str) -> bool) -> Vec<(String, &'a Value)> {
        let mut turns = Vec::new();
        for c in &self.order {
            if busy(c) {
                continue;
            }
            if let Some(v) = self.queues.get_mut(c).and_then(|q| q.pop_front()) {
                turns.push((c.clone(), v));
            }
        }
        turns
    }

    /// Adds the request's user turn (and, first in a conversation, its system prompt);
    /// returns the conversation so far.
    fn add_user_turn(&mut self, conversation: &str, line: &Value) -> &[ChatMessage] {
        let messages = self.history.entry(conversation.to_string()).or_default();
        if messages.is_empty() {
            if let Some(system) = line.get("system").and_then(Value::as_str) {
                messages.push(ChatMessage { role: "system".into(), content: system.into() });
            }
        }
        messages.push(ChatMessage { role: "user".into(), content: line["user"].as_str().unwrap_or_default().into() });
        messages
    }

    fn add_reply(&mut self, conversation: &str, text: &str) {
        let messages = self.history.entry(conversation.to_string()).or_default();
        messages.push(ChatMessage { role: "assistant".into(), content: text.to_string() });
    }
}

/// A submitted trace request.
struct Turn<'a> {
    line: &'a Value,
    conversation: String,
    prompt_len: usize,
    transfer: Option<Transfer>,
}

/// How a disaggregated request's prompt reached the decoding engine.
struct Transfer {
    prefill_engine_ms: f64,
    transfer_ms: f64,
    snapshot_bytes: usize,
}

#[derive(Default)]
struct TraceTotals {
    prompt_tokens: u64,
    prefix_hit_tokens: u64,
    integrity_ok: bool,
}

/// Prefills `prompt` on the prefill engine and moves its K/V to `engine` as a snapshot.
async fn transfer_prefix(prefill: &mut Engine, engine: &mut Engine, prompt: &[u32]) -> Result<Transfer> {
    let t0 = pagedlm::time::now_ms();
    prefill.cache_prefix(prompt).await?;
    let t1 = pagedlm::time::now_ms();
    let snapshot = prefill.export_snapshot(prompt).await?;
    engine.import_snapshot(&snapshot)?;
    Ok(Transfer { prefill_engine_ms: t1 - t0, transfer_ms: pagedlm::time::now_ms() - t1, snapshot_bytes: snapshot.len() })
}

fn finished_line(turn: &Turn<'_>, g: &Generation) -> Value {
    let mut line = json!({
        "id": turn.line["id"].as_str().unwrap_or_default(), "conversation": turn.conversation, "prompt_tokens": turn.prompt_len,
        "prefix_hit_tokens": g.prefix_hit_tokens, "prefill_tokens": g.prefill_tokens, "tokens": g.tokens, "text": g.text,
        "finish_reason": g.finish_reason, "ttft_ms": g.ttft_ms, "decode_ms": g.decode_ms,
    });
    if let Some(t) = &turn.transfer {
        // On the decoding engine the prompt arrived as a snapshot: its own time to
        // first token follows the prefill engine's work and the transfer.
        line["prefill_engine_ms"] = json!(t.prefill_engine_ms);
        line["transfer_ms"] = json!(t.transfer_ms);
        line["snapshot_bytes"] = json!(t.snapshot_bytes);
        line["ttft_ms"] = json!(g.ttft_ms + t.prefill_engine_ms + t.transfer_ms);
    }
    line
}

fn trace_summary(engine: &Engine, requests: usize, totals: &TraceTotals, max_batch: u32) -> Value {
    let stats = engine.kv_cache().stats();
    let prefix = engine.kv_cache().prefix_stats();
    let (prompt, hit) = (totals.prompt_tokens, totals.prefix_hit_tokens);
    json!({ "summary": {
        "requests": requests, "prompt_tokens": prompt, "prefix_hit_tokens": hit,
        "hit_rate": if prompt == 0 { 0.0 } else { hit as f64 / prompt as f64 },
        "prefix_cache": prefix.enabled,
        "evictions": prefix.evictions, "preemptions": engine.sched_stats().preemptions, "integrity_ok": totals.integrity_ok,
        "max_batch": max_batch, "steps": engine.sched_stats().steps,
        "pool": {
            "kv_dtype": stats.kv_dtype, "block_size": stats.block_size, "blocks_total": stats.blocks_total,
            "blocks_used": stats.blocks_used, "blocks_free": stats.blocks_free, "blocks_cached": stats.blocks_cached,
            "bytes_total": stats.bytes_total, "bytes_per_token": stats.bytes_per_token,
        },
    }})
}
