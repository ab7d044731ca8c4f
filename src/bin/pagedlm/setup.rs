//! What every command shares: the model file, the engine's and a request's options from the
//! command line (over the library's own defaults, as the package does), and JSON in and out.

use std::io::Write;

use anyhow::{anyhow, bail, Context as _, Result};
use pagedlm::engine::{AdapterClass, BackendChoice, DeviceLimits, Speculative};
use pagedlm::engine::{Constraint, Engine, EngineOptions, GenerateRequest, KvDtype, KvLayout};
use pagedlm::gguf::{part_names, DiskFile, ReadAt};
use serde_json::Value;

use crate::args::Args;

pub(crate) const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model's files, opened to be read by ranges (never read whole): `--model PATH`, or every
/// part of a split model when PATH is its first (`name-00001-of-00003.gguf`).
pub(crate) fn model_files(args: &Args) -> Result<Vec<DiskFile>> {
    let path = std::path::Path::new(args.text("model").unwrap_or(DEFAULT_MODEL));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let paths = match part_names(name) {
        Some(parts) => parts.iter().map(|p| path.with_file_name(p)).collect(),
        None => vec![path.to_path_buf()],
    };
    paths
        .iter()
        .map(|p| DiskFile::open(p).with_context(|| format!("cannot read the model at {} (run `npm run fetch-model`, or pass --model PATH)", p.display())))
        .collect()
}

/// The engine on the model of `--model` under `options`, its file read by ranges.
pub(crate) async fn load_engine(args: &Args, options: EngineOptions) -> Result<Engine> {
    let files = model_files(args)?;
    let sources: Vec<&dyn ReadAt> = files.iter().map(|f| f as &dyn ReadAt).collect();
    Ok(Engine::load_from(&sources, options, &mut |_| {}).await?)
}

pub(crate) fn read_json(path: Option<&str>, what: &str) -> Result<Value> {
    let path = path.ok_or_else(|| anyhow!("{what} FILE is required"))?;
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    serde_json::from_str(&text).with_context(|| format!("{path} is not valid JSON"))
}

/// The engine's options: [`EngineOptions::for_users`], the defaults the package starts from
/// too, with what the command line set.
pub(crate) fn engine_options(args: &Args) -> EngineOptions {
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
    o.sched.speculative = args.text("speculative").and_then(Speculative::parse).unwrap_or(o.sched.speculative);
    o.sched.max_draft = args.count("max-draft", o.sched.max_draft);
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

/// [`engine_options`] for the commands that measure plain decoding (`bench`): speculation
/// off unless `--speculative` is given.
pub(crate) fn measuring_options(args: &Args) -> EngineOptions {
    let mut o = engine_options(args);
    if args.text("speculative").is_none() {
        o.sched.speculative = Speculative::Off;
    }
    o
}

pub(crate) async fn load(args: &Args) -> Result<Engine> {
    load_engine(args, engine_options(args)).await
}

pub(crate) fn print_line(v: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(())
}

/// `generate`'s request: [`GenerateRequest::default`], the defaults the package starts from
/// too, with the sampling options and the token limit the command line set.
pub(crate) fn request_options(args: &Args) -> GenerateRequest {
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

/// The chat template's extra variables for every chat item of `generate`:
/// `--chat-template-kwargs '{"enable_thinking": false}'` (an item's own `chat_template_kwargs` win).
pub(crate) fn chat_template_kwargs_option(args: &Args) -> Result<serde_json::Map<String, serde_json::Value>> {
    match args.text("chat-template-kwargs") {
        None => Ok(serde_json::Map::new()),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(kwargs)) => Ok(kwargs),
            _ => bail!("--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": false}}'"),
        },
    }
}

/// The constraint every item of `generate` gets: `--json-schema FILE` or `--grammar FILE`.
pub(crate) fn constraint_option(args: &Args) -> Result<Option<Constraint>> {
    match (args.text("json-schema"), args.text("grammar")) {
        (Some(_), Some(_)) => bail!("--json-schema and --grammar exclude each other: give one"),
        (Some(path), None) => Ok(Some(Constraint::JsonSchema(read_json(Some(path), "--json-schema")?))),
        (None, Some(path)) => Ok(Some(Constraint::Lark(std::fs::read_to_string(path).with_context(|| format!("cannot read --grammar {path}"))?))),
        (None, None) => Ok(None),
    }
}
