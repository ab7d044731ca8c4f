//! Byte-level BPE tokenizer built from a GGUF's `tokenizer.*` metadata, matching llama.cpp's
//! tokenization of GPT-2 style vocabularies (SmolLM2: `tokenizer.ggml.model = gpt2`,
//! `tokenizer.ggml.pre = smollm`), plus streaming-safe decoding and ChatML prompt rendering.
//!
//! Encoding goes through the `tokenizers` crate (built in code, no `tokenizer.json`), so it runs
//! natively and in the browser. Decoding does not: it concatenates each token's raw bytes, which
//! is what llama.cpp does and what a streaming decoder needs anyway.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Token texts llama.cpp treats as end-of-generation (`llama_vocab::impl::load`, EOG list).
/// They are recognised by name because GGUF files carry no per-token "ends a turn" flag.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad/repo/separator token texts: llama.cpp also ends generation on them
/// (a code model that emits one has left the document). SmolLM2's `<reponame>` (id 4) is one.
const FIM_EOG_NAMES: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "tokenizer model '{0}' is not supported: pagedlm only reads byte-level BPE vocabularies \
         (tokenizer.ggml.model = \"gpt2\"), e.g. SmolLM2"
    )]
    UnsupportedModel(String),
    #[error(
        "pre-tokenizer '{0}' is not supported: pagedlm knows \"smollm\" (and its llama.cpp \
         siblings \"starcoder\", \"refact\") and plain \"gpt-2\"; other pre-tokenizers split \
         text differently and would give wrong token ids"
    )]
    UnsupportedPreTokenizer(String),
    #[error("the vocabulary is empty (tokenizer.ggml.tokens has no entries)")]
    EmptyVocab,
    #[error("the vocabulary has {0} tokens, more than a u32 token id can address")]
    VocabTooLarge(usize),
    #[error(
        "tokenizer.ggml.token_type has {types} entries but tokenizer.ggml.tokens has {tokens}; \
         the file is inconsistent"
    )]
    TokenTypeCount { tokens: usize, types: usize },
    #[error("merge #{index} '{merge}' is not two tokens separated by one space")]
    MalformedMerge { index: usize, merge: String },
    #[error("{what} token id {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        what: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("building the BPE model failed: {0} (are merges and vocabulary from the same file?)")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(
        "this model's vocabulary has no '{0}' token, so it cannot use the ChatML chat format \
         pagedlm renders; pass a raw prompt instead"
    )]
    NoChatTokens(&'static str),
    #[error("GGUF tokenizer metadata '{key}': {reason}")]
    Metadata { key: String, reason: String },
}

