//! SentencePiece vocabularies (`tokenizer.ggml.model = llama`: Gemma, Llama 2), matching
//! llama.cpp's `llm_tokenizer_spm`: spaces become '▁' (U+2581), the text is cut into UTF-8
//! characters, and the adjacent pair whose concatenation is a vocabulary token with the highest
//! score is merged (ties: the leftmost) until no pair is a token; a character still not in the
//! vocabulary becomes its bytes' `<0xNN>` tokens.
//!
//! The merge loop is a heap of candidate pairs, so a merge costs O(log n), not a rescan.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::special::{Piece, SpecialSplitter};
use super::{token_type, TokenizerError, TokenizerSpec};

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';

pub(super) struct SpmModel {
    /// Token text -> id; a duplicated text keeps its last id, as llama.cpp's `token_to_id` does.
    ids: HashMap<String, u32>,
    /// `[vocab_size]` merge priority: higher merges first.
    scores: Vec<f32>,
    /// The token of each byte for fallback: `<0xNN>`, else the one-byte text itself, else UNK.
    byte_ids: [Option<u32>; 256],
    add_space_prefix: bool,
    specials: SpecialSplitter,
}

/// A candidate merge of the symbols at `left` and `right`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text: a stale candidate (a side merged since) no longer fits.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The max-heap's top is the highest score, and among equal scores the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// One symbol of the text being merged: `text[start..start + len]`, in a linked list.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmModel {
    pub(super) fn new(spec: &TokenizerSpec, token_types: &[i32]) -> Result<SpmModel, TokenizerError> {
        let vocab_size = spec.tokens.len();
        if spec.scores.len() != vocab_size {
            return Err(TokenizerError::ScoreCount { tokens: vocab_size, scores: spec.scores.len() });
        }
        let mut ids = HashMap::with_capacity(vocab_size);
        for (id, token) in spec.tokens.iter().enumerate() {
            // llama.cpp names an empty token "[EMPTY_<id>]"; it must not match empty text.
            let key = if token.is_empty() { format!("[EMPTY_{id}]") } else { token.clone() };
            ids.insert(key, id as u32);
        }
        let unk_id = spec.unk_id.or_else(|| token_types.iter().position(|&t| t == token_type::UNKNOWN).map(|i| i as u32));
        let mut byte_ids = [None; 256];
        for (byte, slot) in byte_ids.iter_mut().enumerate() {
            let hex = ids.get(&format!("<0x{byte:02X}>")).copied();
            // A byte of 0x80 or more is no text on its own, so it can only be `<0xNN>`.
            let single = u8::try_from(byte).ok().filter(u8::is_ascii).and_then(|b| ids.get(&char::from(b).to_string()).copied());
            *slot = hex.or(single).or(unk_id);
        }
        Ok(SpmModel {
            ids,
            scores: spec.scores.clone(),
            byte_ids,
            add_space_prefix: spec.add_space_prefix,
            specials: SpecialSplitter::new(&spec.tokens, token_types)?,
        })
    }

    pub(super) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// Text to ids, special tokens parsed, no BOS: llama.cpp's
    /// `tokenize(text, add_special=false, parse_special=true)`.
    pub(super) fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        // The space prefix goes before raw text that starts the input or follows a special token.
        let mut after_special = true;
        for piece in self.specials.split(text) {
            match piece {
                Piece::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Piece::Text(raw) => {
                    let prefix = if self.add_space_prefix && after_special { " " } else { "" };
                    let escaped: String = prefix.chars().chain(raw.chars()).map(|c| if c == ' ' { SPACE } else { c }).collect();
                    self.merge(&escaped, &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    /// The merge loop over one escaped raw piece; appends its ids to `out`.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (index, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol { start, len: c.len_utf8(), prev: index.checked_sub(1), next: Some(index + 1) });
        }
        let Some(last) = symbols.last_mut() else {
            return Ok(());
        };
        last.next = None;

        let mut heap = BinaryHeap::with_capacity(symbols.len());
        let candidate = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| -> Option<Bigram> {
            let (left, right) = (left?, right?);
            let start = symbols[left].start;
            let len = symbols[left].len + symbols[right].len;
            let id = *self.ids.get(&text[start..start + len])?;
            Some(Bigram { score: *self.scores.get(id as usize)?, left, right, len })
        };
        for right in 1..symbols.len() {
            heap.extend(candidate(&symbols, Some(right - 1), Some(right)));
        }
        while let Some(pair) = heap.pop() {
            let (left, right) = (symbols[pair.left], symbols[pair.right]);
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            symbols[pair.left].len = pair.len;
            symbols[pair.right].len = 0;
            symbols[pair.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(pair.left);
            }
            heap.extend(candidate(&symbols, left.prev, Some(pair.left)));
            heap.extend(candidate(&symbols, Some(pair.left), right.next));
        }

        let mut at = Some(0);
        while let Some(index) = at {
            let symbol = symbols[index];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            // Merged symbols are always tokens; only a lone character can be missing.
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.byte_ids[byte as usize].ok_or(TokenizerError::NoByteToken(byte))?);
                    }
                }
            }
            at = symbol.next;
        }
        Ok(())
    }
}

/// The bytes each token stands for, as llama.cpp's `token_to_piece` renders them: normal tokens
/// with '▁' as a space, `<0xNN>` byte tokens as that byte, user-defined, control and unknown
/// tokens as their literal text, unused tokens as nothing.
pub(super) fn token_bytes(tokens: &[String], token_types: &[i32]) -> Vec<Box<[u8]>> {
    tokens
        .iter()
        .zip(token_types)
        .map(|(token, &kind)| match kind {
            token_type::NORMAL => token.replace(SPACE, " ").into_bytes().into_boxed_slice(),
            token_type::BYTE => match parse_byte_token(token) {
                Some(byte) => Box::from([byte].as_slice()),
                None => token.as_bytes().into(),
            },
            token_type::UNUSED => Box::default(),
            _ => token.as_bytes().into(),
        })
        .collect()
}

/// `<0xNN>` -> the byte 0xNN.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}
