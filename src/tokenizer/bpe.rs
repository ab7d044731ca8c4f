//! Byte-level BPE (GPT-2 style vocabularies, `tokenizer.ggml.model = gpt2`: SmolLM2, Qwen2.5,
//! Qwen3, DeepSeek-R1-Distill-Qwen, Llama 3.x, Phi-4-mini), matching llama.cpp's ids: the text is
//! cut into words as llama.cpp cuts it for the file's `tokenizer.ggml.pre` ([`PRE_TOKENIZERS`]),
//! then merged. Encoding goes through the `tokenizers` crate (built in code, no
//! `tokenizer.json`), so it runs natively and in the browser.

use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{token_type, TokenizerError, TokenizerSpec};

/// How llama.cpp splits text into words before the BPE merges, for one family of
/// `tokenizer.ggml.pre` names (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*` and the flags its loader
/// sets for them).
pub(super) struct PreTokenizer {
    /// The `tokenizer.ggml.pre` values llama.cpp maps to this split.
    pub(super) names: &'static [&'static str],
    /// Applied in turn, each to the pieces the previous one left: every match and every stretch
    /// between two matches becomes a piece (llama.cpp's `regex_exprs`, verbatim; llama.cpp
    /// spells `(?i:'s|...)` out as `'[sS]|...` because std::regex lacks inline flags).
    pub(super) regexes: &'static [&'static str],
    /// A piece that is itself a vocabulary token is taken whole, without merging (Llama 3's
    /// `ignore_merges`: some of its tokens cannot be reached through the merges).
    pub(super) ignore_merges: bool,
    /// Whether prompts start with BOS when the file has no `tokenizer.ggml.add_bos_token`.
    pub(super) add_bos: bool,
}

/// GPT-2's split: contractions, letters, digits, other symbols, each with one leading space.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split (tiktoken cl100k): contractions in any case, a letter run with at most one
/// leading non-letter, digits in runs of at most three, newlines kept with the punctuation or
/// whitespace before them.
const LLAMA3: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with every digit on its own.
const QWEN2: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's split (tiktoken o200k) as llama.cpp runs it: a word is an optional non-letter,
/// letters other than a-z, then letters other than A-Z (or the reverse), with a contraction
/// attached; digits in runs of at most three; `/` kept with the newlines after punctuation.
/// llama.cpp's "letters other than a-z" stands in for o200k's upper/lower-case classes, so
/// combining marks are not part of a word here, as in llama.cpp.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Every pre-tokenizer pagedlm knows; one row per split, as llama.cpp's `llama-vocab.cpp`
/// defines them. The families: SmolLM2 (`smollm`), Qwen2.5/Qwen3 (`qwen2`),
/// DeepSeek-R1-Distill-Qwen (`deepseek-r1-qwen`), Llama 3.x (`llama-bpe`), Phi-4-mini
/// (`gpt-4o`).
pub(super) const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer { names: &["gpt-2", "phi-2"], regexes: &[GPT2], ignore_merges: false, add_bos: false },
    PreTokenizer { names: &["smollm", "starcoder", "refact"], regexes: &[r"\p{N}", GPT2], ignore_merges: false, add_bos: false },
    PreTokenizer { names: &["llama-bpe", "llama3", "llama-v3"], regexes: &[LLAMA3], ignore_merges: true, add_bos: true },
    PreTokenizer { names: &["smaug-bpe", "dbrx"], regexes: &[LLAMA3], ignore_merges: false, add_bos: false },
    PreTokenizer { names: &["qwen2", "deepseek-r1-qwen", "stablelm2"], regexes: &[QWEN2], ignore_merges: false, add_bos: false },
    PreTokenizer { names: &["gpt-4o", "llama4"], regexes: &[GPT4O], ignore_merges: false, add_bos: false },
];

/// The pre-tokenizer a `tokenizer.ggml.pre` value names.
pub(super) fn pre_tokenizer(pre: &str) -> Result<&'static PreTokenizer, TokenizerError> {
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&pre)).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre.to_string()))
}

/// The known `tokenizer.ggml.pre` values, for error messages: "gpt-2", "phi-2", ...
pub(super) fn known_pre_tokenizers() -> String {
    PRE_TOKENIZERS.iter().flat_map(|p| p.names).map(|name| format!("\"{name}\"")).collect::<Vec<_>>().join(", ")
}

/// The `tokenizers` BPE model over the spec's vocabulary and merges, with the pre-tokenizer's
/// splits, the byte-level alphabet, its decoder and the added tokens.
pub(super) fn bpe_tokenizer(spec: &TokenizerSpec, token_types: &[i32], pre: &PreTokenizer) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = parse_merges(&spec.merges)?;
    // Keep the first id of a duplicated token string: the BPE model needs a map, and the
    // duplicate is unreachable by encoding anyway (llama.cpp resolves it the same way).
    let mut vocab = Vocab::default();
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(pre.ignore_merges).build().map_err(|e| TokenizerError::Build(e.to_string()))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    // The regexes cut the text; the byte-level step then only maps bytes to its alphabet.
    let byte_level = ByteLevel::new(false, true, false);
    let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in pre.regexes {
        let split = Split::new(SplitPattern::Regex((*regex).to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {regex:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    steps.push(PreTokenizerWrapper::ByteLevel(byte_level));
    inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
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
    inner.add_special_tokens(added).map_err(|e| TokenizerError::Build(e.to_string()))?;
    Ok(inner)
}

/// The raw bytes of every token: byte-level strings decoded; added tokens as their literal text.
pub(super) fn token_bytes(tokens: &[String], token_types: &[i32]) -> Vec<Box<[u8]>> {
    let byte_table = byte_level_decoder_table();
    tokens
        .iter()
        .zip(token_types)
        .map(|(token, &kind)| match kind {
            token_type::NORMAL | token_type::UNUSED | token_type::BYTE => byte_level_bytes(&byte_table, token),
            // Added tokens are stored as their literal text, not in the byte-level alphabet.
            _ => token.as_bytes().into(),
        })
        .collect()
}

fn parse_merges(merges: &[String]) -> Result<Merges, TokenizerError> {
    merges
        .iter()
        .enumerate()
        .map(|(index, merge)| {
            // Byte-level tokens never contain a space (it is written 'Ġ'), so one space separates.
            match merge.split_once(' ') {
                Some((left, right)) if !left.is_empty() && !right.is_empty() && !right.contains(' ') => Ok((left.to_string(), right.to_string())),
                _ => Err(TokenizerError::MalformedMerge { index, merge: merge.clone() }),
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
