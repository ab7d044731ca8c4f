//! The `pagedlm` command line: tokenize, score, generate, bench, trace and profile (see README
//! and CONTRACTS). Options are typed and checked before anything is loaded ([`args`]).

// Under src/bin/pagedlm/, where cargo does not take them for binaries of their own.
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/args.rs"]
mod args;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/xdg.rs"]
mod xdg;

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    // Before any GPU instance exists, and while this is the only thread.
    let runtime_dir = xdg::RuntimeDir::ensure();
    let code = match cli::run(std::env::args().skip(1).collect()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pagedlm: {e:#}");
            1
        }
    };
    drop(runtime_dir);
    std::process::exit(code);
}

/// Every option here is declared in [`args::COMMANDS`]; a test checks the two agree.
#[cfg(not(target_arch = "wasm32"))]
const USAGE: &str = "usage: pagedlm <tokenize|score|generate|bench|trace|profile> [options]
  common:   --model PATH  --kv-layout contiguous|paged  --kv-dtype f32|int8  --block-size N  --pool-tokens N
            --max-context N  --prefill-chunk N  --max-batch N  --step-tokens N  --no-prefix-cache  --no-cache-aware  --no-lookahead
            --max-binding-mib N   (run as on a device whose largest buffer binding is N MiB)
            --device-limits adapter|phone  (phone: WebGPU's default limits, 128 MiB buffers)
            --max-memory-mib N   (cap the GPU memory the engine holds; the KV pool shrinks to fit)
            --adapter-class cpu|integrated|discrete   (tune the kernels as for that kind of adapter)
            --no-optional-features   (the variants for adapters without subgroups and shader-f16)
            --activations auto|f32|int8   (the matmuls' activations; auto: f32)
            --backend auto|webgpu|cpu   (default auto: WebGPU on a real GPU, else cpu; cpu: CPU kernels, no device)
            (every command takes them; tokenize reads only --model)
  tokenize  --texts FILE.json
  score     --input FILE.json [--mode decode|prefill]
  generate  --input FILE.json | --prompt TEXT  [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
            [--repetition-penalty R] [--json-schema FILE.json | --grammar FILE.lark]
            (the output matches the schema or Lark grammar; an --input item's OpenAI-style
             `response_format` does the same for that item)
  bench     [--prompt-tokens 512] [--gen-tokens 128] [--context N] [--batch N]
            [--json-schema FILE.json | --grammar FILE.lark]   (decode under it too: `constrained`)
  bench     --transfer [--lengths 256,512,1024,2048,4096]   (KV snapshot export/import vs recomputing the prefill)
  bench     --interference [--prompt-tokens 2048] [--step-tokens N]   (4 decoding sequences while a long prompt arrives)
  trace     --input FILE.jsonl [--max-batch N] [--no-prefix-cache] [--disaggregate] [--step-tokens N]
  profile   [--prompt-tokens 512] [--json | --table] [--no-timestamps]
            (one JSON line by default or with --json; --table prints it for people;
             --no-timestamps times each kernel alone on the host clock even where GPU timestamps exist)
  Values follow their option (`--max-tokens 5`) or an equals sign (`--max-tokens=5`).";

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use std::collections::{HashMap, VecDeque};
    use std::io::Write;

    use anyhow::{anyhow, bail, Context as _, Result};
    use pagedlm::engine::{Constraint, Engine, EngineOptions, Event, GenerateRequest, Generation, KvDtype, KvLayout, Message, Profile, RequestId, ScoreMode, StepProfile, Tools};
    use pagedlm::gguf::Gguf;
    use pagedlm::engine::{AdapterClass, BackendChoice, DeviceLimits};
    use pagedlm::sampler::SamplingParams;
    use pagedlm::tokenizer::{ChatMessage, Tokenizer, TokenizerSpec};
    use serde_json::{json, Value};

    use crate::args::{self, Args, Cmd, Parsed};
    use crate::USAGE;

    const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

    // The commands' own defaults. Every engine, request and sampling default comes from the
    // library ([`EngineOptions::for_users`], [`GenerateRequest::default`]), as in the package;
    // these are the measurements' sizes and the one schedule CONTRACTS.md fixes for the CLI.
    /// `trace --max-batch`: one request at a time unless asked (CONTRACTS.md), so that a trace
    /// replays as a single user would see it; the engine's own default batches 8.
    const TRACE_MAX_BATCH: u32 = 1;
    /// `bench --prompt-tokens` and `--gen-tokens` (CONTRACTS.md): the prompt read for the prefill
    /// rate and the tokens decoded for the decode rate.
    const BENCH_PROMPT_TOKENS: u32 = 512;
    const BENCH_GEN_TOKENS: u32 = 128;
    /// `bench --batch`: one sequence; naming a batch (even 1) measures aggregate decode instead.
    const BENCH_BATCH: u32 = 1;
    /// `bench --interference --prompt-tokens`: a prompt that takes several steps to read at the
    /// engine's default `step_tokens`, so the decoders' latency shows how it is chunked.
    const INTERFERENCE_PROMPT_TOKENS: u32 = 2048;
    /// `bench --transfer --lengths`: prompt lengths from a short turn to a long conversation.
    const TRANSFER_LENGTHS: &[u32] = &[256, 512, 1024, 2048, 4096];
    /// `profile --prompt-tokens`: the same as the package's `engine.profile()` (js/index.js).
    const PROFILE_PROMPT_TOKENS: u32 = 512;

    /// Parses the whole command line first, so a mistake in it stops the run before any file is read.
    pub fn run(argv: Vec<String>) -> Result<()> {
        let args = match args::parse(&argv) {
            Ok(Parsed::Run(args)) => args,
            Ok(Parsed::Help) => {
                println!("{USAGE}");
                return Ok(());
            }
            Err(e @ args::ArgError::UnknownCommand { .. }) => bail!("{e}\n{USAGE}"),
            Err(e) => return Err(e.into()),
        };
        match args.command.what {
            Cmd::Tokenize => tokenize(&args),
            Cmd::Score => pollster::block_on(score(&args)),
            Cmd::Generate => pollster::block_on(generate(&args)),
            Cmd::Bench => pollster::block_on(bench(&args)),
            Cmd::Profile => pollster::block_on(profile(&args)),
            Cmd::Trace => pollster::block_on(trace(&args)),
        }
    }

    fn model_bytes(args: &Args) -> Result<Vec<u8>> {
        let path = args.text("model").unwrap_or(DEFAULT_MODEL);
        std::fs::read(path).with_context(|| {
            format!("cannot read the model at {path} (run `npm run fetch-model`, or pass --model PATH)")
        })
    }

    fn read_json(path: Option<&str>, what: &str) -> Result<Value> {
        let path = path.ok_or_else(|| anyhow!("{what} FILE is required"))?;
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
        serde_json::from_str(&text).with_context(|| format!("{path} is not valid JSON"))
    }

    /// The engine's options: [`EngineOptions::for_users`], the defaults the package starts from
    /// too, with what the command line set.
    fn engine_options(args: &Args) -> EngineOptions {
        let mut o = EngineOptions::for_users();
        o.max_context = args.count("max-context", o.max_context);
        o.prefill_chunk = args.count("prefill-chunk", o.prefill_chunk);
        // The parser admits only the values in args::KV_LAYOUTS, args::KV_DTYPES and args::ACTIVATIONS.
        o.kv_layout = match args.text("kv-layout") {
            Some("contiguous") => KvLayout::Contiguous,
            Some(_) => KvLayout::Paged,
            None => o.kv_layout,
        };
        o.kv_dtype = match args.text("kv-dtype") {
            Some("int8") => KvDtype::Int8,
            Some(_) => KvDtype::F32,
            None => o.kv_dtype,
        };
        o.block_size = args.count("block-size", o.block_size);
        o.pool_tokens = args.count("pool-tokens", o.pool_tokens);
        o.prefix_cache &= !args.flag("no-prefix-cache");
        o.sched.max_batch = args.count("max-batch", o.sched.max_batch);
        o.sched.step_tokens = args.count("step-tokens", o.sched.step_tokens);
        o.sched.cache_aware &= !args.flag("no-cache-aware");
        o.sched.lookahead &= !args.flag("no-lookahead");
        o.max_binding_bytes = args.given_count("max-binding-mib").map(|mib| u64::from(mib) << 20).or(o.max_binding_bytes);
        // The parser admits only the names in args::ADAPTER_CLASSES, args::BACKENDS and args::DEVICE_LIMITS.
        o.adapter_class = args.text("adapter-class").and_then(AdapterClass::parse).or(o.adapter_class);
        o.backend = args.text("backend").and_then(BackendChoice::parse).unwrap_or(o.backend);
        o.device_limits = args.text("device-limits").and_then(DeviceLimits::parse).unwrap_or(o.device_limits);
        o.optional_features &= !args.flag("no-optional-features");
        o.int8_activations = match args.text("activations") {
            Some("int8") => Some(true),
            Some("f32") => Some(false),
            // `auto`: the adapter's default.
            Some(_) => None,
            None => o.int8_activations,
        };
        o.max_memory_bytes = args.given_count("max-memory-mib").map(|mib| u64::from(mib) << 20).or(o.max_memory_bytes);
        o
    }

    async fn load(args: &Args) -> Result<Engine> {
        let bytes = model_bytes(args)?;
        Ok(Engine::load(&bytes, engine_options(args)).await?)
    }

    fn print_line(v: &Value) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{v}")?;
        out.flush()?;
        Ok(())
    }

    fn tokenize(args: &Args) -> Result<()> {
        let texts = read_json(args.text("texts"), "--texts")?;
        let texts = texts.as_array().ok_or_else(|| anyhow!("--texts must hold a JSON array of strings"))?;
        let bytes = model_bytes(args)?;
        let gguf = Gguf::parse(&bytes)?;
        let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&gguf)?)?;
        for (i, t) in texts.iter().enumerate() {
            let s = t.as_str().ok_or_else(|| anyhow!("--texts item {i} is not a string"))?;
            print_line(&json!({ "ids": tokenizer.encode(s)? }))?;
        }
        Ok(())
    }

    async fn score(args: &Args) -> Result<()> {
        let items = read_json(args.text("input"), "--input")?;
        let items = items.as_array().ok_or_else(|| anyhow!("--input must hold a JSON array"))?;
        // The parser admits only the values in args::SCORE_MODES.
        let mode = match args.text("mode") {
            Some("prefill") => ScoreMode::Prefill,
            _ => ScoreMode::Decode,
        };
        let mut engine = load(args).await?;
        for (i, item) in items.iter().enumerate() {
            let id = item.get("id").and_then(Value::as_str).unwrap_or("").to_string();
            let ids: Vec<u32> = serde_json::from_value(item.get("ids").cloned().unwrap_or(Value::Null))
                .with_context(|| format!("item {i}: \"ids\" must be an array of token ids"))?;
            let from = item.get("from").and_then(Value::as_u64).ok_or_else(|| anyhow!("item {i}: \"from\" is required"))?;
            let top5 = engine.score(&ids, from as usize, mode).await?;
            let argmax: Vec<u32> = top5.iter().map(|t| t.first().map_or(0, |p| p.0)).collect();
            let top5: Vec<Vec<(u32, f32)>> = top5;
            print_line(&json!({ "id": id, "argmax": argmax, "top5": top5 }))?;
        }
        Ok(())
    }

    /// `generate`'s request: [`GenerateRequest::default`], the defaults the package starts from
    /// too, with the sampling options and the token limit the command line set.
    fn request_options(args: &Args) -> GenerateRequest {
        let mut request = GenerateRequest::default();
        request.max_tokens = args.count("max-tokens", request.max_tokens);
        let sampling = &mut request.sampling;
        sampling.temperature = args.number("temperature", sampling.temperature);
        sampling.top_k = args.count("top-k", sampling.top_k);
        sampling.top_p = args.number("top-p", sampling.top_p);
        sampling.repetition_penalty = args.number("repetition-penalty", sampling.repetition_penalty);
        sampling.seed = args.seed("seed", sampling.seed);
        request
    }

    /// The constraint every item of `generate` gets: `--json-schema FILE` or `--grammar FILE`.
    fn constraint_option(args: &Args) -> Result<Option<Constraint>> {
        match (args.text("json-schema"), args.text("grammar")) {
            (Some(_), Some(_)) => bail!("--json-schema and --grammar exclude each other: give one"),
            (Some(path), None) => Ok(Some(Constraint::JsonSchema(read_json(Some(path), "--json-schema")?))),
            (None, Some(path)) => Ok(Some(Constraint::Lark(std::fs::read_to_string(path).with_context(|| format!("cannot read --grammar {path}"))?))),
            (None, None) => Ok(None),
        }
    }

    async fn generate(args: &Args) -> Result<()> {
        let request = GenerateRequest { constraint: constraint_option(args)?, ..request_options(args) };
        request.sampling.validate()?;
        if let Some(prompt) = args.text("prompt") {
            let mut engine = load(args).await?;
            let ids = engine.text_prompt(prompt)?;
            let mut out = std::io::stdout();
            let g = engine
                .generate(&ids, &request, &mut |ev| {
                    let _ = out.write_all(ev.text.as_bytes());
                    let _ = out.flush();
                    true
                })
                .await?;
            println!();
            eprintln!(
                "[{} prompt tokens in {:.0} ms, {} tokens in {:.0} ms: {:.1} tok/s, finish: {:?}]",
                g.prompt_tokens.len(),
                g.prefill_ms,
                g.tokens.len(),
                g.decode_ms,
                g.tokens.len() as f64 / (g.decode_ms / 1000.0).max(1e-9),
                g.finish_reason
            );
            if let Some(w) = &g.warning {
                eprintln!("[{w}]");
            }
            return Ok(());
        }
        let items = read_json(args.text("input"), "--input (or --prompt)")?;
        let items = items.as_array().ok_or_else(|| anyhow!("--input must hold a JSON array"))?;
        let mut engine = load(args).await?;
        // Every item's prompt and constraint are checked before anything is generated.
        let mut work = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let id = item.get("id").and_then(Value::as_str).unwrap_or("").to_string();
            let mut request = request.clone();
            if let Some(format) = item.get("response_format") {
                request.constraint = Constraint::from_response_format(format).with_context(|| format!("item {i} ({id})"))?;
            }
            let parallel = item.get("parallel_tool_calls").and_then(Value::as_bool);
            request.tools = Tools::from_options(item.get("tools"), item.get("tool_choice"), parallel).with_context(|| format!("item {i} ({id})"))?;
            let prompt_ids = if let Some(p) = item.get("prompt").and_then(Value::as_str) {
                if request.tools.is_some() {
                    bail!("item {i} ({id}): tools need \"messages\" (a chat), not a raw \"prompt\"");
                }
                engine.text_prompt(p)?
            } else if let Some(m) = item.get("messages") {
                let messages: Vec<Message> = serde_json::from_value(m.clone())
                    .with_context(|| format!("item {i}: \"messages\" must be [{{role, content}}]"))?;
                engine.openai_chat_prompt(&messages, request.tools.as_ref()).with_context(|| format!("item {i} ({id})"))?
            } else {
                bail!("item {i} needs \"prompt\" or \"messages\"");
            };
            if let Some(c) = request.output_constraint().with_context(|| format!("item {i} ({id})"))? {
                engine.grammars()?.start(&c).with_context(|| format!("item {i} ({id})"))?;
            }
            work.push((id, prompt_ids, request));
        }
        for (id, prompt_ids, request) in work {
            let g = engine.generate(&prompt_ids, &request, &mut |_| true).await?;
            let mut line = json!({
                "id": id, "prompt_tokens": g.prompt_tokens, "tokens": g.tokens, "text": g.text,
                "finish_reason": g.finish_reason, "prefill_ms": g.prefill_ms, "decode_ms": g.decode_ms,
            });
            if let Some(w) = g.warning {
                line["warning"] = json!(w);
            }
            if let Some(calls) = g.tool_calls {
                line["tool_calls"] = json!(calls);
            }
            print_line(&line)?;
        }
        Ok(())
    }

    /// Replays conversations: each line `{id, conversation, system?, user, max_tokens}` continues its
    /// conversation (system prompt, earlier turns with the engine's own replies, then this turn),
    /// greedy. A conversation's turns run in file order, each after the previous one finished;
    /// different conversations run concurrently, up to `--max-batch` ([`TRACE_MAX_BATCH`]).
    async fn trace(args: &Args) -> Result<()> {
        let path = args.text("input").ok_or_else(|| anyhow!("--input FILE.jsonl is required"))?;
        let max_batch = args.count("max-batch", TRACE_MAX_BATCH);
        if max_batch == 0 {
            bail!("--max-batch must be at least 1");
        }
        let requests = read_trace(path)?;
        let mut opts = engine_options(args);
        opts.sched.max_batch = max_batch;
        let bytes = model_bytes(args)?;
        let mut engine = Engine::load(&bytes, opts.clone()).await?;
        // --disaggregate: a second engine only prefills; each prompt's K/V travel to the decoding
        // engine as a snapshot, which then recomputes only the prompt's last token.
        let mut prefill_engine = if args.flag("disaggregate") {
            if !engine.kv_cache().prefix_cache_enabled() {
                bail!("--disaggregate moves K/V through the prefix cache: it needs the paged layout and no --no-prefix-cache");
            }
            Some(Engine::load(&bytes, opts).await?)
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

    /// A profile of one prefill and one steady-state decode step ([`Engine::profile`]): one JSON
    /// line (the `Profile` plus the summary fields CONTRACTS names and the per-kernel
    /// `prefill_ms`/`decode_ms` pairs of old), or with `--table` the same for people.
    async fn profile(args: &Args) -> Result<()> {
        if args.flag("json") && args.flag("table") {
            bail!("profile prints JSON (--json, the default) or a table (--table), not both");
        }
        let n = args.count("prompt-tokens", PROFILE_PROMPT_TOKENS);
        let mut opts = engine_options(args);
        opts.max_context = opts.max_context.max(n + pagedlm::engine::PROFILE_EXTRA_TOKENS);
        let bytes = model_bytes(args)?;
        let mut engine = Engine::load(&bytes, opts).await?;
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

    /// Aggregate decode throughput of `batch` sequences decoding together: every request gets its
    /// own `context`-token prompt and decodes `gen_tokens` tokens (end-of-generation ignored);
    /// the clock runs from the step after the last prompt finished prefilling to the first
    /// request's end, over the tokens all of them produced meanwhile.
    async fn bench_batch(args: &Args, mut opts: EngineOptions, batch: u32, context: u32, gen_tokens: u32) -> Result<()> {
        opts.sched.max_batch = batch;
        opts.pool_tokens = opts.pool_tokens.max(batch * (context + gen_tokens + 16));
        let bytes = model_bytes(args)?;
        let mut engine = Engine::load(&bytes, opts).await?;
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
        let mut opts = engine_options(args);
        if opts.max_context == 0 {
            opts.max_context = longest + 16;
        }
        let bytes = model_bytes(args)?;
        let mut source = Engine::load(&bytes, opts.clone()).await?;
        let mut target = Engine::load(&bytes, opts).await?;
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
        let mut opts = engine_options(args);
        opts.prefix_cache = false;
        opts.sched.max_batch = 5;
        // Room for everything at once: the point is the schedule, not preemption.
        const DECODE_TOKENS: u32 = 1024;
        if opts.max_context == 0 {
            opts.max_context = long.max(DECODE_TOKENS + 64) + 16;
        }
        opts.pool_tokens = opts.pool_tokens.max(long + 4 * (DECODE_TOKENS + 64) + 256);
        let bytes = model_bytes(args)?;
        let mut engine = Engine::load(&bytes, opts.clone()).await?;
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

    async fn bench(args: &Args) -> Result<()> {
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
        let mut opts = engine_options(args);
        let needed = prompt_tokens.max(context) + gen_tokens + 1;
        if opts.max_context == 0 {
            opts.max_context = needed;
        }
        // Raw speed: no request may reuse another's K/V.
        opts.prefix_cache = false;
        if batch > 1 || args.given("batch") {
            return bench_batch(args, opts, batch, context.max(prompt_tokens).max(1), gen_tokens).await;
        }
        let bytes = model_bytes(args)?;
        let mut engine = Engine::load(&bytes, opts).await?;
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
        print_line(&line)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The usage text shows the defaults the commands take: their own constants, and the
        /// library's backend for users.
        #[test]
        fn usage_shows_the_defaults() {
            let lengths: Vec<String> = TRANSFER_LENGTHS.iter().map(u32::to_string).collect();
            let backend = serde_json::to_value(EngineOptions::for_users().backend).unwrap();
            let backend = backend.as_str().unwrap();
            for shown in [
                format!("bench     [--prompt-tokens {BENCH_PROMPT_TOKENS}] [--gen-tokens {BENCH_GEN_TOKENS}]"),
                format!("--transfer [--lengths {}]", lengths.join(",")),
                format!("--interference [--prompt-tokens {INTERFERENCE_PROMPT_TOKENS}]"),
                format!("profile   [--prompt-tokens {PROFILE_PROMPT_TOKENS}]"),
                format!("--backend auto|webgpu|cpu   (default {backend}:"),
            ] {
                assert!(USAGE.contains(&shown), "the usage text does not say {shown:?}");
            }
        }
    }
}
