//! A Hugging Face `tokenizer.json` turned into a GGUF's `tokenizer.*` metadata the way llama.cpp's
//! `convert_hf_to_gguf.py` writes it for byte-level BPE models (`get_vocab_base` and
//! `gguf.SpecialVocab`), so tests and synthetic models can use a real vocabulary without a real
//! model file. scripts/tokenizer-refs.py is the same conversion in Python, feeding llama.cpp.
//!
//! A `tokenizer.json` does not carry everything the converter reads: the pre-tokenizer name comes
//! from convert_hf_to_gguf's table of tokenizer hashes, special ids from `config.json`, and a
//! copy may be of another revision than the model's. [`VocabFacts`] supplies those.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::Value;

use crate::gguf::{GgufError, MetaValue};
use crate::tokenizer::token_type;

/// What the conversion needs beyond `tokenizer.json` and `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct VocabFacts {
    /// `tokenizer.ggml.model`; only "gpt2" (byte-level BPE) is converted.
    pub model: String,
    /// `tokenizer.ggml.pre`, as convert_hf_to_gguf's `get_vocab_base_pre` names the tokenizer:
    /// "qwen2", "llama-bpe", "gpt-4o", "deepseek-r1-qwen", ...
    pub pre: String,
    /// `config.json`'s `<kind>_token_id` ("bos" -> 151643): used for the kinds whose token
    /// `tokenizer_config.json` does not name, as the converter does.
    #[serde(default)]
    pub config_token_ids: BTreeMap<String, u32>,
    /// Fields of `tokenizer_config.json` that replace the copy's (`eos_token`, `add_bos_token`).
    #[serde(default)]
    pub tokenizer_config: serde_json::Map<String, Value>,
    /// Added tokens that replace the copy's at the same id, or add new ids (a later revision's
    /// chat tokens).
    #[serde(default)]
    pub added_tokens: Vec<AddedTokenFact>,
    /// `config.json`'s `vocab_size` when larger than the tokenizer's: the rest become unused
    /// `[PAD<id>]` tokens, as the converter writes them.
    #[serde(default)]
    pub vocab_size: Option<usize>,
    /// Overrides whatever `add_bos_token` the configs give.
    #[serde(default)]
    pub add_bos: Option<bool>,
}

/// One added token of a `tokenizer.json` (`added_tokens` entry).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AddedTokenFact {
    pub id: u32,
    pub content: String,
    pub special: bool,
}

#[derive(Deserialize)]
struct HfTokenizer {
    model: HfModel,
    #[serde(default)]
    added_tokens: Vec<AddedTokenFact>,
    #[serde(default)]
    post_processor: Option<Value>,
}

#[derive(Deserialize)]
struct HfModel {
    #[serde(rename = "type")]
    kind: String,
    vocab: HashMap<String, u32>,
    #[serde(default)]
    merges: Vec<HfMerge>,
}

/// A merge: "a b" (older files) or ["a", "b"] (transformers 4.45 and later).
#[derive(Deserialize)]
#[serde(untagged)]
enum HfMerge {
    Joined(String),
    Pair([String; 2]),
}

/// The special-token kinds the converter looks up, with their GGUF keys.
const SPECIAL_KINDS: [(&str, &str); 5] = [
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    // llama.cpp's spelling.
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
];

