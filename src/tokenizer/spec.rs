//! What a tokenizer needs from a GGUF's `tokenizer.*` keys, in plain Rust types so the
//! tokenizer does not depend on how the file was read.

use crate::gguf::{Gguf, GgufError, MetaValue};

use super::TokenizerError;

/// Everything a tokenizer needs from a GGUF's `tokenizer.*` keys.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. "smollm" (BPE only; SentencePiece files say "default").
    pub pre: String,
    /// `tokenizer.ggml.tokens`: `[vocab_size]`, token id = index; byte-level strings ("Ġthe")
    /// for BPE, '▁'-escaped pieces ("▁the") for SentencePiece.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: `[vocab_size]` (see [`super::token_type`]), or empty: all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: "left right", highest priority first (BPE only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores`: `[vocab_size]` merge priorities, higher first (SentencePiece only).
    pub scores: Vec<f32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`: SentencePiece's fallback for a byte with no `<0xNN>`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` / `eom_token_id`: more tokens that end generation.
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    /// `tokenizer.chat_template` (Jinja source; only inspected, never executed).
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.add_bos_token`: whether prompts should start with BOS.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_space_prefix`: whether SentencePiece puts a space before raw text
    /// that starts the input or follows a special token (Gemma: no).
    pub add_space_prefix: bool,
}

impl TokenizerSpec {
    /// Reads the `tokenizer.*` keys. Required: `tokenizer.ggml.model`, `.tokens`, `.merges`
    /// (gpt2) or `.scores` (llama). Optional: `.pre` (llama.cpp's "default" when absent),
    /// `.token_type` (all normal), the special ids, `.add_bos_token` and `.add_space_prefix`
    /// (llama.cpp's defaults when absent: true for llama and for gpt2 with a Llama 3
    /// pre-tokenizer, else false),
    /// `tokenizer.chat_template`.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<TokenizerSpec, TokenizerError> {
        let meta_err = |key: &str, e: GgufError| TokenizerError::Metadata { key: key.to_string(), reason: e.to_string() };
        let required_str = |key: &str| gguf.get_str(key).map(str::to_string).map_err(|e| meta_err(key, e));
        let optional_str = |key: &str| match gguf.get(key) {
            None => Ok(None),
            Some(_) => gguf.get_str(key).map(|s| Some(s.to_string())).map_err(|e| meta_err(key, e)),
        };
        let optional_u32 = |key: &str| match gguf.get(key) {
            None => Ok(None),
            Some(_) => gguf.get_u32(key).map(Some).map_err(|e| meta_err(key, e)),
        };
        let optional_bool = |key: &str, default: bool| match gguf.get(key) {
            None => Ok(default),
            Some(_) => gguf.get_bool(key).map_err(|e| meta_err(key, e)),
        };
        let strings =
            |key: &str| gguf.get_str_array(key).map(|items| items.into_iter().map(str::to_string).collect::<Vec<String>>()).map_err(|e| meta_err(key, e));

        const TYPES: &str = "tokenizer.ggml.token_type";
        const MERGES: &str = "tokenizer.ggml.merges";
        let model = required_str("tokenizer.ggml.model")?;
        let spm = model == "llama";
        let pre = optional_str("tokenizer.ggml.pre")?.unwrap_or_else(|| "default".to_string());
        // llama.cpp's default: SentencePiece and the Llama 3 family start prompts with BOS.
        let add_bos_default = spm || (model == "gpt2" && super::bpe::pre_tokenizer(&pre).is_ok_and(|p| p.add_bos));
        Ok(TokenizerSpec {
            pre,
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types: match gguf.get(TYPES) {
                None => Vec::new(),
                Some(_) => gguf.get_i32_array(TYPES).map_err(|e| meta_err(TYPES, e))?,
            },
            // SentencePiece files have no merges; a BPE file without them is an error here.
            merges: match gguf.get(MERGES) {
                None if spm => Vec::new(),
                _ => strings(MERGES)?,
            },
            scores: if spm { scores(gguf)? } else { Vec::new() },
            bos_id: optional_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: optional_u32("tokenizer.ggml.eos_token_id")?,
            unk_id: optional_u32("tokenizer.ggml.unknown_token_id")?,
            eot_id: optional_u32("tokenizer.ggml.eot_token_id")?,
            eom_id: optional_u32("tokenizer.ggml.eom_token_id")?,
            chat_template: optional_str("tokenizer.chat_template")?,
            add_bos: optional_bool("tokenizer.ggml.add_bos_token", add_bos_default)?,
            add_space_prefix: optional_bool("tokenizer.ggml.add_space_prefix", spm)?,
            model,
        })
    }
}

/// `tokenizer.ggml.scores`: an array of numbers.
fn scores(gguf: &Gguf<'_>) -> Result<Vec<f32>, TokenizerError> {
    const SCORES: &str = "tokenizer.ggml.scores";
    let bad = |reason: &str| TokenizerError::Metadata { key: SCORES.to_string(), reason: reason.to_string() };
    let items = gguf
        .get(SCORES)
        .ok_or_else(|| bad("missing: a SentencePiece vocabulary needs a score per token"))?
        .as_array()
        .ok_or_else(|| bad("expected an array of numbers"))?;
    items.iter().map(|v: &MetaValue| v.as_f64().map(|f| f as f32).ok_or_else(|| bad("expected an array of numbers"))).collect()
}
