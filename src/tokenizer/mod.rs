//! Tokenizers built from a GGUF's `tokenizer.*` metadata, matching llama.cpp's ids: byte-level
//! BPE (`tokenizer.ggml.model = gpt2`: SmolLM2, Qwen2.5/Qwen3, DeepSeek-R1-Distill-Qwen, Llama 3.x,
//! Phi-4-mini; [`bpe`], split as llama.cpp splits for `tokenizer.ggml.pre`) and SentencePiece
//! (`llama`: Gemma 2 and 3, Phi-3.5; [`spm`]), behind one [`Tokenizer`]; streaming-safe decoding
//! ([`StreamDecoder`]); chat prompts by the file's own Jinja chat template ([`ChatTemplate`]).
//!
//! Decoding never goes through a tokenizer library: it concatenates each token's raw bytes,
//! which is what llama.cpp does and what a streaming decoder needs anyway.

mod bpe;
mod chat;
mod spec;
mod special;
mod spm;
mod stream;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use chat::{chatml_default_system, strftime, ChatFormatKind, ChatInput, ChatTemplate, TemplateCaps};
pub use spec::TokenizerSpec;
pub use stream::StreamDecoder;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Token texts llama.cpp treats as end-of-generation (`llama_vocab::impl::load`, EOG list), and
/// whose type it forces to control. They are recognised by name because GGUF files carry no
/// per-token "ends a turn" flag. `</s>` is on llama.cpp's list for PaddleOCR; it also catches
/// Gemma 3's user-defined `</s>` (id 212), which llama.cpp's EOG set for Gemma includes.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad/repo/separator token texts: llama.cpp also ends generation on them
/// (a code model that emits one has left the document). SmolLM2's `<reponame>` (id 4) is one.
const FIM_EOG_NAMES: &[&str] =
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "tokenizer model '{0}' is not supported: pagedlm reads byte-level BPE (tokenizer.ggml.model \
         = \"gpt2\", e.g. SmolLM2) and SentencePiece (\"llama\", e.g. Gemma 3) vocabularies"
    )]
    UnsupportedModel(String),
    #[error(
        "pre-tokenizer '{0}' (tokenizer.ggml.pre) is not supported: pagedlm splits text as llama.cpp \
         does for {known}; other pre-tokenizers split text differently and would give wrong token ids",
        known = bpe::known_pre_tokenizers()
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
    #[error(
        "tokenizer.ggml.scores has {scores} entries but tokenizer.ggml.tokens has {tokens}; a \
         SentencePiece vocabulary needs a score per token"
    )]
    ScoreCount { tokens: usize, scores: usize },
    #[error("merge #{index} '{merge}' is not two tokens separated by one space")]
    MalformedMerge { index: usize, merge: String },
    #[error("{what} token id {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange { what: &'static str, id: u32, vocab_size: usize },
    #[error("building the BPE model failed: {0} (are merges and vocabulary from the same file?)")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error(
        "the text needs byte 0x{0:02X} as a fallback token, but the vocabulary has neither \
         <0x{0:02X}> nor an unknown token"
    )]
    NoByteToken(u8),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(
        "this model's vocabulary has no '{0}' token, so pagedlm cannot render its chat format; \
         pass a raw prompt instead"
    )]
    NoChatTokens(&'static str),
    #[error(
        "this is a base model without a chat template (the file has no tokenizer.chat_template): \
         it cannot chat; use completion mode with a text prompt instead"
    )]
    NoChatTemplate,
    /// The chat template does not parse, refused the conversation (`raise_exception`, e.g. roles
    /// that do not alternate) or failed while rendering it: the template's own message.
    #[error("{0}")]
    Template(String),
    #[error("GGUF tokenizer metadata '{key}': {reason}")]
    Metadata { key: String, reason: String },
}

/// One chat turn. `role` is free text ("system", "user", "assistant", ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// The model that turns text into ids.
enum Model {
    Bpe(Box<tokenizers::Tokenizer>),
    Spm(Box<spm::SpmModel>),
}

/// A ready tokenizer: encode text to ids, decode ids to text, render chat prompts.
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    token_types: Vec<i32>,
    /// Raw bytes each token stands for: [vocab_size]. Shared with every [`StreamDecoder`].
    token_bytes: Arc<Vec<Box<[u8]>>>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eog_ids: Vec<u32>,
    add_bos: bool,
    chat: Chat,
}

