//! Writes a tiny synthetic llama GGUF (random weights, the 259-token byte vocabulary and
//! SmolLM2's chat template): a model that loads and decodes in well under a second, for the
//! end-to-end tests and the soak run, which exercise the engine, the package and the page rather
//! than the model's words.
//!
//! With `--arch NAME`, the synthetic model of another architecture the tests hold against
//! llama.cpp (`pagedlm::synth::family_model`: qwen2, qwen3, llama3, phi3, gemma2, smollm3).
//!
//! `cargo run --features testing --example write_tiny_model -- OUT [--seed N] [--name NAME] [--context N] [--arch NAME]`
use std::process::ExitCode;

use pagedlm::synth::{family_model, try_tiny_llama_gguf, SynthConfig, FAMILY_MODELS};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut cfg = SynthConfig::tiny();
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
    let written = try_tiny_llama_gguf(&cfg).map_err(|e| e.to_string()).and_then(|bytes| std::fs::write(&out, bytes).map_err(|e| format!("{out}: {e}")));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_tiny_model: {e}");
            ExitCode::FAILURE
        }
    }
}