/// convert_hf_to_gguf's `does_token_look_special`: added tokens a model forgot to mark special.
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<\u{ff5c}") && text.ends_with("\u{ff5c}>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// The `tokenizer.*` metadata llama.cpp's converter writes for this tokenizer: model, pre,
/// tokens, token types, merges, special ids, `add_bos_token` (when the configs say) and the chat
/// template (when `tokenizer_config.json` has one). Add them to a [`super::GgufWriter`], or read
/// them back with [`crate::tokenizer::TokenizerSpec::from_gguf`].
pub fn vocab_from_tokenizer_json(tokenizer_json: &str, tokenizer_config_json: Option<&str>, facts: &VocabFacts) -> Result<Vec<(String, MetaValue)>, GgufError> {
    let invalid = |what: String| GgufError::InvalidWrite(format!("tokenizer.json: {what}"));
    if facts.model != "gpt2" {
        return Err(invalid(format!("tokenizer model {:?}: only byte-level BPE (\"gpt2\") is converted", facts.model)));
    }
    let hf: HfTokenizer = serde_json::from_str(tokenizer_json).map_err(|e| invalid(e.to_string()))?;
    if hf.model.kind != "BPE" {
        return Err(invalid(format!("model type {:?}, expected BPE", hf.model.kind)));
    }
    let mut config: serde_json::Map<String, Value> = match tokenizer_config_json {
        Some(text) => serde_json::from_str(text).map_err(|e| GgufError::InvalidWrite(format!("tokenizer_config.json: {e}")))?,
        None => serde_json::Map::new(),
    };
    config.extend(facts.tokenizer_config.clone());

    let mut added: BTreeMap<u32, AddedTokenFact> = hf.added_tokens.into_iter().map(|t| (t.id, t)).collect();
    added.extend(facts.added_tokens.iter().map(|t| (t.id, t.clone())));
    let highest = hf.model.vocab.values().chain(added.keys()).copied().max().ok_or_else(|| invalid("empty vocabulary".into()))?;
    let vocab_size = facts.vocab_size.unwrap_or(0).max(highest as usize + 1);
    let mut by_id: Vec<Option<&str>> = vec![None; vocab_size];
    for (text, &id) in &hf.model.vocab {
        by_id[id as usize] = Some(text);
    }

    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for (id, text) in by_id.into_iter().enumerate() {
        let (text, kind) = match (added.get(&(id as u32)), text) {
            (Some(token), _) if token.special || looks_special(&token.content) => (token.content.clone(), token_type::CONTROL),
            // The converter writes user-defined tokens with plain spaces.
            (Some(token), _) => (token.content.replace('\u{2581}', " "), token_type::USER_DEFINED),
            (None, Some(text)) => (text.to_string(), token_type::NORMAL),
            (None, None) => (format!("[PAD{id}]"), token_type::UNUSED),
        };
        tokens.push(MetaValue::String(text));
        types.push(MetaValue::I32(kind));
    }
    // A space inside a pair-form merge is written as U+0120, the byte-level alphabet's space.
    let byte_level_space = |part: &str| part.replace(' ', "\u{120}");
    let merges = hf
        .model
        .merges
        .into_iter()
        .map(|merge| match merge {
            HfMerge::Joined(joined) => MetaValue::String(joined),
            HfMerge::Pair([left, right]) => MetaValue::String(format!("{} {}", byte_level_space(&left), byte_level_space(&right))),
        })
        .collect();

    let mut meta = vec![
        ("tokenizer.ggml.model".to_string(), MetaValue::String(facts.model.clone())),
        ("tokenizer.ggml.pre".to_string(), MetaValue::String(facts.pre.clone())),
        ("tokenizer.ggml.tokens".to_string(), MetaValue::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), MetaValue::Array(types)),
        ("tokenizer.ggml.merges".to_string(), MetaValue::Array(merges)),
    ];
    // gguf.SpecialVocab: the token texts tokenizer_config names (first added token with that
    // text), then config.json's ids for the kinds still missing.
    let mut first_added_id: HashMap<&str, u32> = HashMap::new();
    for (&id, token) in &added {
        first_added_id.entry(token.content.as_str()).or_insert(id);
    }
    let special_text = |kind: &str| match config.get(&format!("{kind}_token")) {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Object(entry)) => entry.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    for (kind, key) in SPECIAL_KINDS {
        let id = special_text(kind).and_then(|text| first_added_id.get(text.as_str()).copied()).or_else(|| facts.config_token_ids.get(kind).copied());
        if let Some(id) = id.filter(|&id| (id as usize) < vocab_size) {
            meta.push((key.to_string(), MetaValue::U32(id)));
        }
    }
    if let Some(add_bos) = facts.add_bos.or_else(|| add_bos_from_configs(&config, hf.post_processor.as_ref(), special_text("bos").as_deref())) {
        meta.push(("tokenizer.ggml.add_bos_token".to_string(), MetaValue::Bool(add_bos)));
    }
    if let Some(Value::String(template)) = config.get("chat_template") {
        meta.push(("tokenizer.chat_template".to_string(), MetaValue::String(template.clone())));
    }
    Ok(meta)
}

/// `add_bos_token` as gguf.SpecialVocab finds it: tokenizer_config's flag, else whether the
/// post-processor's template starts with the BOS token; `None` when neither says.
fn add_bos_from_configs(config: &serde_json::Map<String, Value>, post_processor: Option<&Value>, bos_text: Option<&str>) -> Option<bool> {
    if let Some(&Value::Bool(flag)) = config.get("add_bos_token") {
        return Some(flag);
    }
    let post = post_processor?;
    let processors = match post.get("processors").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![post],
    };
    let mut add_bos = None;
    for processor in processors {
        if processor.get("type").and_then(Value::as_str) != Some("TemplateProcessing") {
            continue;
        }
        let single = processor.get("single").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let first = single.first().and_then(|item| item.pointer("/SpecialToken/id")).and_then(Value::as_str);
        if let (true, Some(first)) = (single.len() > 1, first) {
            add_bos = Some(Some(first) == bos_text);
        }
    }
    add_bos
}
