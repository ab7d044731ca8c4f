//! Constrained decoding: JSON Schema, JSON objects, Lark grammars and regular expressions, as
//! a bitmask of the tokens each step may produce (`llguidance`, the constraint engine llama.cpp
//! and vLLM use).
//!
//! [`Grammars`] is built once per model from its tokenizer (the token trie over every token's
//! bytes; control and unused tokens enter as `\xff<name>`, llguidance's special-token form, so
//! no text lexeme ever allows them). [`Grammars::start`] checks a [`Constraint`] and returns a
//! [`Constrained`] matcher with the mask of the first token; after each generated token
//! [`Constrained::advance`] computes the next. A mask is `ceil(vocab / 32)` little-endian u32
//! words over the model's vocabulary (bit `t % 32` of word `t / 32`: token `t` is allowed); the
//! GPU sampler reads it as is (its `RowParams::MASKED` rows). End-of-generation tokens are allowed
//! exactly when the constraint is complete.
//!
//! JSON output defaults to one layout: `", "` between items, `": "` after keys and no other
//! whitespace (a schema's own `x-guidance` options win), so a small model cannot wander into
//! endless blank space inside an object.

use std::sync::Arc;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// What a generation's output must match.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {type: "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
    /// A reasoning block, then `body`: a reasoning model's reply thinks freely first and the
    /// constraint applies after the block ends. `open` is the marker the reply starts with
    /// (`<think>`; the block is then optional), or `None` when the prompt opened the block
    /// already; `close` ends it. Blanks may follow the close.
    AfterReasoning { open: Option<Marker>, close: Marker, body: Box<Constraint> },
}

/// A marker a grammar writes (`<think>`, `<|tool_call|>`): a special token of the vocabulary
/// (matched by id: no text spells it) or plain text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    pub text: String,
    /// Its id when the vocabulary holds it as one control token.
    pub special: Option<u32>,
}

impl Marker {
    pub fn text(text: &str) -> Marker {
        Marker { text: text.to_string(), special: None }
    }

    /// The marker in a Lark grammar: `<[id]>` for a special token, else a quoted string.
    pub fn lark(&self) -> String {
        match self.special {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(&self.text),
        }
    }
}

/// `text` as a Lark string literal.
pub fn lark_string(text: &str) -> String {
    // A JSON string is a valid Lark string (the same escapes).
    serde_json::Value::from(text).to_string()
}

impl Constraint {
    /// OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
    /// or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (a missing
    /// schema allows any JSON object). Anything else is [`ConstraintError::Invalid`].
    pub fn from_response_format(format: &serde_json::Value) -> Result<Option<Constraint>, ConstraintError> {
        let invalid = |why: &str| ConstraintError::Invalid(format!("response_format {why}"));
        let kind =
            format.get("type").and_then(serde_json::Value::as_str).ok_or_else(|| invalid("needs a \"type\": \"text\", \"json_object\" or \"json_schema\""))?;
        match kind {
            "text" => Ok(None),
            "json_object" => Ok(Some(Constraint::JsonObject)),
            "json_schema" => {
                let spec = format
                    .get("json_schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| invalid("of type json_schema needs a \"json_schema\": {name, schema, strict} object"))?;
                Ok(Some(match spec.get("schema") {
                    None | Some(serde_json::Value::Null) => Constraint::JsonObject,
                    Some(schema) => Constraint::JsonSchema(schema.clone()),
                }))
            }
            other => Err(invalid(&format!("type {other:?} is not one of \"text\", \"json_object\", \"json_schema\""))),
        }
    }
}

/// A constraint that cannot be used, or a matcher that failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConstraintError {
    /// The schema, grammar or expression is refused (llguidance's message).
    #[error("invalid constraint: {0}")]
    Invalid(String),
    /// The token trie could not be built from the vocabulary.
    #[error("the vocabulary cannot be constrained: {0}")]
    Vocabulary(String),
    /// The matcher refused a token or stopped with an error mid-generation.
    #[error("constrained decoding failed: {0}")]
    Failed(String),
}