/// How chat messages become a prompt string.
struct Chat {
    kind: ChatFormatKind,
    /// The compiled template; its parse error when it does not compile (a chat then fails with
    /// it, while completion mode works); `None` without a template.
    template: Option<Result<ChatTemplate, String>>,
    /// The literal system prompt of a ChatML template, which tools offered to it follow.
    default_system: Option<String>,
}

/// Checks what every model needs: tokens addressable by u32, a type for every token (all
/// normal when the file has none), special ids inside the vocabulary. Returns the token types,
/// with llama.cpp's end-of-generation names forced to control as llama.cpp does.
fn check_spec(spec: &TokenizerSpec) -> Result<Vec<i32>, TokenizerError> {
    let vocab_size = spec.tokens.len();
    if vocab_size == 0 {
        return Err(TokenizerError::EmptyVocab);
    }
    if u32::try_from(vocab_size).is_err() {
        return Err(TokenizerError::VocabTooLarge(vocab_size));
    }
    let mut token_types = if spec.token_types.is_empty() {
        vec![token_type::NORMAL; vocab_size]
    } else if spec.token_types.len() != vocab_size {
        return Err(TokenizerError::TokenTypeCount { tokens: vocab_size, types: spec.token_types.len() });
    } else {
        spec.token_types.clone()
    };
    let specials = [("BOS", spec.bos_id), ("EOS", spec.eos_id), ("UNK", spec.unk_id), ("EOT", spec.eot_id), ("EOM", spec.eom_id)];
    for (what, id) in specials {
        if let Some(id) = id {
            if id as usize >= vocab_size {
                return Err(TokenizerError::SpecialIdOutOfRange { what, id, vocab_size });
            }
        }
    }
    for (token, kind) in spec.tokens.iter().zip(token_types.iter_mut()) {
        if EOG_NAMES.contains(&token.as_str()) || FIM_EOG_NAMES.contains(&token.as_str()) {
            *kind = token_type::CONTROL;
        }
    }
    Ok(token_types)
}