/// Everything a tokenizer needs from a GGUF's `tokenizer.*` keys, in plain Rust types so the
/// tokenizer does not depend on how the file was read.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`, e.g. "gpt2".
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. "smollm".
    pub pre: String,
    /// `tokenizer.ggml.tokens`: `[vocab_size]`, token id = index; byte-level strings ("Ġthe").
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: `[vocab_size]` (see [`token_type`]), or empty: all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: "left right", highest priority first.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// `tokenizer.chat_template` (Jinja source; only inspected, never executed).
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.add_bos_token`: whether prompts should start with BOS.
    pub add_bos: bool,
}

/// One chat turn. `role` is free text ("system", "user", "assistant", ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A ready tokenizer: encode text to ids, decode ids to text, render chat prompts.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    token_types: Vec<i32>,
    /// Raw bytes each token stands for: [vocab_size]. Shared with every [`StreamDecoder`].
    token_bytes: Arc<Vec<Box<[u8]>>>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eog_ids: Vec<u32>,
    add_bos: bool,
    chat: ChatFormat,
}

/// Checks what the BPE model needs: a byte-level BPE vocabulary with a pre-tokenizer pagedlm
/// knows, a type for every token (all normal when the file has none), special ids inside the
/// vocabulary. Returns whether digits split one by one, and the token types.
fn check_spec(spec: &TokenizerSpec) -> Result<(bool, Vec<i32>), TokenizerError> {
    if spec.model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel(spec.model.clone()));
    }
    // llama.cpp gives "smollm", "starcoder" and "refact" the same regex: every digit on its
    // own, then the GPT-2 split. HF's Digits(individual) + ByteLevel(use_regex) is the same.
    let split_digits = match spec.pre.as_str() {
        "smollm" | "starcoder" | "refact" => true,
        "gpt-2" => false,
        _ => return Err(TokenizerError::UnsupportedPreTokenizer(spec.pre.clone())),
    };
    let vocab_size = spec.tokens.len();
    if vocab_size == 0 {
        return Err(TokenizerError::EmptyVocab);
    }
    if u32::try_from(vocab_size).is_err() {
        return Err(TokenizerError::VocabTooLarge(vocab_size));
    }
    let token_types = if spec.token_types.is_empty() {
        vec![token_type::NORMAL; vocab_size]
    } else if spec.token_types.len() != vocab_size {
        return Err(TokenizerError::TokenTypeCount {
            tokens: vocab_size,
            types: spec.token_types.len(),
        });
    } else {
        spec.token_types.clone()
    };
    for (what, id) in [("BOS", spec.bos_id), ("EOS", spec.eos_id)] {
        if let Some(id) = id {
            if id as usize >= vocab_size {
                return Err(TokenizerError::SpecialIdOutOfRange { what, id, vocab_size });
            }
        }
    }
    Ok((split_digits, token_types))
}

/// The `tokenizers` BPE model over the spec's vocabulary and merges, with the byte-level
/// pre-tokenizer (digits split first when `split_digits`), decoder and added tokens.
fn bpe_tokenizer(spec: &TokenizerSpec, token_types: &[i32], split_digits: bool) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = parse_merges(&spec.merges)?;
    // Keep the first id of a duplicated token string: the BPE model needs a map, and the
    // duplicate is unreachable by encoding anyway (llama.cpp resolves it the same way).
    let mut vocab = Vocab::default();
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TokenizerError::Build(e.to_string()))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(false, true, true);
    let pre = if split_digits {
        PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(byte_level),
        ]))
    } else {
        PreTokenizerWrapper::ByteLevel(byte_level)
    };
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(DecoderWrapper::ByteLevel(byte_level)));

    // llama.cpp splits control, unknown and user-defined tokens out of the text before BPE
    // (longest first); added tokens do the same. Only control/unknown are "special" (hidden
    // by skip-special decoding); user-defined tokens are ordinary text that must not be split.
    let added: Vec<AddedToken> = spec
        .tokens
        .iter()
        .zip(token_types)
        .filter_map(|(token, &kind)| match kind {
            token_type::CONTROL | token_type::UNKNOWN => Some(AddedToken::from(token.clone(), true)),
            token_type::USER_DEFINED => Some(AddedToken::from(token.clone(), false)),
            _ => None,
        })
        .collect();
    inner
        .add_special_tokens(added)
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
    Ok(inner)
}

/// How chat messages become a prompt string.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ChatFormat {
    /// Inserted as a system turn when the conversation does not start with one.
    default_system: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer. Fails with a typed error on an unsupported model / pre-tokenizer
    /// or inconsistent metadata; never panics on bad input.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer, TokenizerError> {
        let (split_digits, token_types) = check_spec(&spec)?;
        let inner = bpe_tokenizer(&spec, &token_types, split_digits)?;
        let byte_table = byte_level_decoder_table();
        let token_bytes: Vec<Box<[u8]>> = spec
            .tokens
            .iter()
            .zip(&token_types)
            .map(|(token, &kind)| match kind {
                token_type::NORMAL | token_type::UNUSED | token_type::BYTE => byte_level_bytes(&byte_table, token),
                // Added tokens are stored as their literal text, not in the byte-level alphabet.
                _ => token.as_bytes().into(),
            })
            .collect();

        let eog_ids = end_of_generation_ids(&spec.tokens, spec.eos_id);
        let chat = ChatFormat {
            default_system: spec.chat_template.as_deref().and_then(chatml_default_system),
        };

        Ok(Tokenizer {
            inner,
            tokens: spec.tokens,
            token_types,
            token_bytes: Arc::new(token_bytes),
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            eog_ids,
            add_bos: spec.add_bos,
            chat,
        })
    }

    /// Text to token ids, like llama.cpp's `tokenize(text, add_special=false, parse_special=true)`:
    /// special tokens written in the text (`<|im_start|>`) become their ids; no BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Ids to text: every token's bytes concatenated (special tokens as their literal text, like
    /// llama.cpp's `detokenize(special=true)`), then UTF-8 decoded; invalid sequences (a
    /// character cut off at the end) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id).ok_or_else(|| self.unknown_id(id))?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The raw bytes one token stands for (may be part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(|b| &b[..])
    }

    /// A decoder for generated tokens that only ever emits whole characters.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder {
            token_bytes: Arc::clone(&self.token_bytes),
            pending: Vec::new(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry as stored in the file (byte-level form: "Ġthe" for " the").
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether prompts for this model should start with [`Self::bos_id`] (SmolLM2: no).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Ids that end generation, sorted: EOS plus the tokens llama.cpp marks end-of-generation by
    /// name (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ... and the FIM pad/repo/separator
    /// tokens). SmolLM2: `<|endoftext|>` 0, `<|im_end|>` 2, `<reponame>` 4.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eog_ids.clone()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eog_ids.binary_search(&id).is_ok()
    }

    /// Control (and unknown) tokens: markup a chat UI hides. User-defined tokens are not
    /// special here: they are matched whole when encoding but are ordinary text.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_types.get(id as usize),
            Some(&token_type::CONTROL) | Some(&token_type::UNKNOWN)
        )
    }

    /// The system prompt inserted when a conversation has none (from the GGUF chat template).
    pub fn default_system_prompt(&self) -> Option<&str> {
        self.chat.default_system.as_deref()
    }

    /// Renders a conversation as a ChatML prompt: `<|im_start|>{role}\n{content}<|im_end|>\n`
    /// per message, preceded by the template's default system turn when `messages` does not
    /// start with a system message, followed by `<|im_start|>assistant\n` when
    /// `add_generation_prompt`.
    ///
    /// The GGUF's Jinja template is not executed: a template containing `<|im_start|>` is taken
    /// to be ChatML and only its literal default system prompt is read out of it. With no
    /// template, or a non-ChatML one, plain ChatML without a default system prompt is rendered,
    /// which needs `<|im_start|>` and `<|im_end|>` in the vocabulary. Message contents are not
    /// escaped: special-token text inside them is encoded as special tokens, as in llama.cpp.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        for marker in [IM_START, IM_END] {
            if self.token_to_id(marker).is_none() {
                return Err(TokenizerError::NoChatTokens(marker));
            }
        }
        let mut prompt = String::new();
        let mut turn = |role: &str, content: &str| {
            prompt.push_str(IM_START);
            prompt.push_str(role);
            prompt.push('\n');
            prompt.push_str(content);
            prompt.push_str(IM_END);
            prompt.push('\n');
        };
        let starts_with_system = messages.first().is_some_and(|m| m.role == "system");
        if let (false, Some(system)) = (starts_with_system, &self.chat.default_system) {
            turn("system", system);
        }
        for message in messages {
            turn(&message.role, &message.content);
        }
        if add_generation_prompt {
            prompt.push_str(IM_START);
            prompt.push_str("assistant\n");
        }
        Ok(prompt)
    }

    fn unknown_id(&self, id: u32) -> TokenizerError {
        TokenizerError::UnknownId {
            id,
            vocab_size: self.tokens.len(),
        }
    }
}

/// Turns generated ids into text incrementally without ever splitting a UTF-8 character: bytes of
/// an incomplete trailing character are held until the token that completes it arrives.
/// Concatenating every `push` result and `finish` gives exactly [`Tokenizer::decode`] of all ids.
pub struct StreamDecoder {
    token_bytes: Arc<Vec<Box<[u8]>>>,
    /// Bytes received but not yet emitted: at most one incomplete UTF-8 character (≤ 3 bytes).
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds one token; returns the text completed by it (often empty mid-character).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self.token_bytes.get(id as usize).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.token_bytes.len(),
        })?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(text) => {
                    out.push_str(text);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid_end = start + e.valid_up_to();
                    // Nothing is replaced here: the first `valid_up_to` bytes are valid.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match e.error_len() {
                        // Bytes that can never become valid: replace them the way
                        // `from_utf8_lossy` would, so streaming equals whole decoding.
                        Some(invalid) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + invalid;
                        }
                        // A character still waiting for its continuation bytes.
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Flushes held bytes; an unfinished character becomes U+FFFD. The decoder is then empty.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Reads the default system prompt out of a ChatML Jinja template: the literal text of the first
/// `<|im_start|>system\n ... <|im_end|>` that contains no Jinja expression. Returns `None` for
/// templates that only render the caller's system message, and for non-ChatML templates.
pub fn chatml_default_system(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    template.match_indices(OPEN).find_map(|(at, _)| {
        let rest = &template[at + OPEN.len()..];
        // The role line ends either in a real newline or in a Jinja string escape.
        let rest = rest.strip_prefix('\n').or_else(|| rest.strip_prefix("\\n"))?;
        let raw = &rest[..rest.find(IM_END)?];
        let is_literal = !raw.contains("{{") && !raw.contains("{%") && !has_unescaped_quote(raw);
        is_literal.then(|| unescape_jinja(raw))
    })
}

/// A bare quote would close the Jinja string literal: the text is then an expression.
fn has_unescaped_quote(raw: &str) -> bool {
    let mut escaped = false;
    for c in raw.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' | '"' => return true,
            _ => {}
        }
    }
    false
}

fn unescape_jinja(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

fn parse_merges(merges: &[String]) -> Result<Merges, TokenizerError> {
    merges
        .iter()
        .enumerate()
        .map(|(index, merge)| {
            // Byte-level tokens never contain a space (it is written 'Ġ'), so one space separates.
            match merge.split_once(' ') {
                Some((left, right)) if !left.is_empty() && !right.is_empty() && !right.contains(' ') => {
                    Ok((left.to_string(), right.to_string()))
                }
                _ => Err(TokenizerError::MalformedMerge {
                    index,
                    merge: merge.clone(),
                }),
            }
        })
        .collect()
}

/// GPT-2's byte-level alphabet inverted: printable chars stand for themselves, the other bytes
/// were shifted to U+0100.. so every byte is a visible character.
fn byte_level_decoder_table() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0u32;
    let mut table = HashMap::with_capacity(256);
    for byte in 0..=255u8 {
        let c = if printable(byte) {
            char::from(byte)
        } else {
            shifted += 1;
            // 256 + n < 512 is always a valid scalar value.
            char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        table.insert(c, byte);
    }
    table
}

/// The bytes a byte-level token string encodes. A character outside the alphabet (a malformed
/// vocabulary) is kept as its own UTF-8 instead of failing the whole tokenizer.
fn byte_level_bytes(table: &HashMap<char, u8>, token: &str) -> Box<[u8]> {
    let mut bytes = Vec::with_capacity(token.len());
    for c in token.chars() {
        match table.get(&c) {
            Some(&b) => bytes.push(b),
            None => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    bytes.into_boxed_slice()
}

fn end_of_generation_ids(tokens: &[String], eos_id: Option<u32>) -> Vec<u32> {
    let mut ids: Vec<u32> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| EOG_NAMES.contains(&t.as_str()) || FIM_EOG_NAMES.contains(&t.as_str()))
        .map(|(id, _)| id as u32)
        .chain(eos_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}


impl crate::tokenizer::TokenizerSpec {
    /// Reads the `tokenizer.*` keys. Required: `tokenizer.ggml.model`, `.tokens`, `.merges`
    /// (for gpt2). Optional: `.pre` (llama.cpp's "default" when absent), `.token_type` (all
    /// normal), `.bos_token_id`, `.eos_token_id`, `.add_bos_token` (false), `tokenizer.chat_template`.
    pub fn from_gguf(
        gguf: &crate::gguf::Gguf<'_>,
    ) -> Result<crate::tokenizer::TokenizerSpec, crate::tokenizer::TokenizerError> {
        use crate::tokenizer::TokenizerError;
        let meta_err = |key: &str, e: crate::gguf::GgufError| TokenizerError::Metadata {
            key: key.to_string(),
            reason: e.to_string(),
        };
        let required_str = |key: &str| gguf.get_str(key).map(str::to_string).map_err(|e| meta_err(key, e));
        let optional_str = |key: &str| match gguf.get(key) {
            None => Ok(None),
            Some(_) => gguf.get_str(key).map(|s| Some(s.to_string())).map_err(|e| meta_err(key, e)),
        };
        let optional_u32 = |key: &str| match gguf.get(key) {
            None => Ok(None),
            Some(_) => gguf.get_u32(key).map(Some).map_err(|e| meta_err(key, e)),
        };
        let strings = |key: &str| {
            gguf.get_str_array(key)
                .map(|items| items.into_iter().map(str::to_string).collect::<Vec<String>>())
                .map_err(|e| meta_err(key, e))
        };

        const TYPES: &str = "tokenizer.ggml.token_type";
        Ok(crate::tokenizer::TokenizerSpec {
            model: required_str("tokenizer.ggml.model")?,
            pre: optional_str("tokenizer.ggml.pre")?.unwrap_or_else(|| "default".to_string()),
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types: match gguf.get(TYPES) {
                None => Vec::new(),
                Some(_) => gguf.get_i32_array(TYPES).map_err(|e| meta_err(TYPES, e))?,
            },
            merges: strings("tokenizer.ggml.merges")?,
            bos_id: optional_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: optional_u32("tokenizer.ggml.eos_token_id")?,
            chat_template: optional_str("tokenizer.chat_template")?,
            add_bos: matches!(
                gguf.get("tokenizer.ggml.add_bos_token"),
                Some(crate::gguf::MetaValue::Bool(true))
            ),
        })
    }
}
