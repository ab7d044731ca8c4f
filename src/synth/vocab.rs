//! A Hugging Face `tokenizer.json` turned into a GGUF's `tokenizer.*` metadata the way llama.cpp's
//! `convert_hf_to_gguf.py` writes it: byte-level BPE models through `get_vocab_base`,
//! SentencePiece models through `_create_vocab_sentencepiece` (rebuilt from `tokenizer.json`, see
//! [`spm_tokens`]), both with `gguf.SpecialVocab`; so tests and synthetic models can use a real
//! vocabulary without a real model file. scripts/tokenizer-refs.py is the same conversion in
//! Python, feeding llama.cpp.
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
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
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
    /// `tokenizer.ggml.add_space_prefix`, which some model classes of the converter write
    /// (Gemma 2: false).
    #[serde(default)]
    pub add_space_prefix: Option<bool>,
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
    #[serde(default)]
    unk_token: Option<String>,
}

/// One entry of `tokenizer_config.json`'s `added_tokens_decoder`.
#[derive(Deserialize)]
struct ConfigAddedToken {
    content: String,
    #[serde(default)]
    special: bool,
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
    let hf: HfTokenizer = serde_json::from_str(tokenizer_json).map_err(|e| invalid(e.to_string()))?;
    if hf.model.kind != "BPE" {
        return Err(invalid(format!("model type {:?}, expected BPE (SentencePiece BPE files say BPE too)", hf.model.kind)));
    }
    let mut config: serde_json::Map<String, Value> = match tokenizer_config_json {
        Some(text) => serde_json::from_str(text).map_err(|e| GgufError::InvalidWrite(format!("tokenizer_config.json: {e}")))?,
        None => serde_json::Map::new(),
    };
    config.extend(facts.tokenizer_config.clone());

    let mut added: BTreeMap<u32, AddedTokenFact> = hf.added_tokens.iter().map(|t| (t.id, t.clone())).collect();
    added.extend(facts.added_tokens.iter().map(|t| (t.id, t.clone())));
    let highest = hf.model.vocab.values().chain(added.keys()).copied().max().ok_or_else(|| invalid("empty vocabulary".into()))?;
    let vocab_size = facts.vocab_size.unwrap_or(0).max(highest as usize + 1);
    let merges = joined_merges(&hf.model.merges);

    let mut meta = vec![
        ("tokenizer.ggml.model".to_string(), MetaValue::String(facts.model.clone())),
        ("tokenizer.ggml.pre".to_string(), MetaValue::String(facts.pre.clone())),
    ];
    let (tokens, types) = match facts.model.as_str() {
        "gpt2" => {
            let (tokens, types) = bpe_tokens(&hf.model, &added, vocab_size);
            meta.push(("tokenizer.ggml.merges".to_string(), MetaValue::Array(merges.into_iter().map(MetaValue::String).collect())));
            (tokens, types)
        }
        "llama" => {
            let decoder = config_added_tokens(&config, facts)?;
            let (tokens, scores, types) = spm_tokens(&hf.model, &merges, &decoder, vocab_size);
            meta.push(("tokenizer.ggml.scores".to_string(), MetaValue::Array(scores.into_iter().map(MetaValue::F32).collect())));
            (tokens, types)
        }
        other => return Err(invalid(format!("tokenizer model {other:?}: only \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece) are converted"))),
    };
    meta.push(("tokenizer.ggml.tokens".to_string(), MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect())));
    meta.push(("tokenizer.ggml.token_type".to_string(), MetaValue::Array(types.into_iter().map(MetaValue::I32).collect())));

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
    if let Some(add_space_prefix) = facts.add_space_prefix {
        meta.push(("tokenizer.ggml.add_space_prefix".to_string(), MetaValue::Bool(add_space_prefix)));
    }
    if let Some(Value::String(template)) = config.get("chat_template") {
        meta.push(("tokenizer.chat_template".to_string(), MetaValue::String(template.clone())));
    }
    Ok(meta)
}

/// The merges as GGUF writes them, "left right"; a space inside a pair-form merge becomes
/// U+0120, the byte-level alphabet's space, as gguf.SpecialVocab does.
fn joined_merges(merges: &[HfMerge]) -> Vec<String> {
    let byte_level_space = |part: &str| part.replace(' ', "\u{120}");
    merges
        .iter()
        .map(|merge| match merge {
            HfMerge::Joined(joined) => joined.clone(),
            HfMerge::Pair([left, right]) => format!("{} {}", byte_level_space(left), byte_level_space(right)),
        })
        .collect()
}