impl Tokenizer {
    /// Builds the tokenizer. Fails with a typed error on an unsupported model / pre-tokenizer
    /// or inconsistent metadata; never panics on bad input.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer, TokenizerError> {
        let (model, token_types, token_bytes) = match spec.model.as_str() {
            "gpt2" => {
                let pre = bpe::pre_tokenizer(&spec.pre)?;
                let token_types = check_spec(&spec)?;
                let inner = bpe::bpe_tokenizer(&spec, &token_types, pre)?;
                let bytes = bpe::token_bytes(&spec.tokens, &token_types);
                (Model::Bpe(Box::new(inner)), token_types, bytes)
            }
            "llama" => {
                let token_types = check_spec(&spec)?;
                let spm = spm::SpmModel::new(&spec, &token_types)?;
                let bytes = spm::token_bytes(&spec.tokens, &token_types);
                (Model::Spm(Box::new(spm)), token_types, bytes)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let mut tokenizer = Tokenizer {
            model,
            tokens: spec.tokens,
            token_types,
            token_bytes: Arc::new(token_bytes),
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            eog_ids: Vec::new(),
            add_bos: spec.add_bos,
            chat: Chat { kind: ChatFormatKind::None, template: None, default_system: None },
        };
        let kind = ChatFormatKind::detect(spec.chat_template.as_deref());
        let token_text = |id: Option<u32>| id.and_then(|id| tokenizer.id_to_token(id)).unwrap_or_default().to_string();
        let (bos, eos) = (token_text(spec.bos_id), token_text(spec.eos_id));
        tokenizer.chat = Chat {
            kind,
            template: spec.chat_template.as_deref().map(|source| ChatTemplate::new(source, &bos, &eos).map_err(|e| e.to_string())),
            default_system: match kind {
                ChatFormatKind::ChatMl => spec.chat_template.as_deref().and_then(chatml_default_system),
                _ => None,
            },
        };
        let end_of_turn = kind.end_of_turn().and_then(|t| tokenizer.token_to_id(t));
        tokenizer.eog_ids = tokenizer.end_of_generation_ids([spec.eos_id, spec.eot_id, spec.eom_id, end_of_turn]);
        Ok(tokenizer)
    }

    /// Text to token ids, like llama.cpp's `tokenize(text, add_special=false, parse_special=true)`:
    /// special tokens written in the text (`<|im_start|>`) become their ids; no BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match &self.model {
            Model::Bpe(inner) => {
                let encoding = inner.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
                Ok(encoding.get_ids().to_vec())
            }
            Model::Spm(spm) => spm.encode(text),
        }
    }

    /// A prompt to generate from: [`Self::encode`], preceded by BOS when the file asks for it
    /// ([`Self::add_bos`]), like llama.cpp's `tokenize(text, add_special=true, parse_special=true)`.
    /// BOS is never doubled: text that already starts with the BOS token keeps just that one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = self.encode(text)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
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

    /// The raw bytes one token stands for (may be part of a UTF-8 character: a byte-fallback
    /// token `<0xE4>` is the one byte 0xE4).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(|b| &b[..])
    }

    /// A decoder for generated tokens that only ever emits whole characters.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder { token_bytes: Arc::clone(&self.token_bytes), pending: Vec::new() }
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.model {
            Model::Bpe(inner) => inner.token_to_id(token),
            Model::Spm(spm) => spm.token_to_id(token),
        }
    }

    /// The vocabulary entry as stored in the file (byte-level form "Ġthe" for BPE, "▁the" for
    /// SentencePiece).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether prompts for this model start with [`Self::bos_id`]: `tokenizer.ggml.add_bos_token`
    /// (SmolLM2: no; Gemma 3: yes). [`Self::encode_prompt`] applies it.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Ids that end generation, sorted: EOS, EOT and EOM from the file, the chat format's
    /// end-of-turn token, and the tokens llama.cpp marks end-of-generation by name
    /// (`<|im_end|>`, `<end_of_turn>`, `</s>`, ... and the FIM pad/repo/separator tokens).
    /// SmolLM2: `<|endoftext|>` 0, `<|im_end|>` 2, `<reponame>` 4; Gemma 3: 1, 106, 212.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eog_ids.clone()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eog_ids.binary_search(&id).is_ok()
    }

    /// Control (and unknown) tokens: markup a chat UI hides. User-defined tokens are not
    /// special here: they are matched whole when encoding but are ordinary text.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.token_types.get(id as usize), Some(&token_type::CONTROL) | Some(&token_type::UNKNOWN))
    }

    /// The chat format read from `tokenizer.chat_template`: [`ChatFormatKind::None`] for a base
    /// model, which only completes text.
    pub fn chat_format(&self) -> ChatFormatKind {
        self.chat.kind
    }

    /// The system prompt inserted when a conversation has none (from the GGUF chat template).
    pub fn default_system_prompt(&self) -> Option<&str> {
        self.chat.default_system.as_deref()
    }

    /// The compiled chat template (`None` for a base model, or when it does not compile).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.template.as_ref().and_then(|t| t.as_ref().ok())
    }

    /// Renders plain `{role, content}` turns with the model's chat template, followed by the
    /// assistant's turn header when `add_generation_prompt` ([`Self::render_chat`]).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        self.render_chat(&ChatInput::conversation(messages.iter().map(|m| (m.role.as_str(), m.content.as_str())), add_generation_prompt))
    }

    /// Renders a conversation with the GGUF's own Jinja template, as transformers does
    /// ([`ChatTemplate`]). Encode the result with [`Self::encode_prompt`]: the template writes
    /// `bos_token` as text where it wants it, which becomes the BOS id, never doubled.
    ///
    /// A file with no template is a base model: [`TokenizerError::NoChatTemplate`]. A ChatML or
    /// Gemma template whose markers the vocabulary lacks is [`TokenizerError::NoChatTokens`];
    /// a template that does not parse, raises or fails is [`TokenizerError::Template`].
    /// Message contents are not escaped: special-token text inside them is encoded as special
    /// tokens, as in llama.cpp.
    pub fn render_chat(&self, input: &ChatInput) -> Result<String, TokenizerError> {
        let template = match &self.chat.template {
            None => return Err(TokenizerError::NoChatTemplate),
            Some(Err(e)) => return Err(TokenizerError::Template(e.clone())),
            Some(Ok(t)) => t,
        };
        if let Some(&missing) = self.chat.kind.markers().iter().find(|m| self.token_to_id(m).is_none()) {
            return Err(TokenizerError::NoChatTokens(missing));
        }
        template.render(input)
    }

    fn end_of_generation_ids(&self, from_file: [Option<u32>; 4]) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| EOG_NAMES.contains(&t.as_str()) || FIM_EOG_NAMES.contains(&t.as_str()))
            .map(|(id, _)| id as u32)
            .chain(from_file.into_iter().flatten())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn unknown_id(&self, id: u32) -> TokenizerError {
        TokenizerError::UnknownId { id, vocab_size: self.tokens.len() }
    }
}
