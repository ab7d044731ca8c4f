//! Byte-level BPE (GPT-2 style vocabularies, SmolLM2: `tokenizer.ggml.model = gpt2`,
//! `tokenizer.ggml.pre = smollm`), matching llama.cpp's ids. Encoding goes through the
//! `tokenizers` crate (built in code, no `tokenizer.json`), so it runs natively and in the
//! browser.

use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

use super::{token_type, TokenizerError, TokenizerSpec};

/// Whether the pre-tokenizer splits digits one by one; an error for one pagedlm does not know.
pub(super) fn split_digits(pre: &str) -> Result<bool, TokenizerError> {
    // llama.cpp gives "smollm", "starcoder" and "refact" the same regex: every digit on its
    // own, then the GPT-2 split. HF's Digits(individual) + ByteLevel(use_regex) is the same.
    match pre {
        "smollm" | "starcoder" | "refact" => Ok(true),
        "gpt-2" => Ok(false),
        _ => Err(TokenizerError::UnsupportedPreTokenizer(pre.to_string())),
    }
}

/// The `tokenizers` BPE model over the spec's vocabulary and merges, with the byte-level
/// pre-tokenizer (digits split first when `split_digits`), decoder and added tokens.
pub(super) fn bpe_tokenizer(spec: &TokenizerSpec, token_types: &[i32], split_digits: bool) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = parse_merges(&spec.merges)?;
    // Keep the first id of a duplicated token string: the BPE model needs a map, and the
    // duplicate is unreachable by encoding anyway (llama.cpp resolves it the same way).
    let mut vocab = Vocab::default();
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| TokenizerError::Build(e.to_string()))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(false, true, true);
    let pre = if split_digits {
        PreTokenizerWrapper::Sequence(Sequence::new(vec![PreTokenizerWrapper::Digits(Digits::new(true)), PreTokenizerWrapper::ByteLevel(byte_level)]))
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
