//! Writes a tiny synthetic llama GGUF (random weights, the 259-token byte vocabulary and
//! SmolLM2's chat template): a model that loads and decodes in well under a second, for the
//! end-to-end tests and the soak run, which exercise the engine, the package and the page rather
//! than the model's words.
//!
//! `cargo run --features testing --example write_tiny_model -- OUT [--seed N] [--name NAME] [--context N] [--chat-template FILE]`
//! (`--chat-template`: another family's template in place of SmolLM2's, e.g. one of
//! tests/data/templates/).
use std::process::ExitCode;

use pagedlm::synth::{try_tiny_llama_gguf, with_chat_template, SynthConfig};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut cfg = SynthConfig::tiny();
    let mut chat_template = None;
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().ok_or_else(|| format!("{arg} needs {what}"));
        let parsed = match arg.as_str() {
            "--seed" => value("a number").and_then(|v| v.parse().map_err(|e| format!("--seed {v}: {e}"))).map(|v| cfg.seed = v),
            "--context" => value("a number").and_then(|v| v.parse().map_err(|e| format!("--context {v}: {e}"))).map(|v| cfg.context = v),
            "--name" => value("a name").map(|v| cfg.name = Some(v)),
            "--chat-template" => {
                value("a file").and_then(|v| std::fs::read_to_string(&v).map_err(|e| format!("--chat-template {v}: {e}"))).map(|t| chat_template = Some(t))
            }
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
        eprintln!("usage: write_tiny_model OUT [--seed N] [--name NAME] [--context N] [--chat-template FILE]");
        return ExitCode::from(2);
    };
    let bytes = try_tiny_llama_gguf(&cfg).and_then(|bytes| match &chat_template {
        Some(t) => with_chat_template(&bytes, t),
        None => Ok(bytes),
    });
    let written = bytes.map_err(|e| e.to_string()).and_then(|bytes| std::fs::write(&out, bytes).map_err(|e| format!("{out}: {e}")));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_tiny_model: {e}");
            ExitCode::FAILURE
        }
    }
}