/// Byte-level BPE tokens and types (`get_vocab_base`): the vocabulary by id, added tokens as
/// control (special, or looking special) or user-defined, missing ids as unused `[PAD<id>]`.
fn bpe_tokens(model: &HfModel, added: &BTreeMap<u32, AddedTokenFact>, vocab_size: usize) -> (Vec<String>, Vec<i32>) {
    let mut by_id: Vec<Option<&str>> = vec![None; vocab_size];
    for (text, &id) in &model.vocab {
        by_id[id as usize] = Some(text);
    }
    by_id
        .into_iter()
        .enumerate()
        .map(|(id, text)| match (added.get(&(id as u32)), text) {
            (Some(token), _) if token.special || looks_special(&token.content) => (token.content.clone(), token_type::CONTROL),
            // The converter writes user-defined tokens with plain spaces.
            (Some(token), _) => (token.content.replace('\u{2581}', " "), token_type::USER_DEFINED),
            (None, Some(text)) => (text.to_string(), token_type::NORMAL),
            (None, None) => (format!("[PAD{id}]"), token_type::UNUSED),
        })
        .unzip()
}

/// tokenizer_config's `added_tokens_decoder` by id, with the facts' added tokens over it.
fn config_added_tokens(config: &serde_json::Map<String, Value>, facts: &VocabFacts) -> Result<BTreeMap<u32, AddedTokenFact>, GgufError> {
    let bad = |what: String| GgufError::InvalidWrite(format!("tokenizer_config.json added_tokens_decoder: {what}"));
    let mut decoder = BTreeMap::new();
    if let Some(entries) = config.get("added_tokens_decoder").and_then(Value::as_object) {
        for (id, entry) in entries {
            let id: u32 = id.parse().map_err(|_| bad(format!("id {id:?}")))?;
            let entry: ConfigAddedToken = serde_json::from_value(entry.clone()).map_err(|e| bad(e.to_string()))?;
            decoder.insert(id, AddedTokenFact { id, content: entry.content, special: entry.special });
        }
    }
    decoder.extend(facts.added_tokens.iter().map(|t| (t.id, t.clone())));
    Ok(decoder)
}

/// SentencePiece tokens, scores and types (`_create_vocab_sentencepiece`), rebuilt from
/// `tokenizer.json` because the copies at hand have no `tokenizer.model`.
///
/// SentencePiece BPE scores are a merge order, and `tokenizer.json`'s merges were generated from
/// them, sorted by the merged piece's score. So minus the rank of the first merge that makes a
/// piece stands in for its score: the same order, which is all llama.cpp's SPM merge compares.
/// Pieces no merge makes (single characters) can never be a merge's result; they get the lowest
/// score. `<0xNN>` pieces are bytes, the model's unknown piece unknown; then
/// `added_tokens_decoder` makes its tokens control or user-defined with score -1000, and missing
/// ids are unused `[PAD<id>]`, as the converter writes them.
fn spm_tokens(model: &HfModel, merges: &[String], decoder: &BTreeMap<u32, AddedTokenFact>, vocab_size: usize) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut first_rank: HashMap<String, usize> = HashMap::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        if let Some((left, right)) = merge.split_once(' ').filter(|(_, right)| !right.contains(' ')) {
            first_rank.entry(format!("{left}{right}")).or_insert(rank);
        }
    }
    let lowest = -((first_rank.len() + 1) as f32);
    let mut tokens: Vec<String> = (0..vocab_size).map(|id| format!("[PAD{id}]")).collect();
    let mut scores = vec![-10000.0f32; vocab_size];
    let mut types = vec![token_type::UNUSED; vocab_size];
    for (text, &id) in &model.vocab {
        let id = id as usize;
        let is_byte = text.len() == 6 && text.starts_with("<0x") && text.ends_with('>') && text[3..5].chars().all(|c| c.is_ascii_hexdigit());
        scores[id] = first_rank.get(text).map_or(lowest, |&rank| -(rank as f32));
        types[id] = match () {
            _ if is_byte => token_type::BYTE,
            _ if model.unk_token.as_deref() == Some(text.as_str()) => token_type::UNKNOWN,
            _ => token_type::NORMAL,
        };
        tokens[id] = text.clone();
    }
    for (&id, token) in decoder.range(..vocab_size as u32) {
        let id = id as usize;
        (tokens[id], types[id]) = if token.special || looks_special(&token.content) {
            (token.content.clone(), token_type::CONTROL)
        } else {
            (token.content.replace('\u{2581}', " "), token_type::USER_DEFINED)
        };
        scores[id] = -1000.0;
    }
    (tokens, scores, types)
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