/// The token trie of one model's vocabulary, for llguidance.
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Greedy over the trie (not the model's own tokenizer): llguidance only needs this to
    /// force tokens, which pagedlm does not ask of it (see [`VocabEnv::tokenize_is_canonical`]).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The constraint engine of one model: its token trie and parser factory, built once.
pub struct Grammars {
    factory: ParserFactory,
    /// The model's vocabulary (logit row width), which masks cover.
    vocab: u32,
    eos: Vec<u32>,
}

impl Grammars {
    /// Builds the trie over `tokenizer`'s vocabulary for a model of `vocab` logits (at least the
    /// tokenizer's; tokens past the tokenizer's are never allowed).
    pub fn new(tokenizer: &Tokenizer, vocab: u32) -> Result<Grammars, ConstraintError> {
        let n = tokenizer.vocab_size();
        if n as u64 > vocab as u64 {
            return Err(ConstraintError::Vocabulary(format!("the tokenizer has {n} tokens and the model {vocab} logits")));
        }
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| match tokenizer.token_bytes(id) {
                Some(bytes) if !bytes.is_empty() && !tokenizer.is_special(id) => bytes.to_vec(),
                _ => {
                    let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    special.extend(tokenizer.id_to_token(id).unwrap_or_default().as_bytes());
                    special
                }
            })
            .collect();
        let eos = tokenizer.eos_ids();
        let first_eos = eos.first().copied().or(tokenizer.eos_id()).unwrap_or(0);
        let trie = TokTrie::from(&TokRxInfo::new(n as u32, first_eos), &words).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(VocabEnv { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory, vocab, eos })
    }

    /// u32 words of one mask.
    pub fn mask_words(&self) -> usize {
        self.vocab.div_ceil(32) as usize
    }

    /// Checks `constraint` and starts a matcher on it, with the mask of the first token
    /// computed. An invalid schema or grammar is [`ConstraintError::Invalid`] with llguidance's
    /// message.
    pub fn start(&self, constraint: &Constraint) -> Result<Constrained, ConstraintError> {
        let grammar = match constraint {
            Constraint::AfterReasoning { open, close, body } => {
                // The body is a grammar of its own, which the reasoning grammar refers to.
                let mut body = single_grammar(body)?;
                body.name = Some("body".into());
                let mut top = TopLevelGrammar::from_lark(reasoning_lark(open.as_ref(), close));
                top.grammars.push(body);
                top
            }
            single => TopLevelGrammar::from_grammar(single_grammar(single)?),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Invalid(e));
        }
        let mut c = Constrained { matcher, mask: vec![0; self.mask_words()], only_eos: false, eos: self.eos.clone() };
        c.refresh()?;
        Ok(c)
    }
}

/// One grammar of llguidance's: the constraint's JSON Schema, Lark grammar or expression.
fn single_grammar(constraint: &Constraint) -> Result<GrammarWithLexer, ConstraintError> {
    Ok(match constraint {
        Constraint::JsonObject => GrammarWithLexer::from_json_schema(json_layout(serde_json::json!({"type": "object"}))),
        Constraint::JsonSchema(schema) => {
            if !schema.is_object() && !schema.is_boolean() {
                return Err(ConstraintError::Invalid("a JSON Schema is an object (or true / false)".into()));
            }
            GrammarWithLexer::from_json_schema(json_layout(schema.clone()))
        }
        Constraint::Lark(text) => GrammarWithLexer::from_lark(text.clone()),
        Constraint::Regex(rx) => GrammarWithLexer::from_regex(rx),
        Constraint::AfterReasoning { .. } => return Err(ConstraintError::Invalid("a reasoning block inside a reasoning block".into())),
    })
}

/// The reasoning block and then the grammar named `body`. Text up to a close written as text
/// is a lazy lexeme (it ends at the first close); before a special-token close it is any text,
/// which can never spell the token.
fn reasoning_lark(open: Option<&Marker>, close: &Marker) -> String {
    let block = match close.special {
        None => format!("think[lazy]: /(?s:.*)/ {}\n", close.lark()),
        Some(_) => format!("think: /(?s:.*)/ {}\n", close.lark()),
    };
    let start = match open {
        None => "start: think BLANKS @body\n".to_string(),
        Some(open) => format!("start: {} think BLANKS @body | @body\n", open.lark()),
    };
    format!("{start}{block}BLANKS: /[ \\t\\n]*/\n")
}

/// `schema` with pagedlm's default JSON layout unless it sets its own (`x-guidance`).
pub(crate) fn json_layout(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// One generation's matcher and the mask of its next token.
pub struct Constrained {
    matcher: Matcher,
    mask: Vec<u32>,
    /// Only end-of-generation tokens are allowed: the output is complete.
    only_eos: bool,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrained").field("only_eos", &self.only_eos).finish_non_exhaustive()
    }
}

impl Constrained {
    /// The tokens allowed next: `ceil(vocab / 32)` words (see the module docs).
    pub fn mask(&self) -> &[u32] {
        &self.mask
    }

    /// Whether token `t` is allowed next.
    pub fn allows(&self, t: u32) -> bool {
        self.mask.get(t as usize / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
    }

    /// Whether the output is complete: nothing but an end-of-generation token may follow (the
    /// generation can end here without spending a step on it).
    pub fn is_complete(&self) -> bool {
        self.only_eos
    }

    /// Whether the output so far could end here (an end-of-generation token is allowed).
    pub fn is_accepting(&self) -> bool {
        self.eos.iter().any(|&t| self.allows(t))
    }

    /// Takes the generated token `t` and computes the next mask. A token the mask did not allow
    /// is [`ConstraintError::Failed`].
    pub fn advance(&mut self, t: u32) -> Result<(), ConstraintError> {
        if !self.allows(t) {
            return Err(ConstraintError::Failed(format!("token {t} was generated against the constraint's mask")));
        }
        self.matcher.consume_token(t).map_err(|e| ConstraintError::Failed(e.to_string()))?;
        self.refresh()
    }

    /// The masks of the rows after a draft's tokens: mask i is the one after `draft[..=i]`, for
    /// the longest prefix of `draft` the constraint allows (a forbidden token ends the draft
    /// before it; a token that completes the output ends it after itself). The matcher is
    /// rolled back after, so its state and mask are as before.
    pub fn draft_masks(&mut self, draft: &[u32]) -> Vec<Vec<u32>> {
        let (mask, only_eos) = (self.mask.clone(), self.only_eos);
        let mut masks = Vec::new();
        let mut consumed = 0;
        for &t in draft {
            if self.only_eos || !self.allows(t) || self.matcher.consume_token(t).is_err() {
                break;
            }
            consumed += 1;
            if self.refresh().is_err() {
                break;
            }
            masks.push(self.mask.clone());
        }
        if consumed > 0 {
            // A rollback of tokens it consumed cannot fail but for a broken matcher, whose next
            // `advance` then fails the request with the reason.
            let _ = self.matcher.rollback(consumed);
        }
        self.mask = mask;
        self.only_eos = only_eos;
        masks
    }

    /// Recomputes the mask from the matcher's state.
    fn refresh(&mut self) -> Result<(), ConstraintError> {
        let set = self.matcher.compute_mask_or_eos().map_err(|e| ConstraintError::Failed(e.to_string()))?;
        let words = set.as_slice();
        self.mask.fill(0);
        let n = words.len().min(self.mask.len());
        self.mask[..n].copy_from_slice(&words[..n]);
        // The set may carry a bit past the trie's vocabulary in its last word: clear it.
        let limit = (set.len() as u32).min(self.mask.len() as u32 * 32);
        for t in limit..(n as u32 * 32) {
            self.mask[t as usize / 32] &= !(1 << (t % 32));
        }
        let allowed = self.mask.iter().map(|w| w.count_ones()).sum::<u32>();
        let eos_allowed = self.eos.iter().filter(|&&t| self.allows(t)).count() as u32;
        if allowed == 0 {
            let why = self.matcher.get_error().unwrap_or_else(|| "no token is allowed".into());
            return Err(ConstraintError::Failed(why));
        }
        self.only_eos = allowed == eos_allowed;
        Ok(())
    }
}
