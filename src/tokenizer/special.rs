//! Splitting text on special tokens before the tokenizer model sees it, like llama.cpp's
//! `tokenizer_st_partition`: control and unknown tokens (special parsing is always on in
//! pagedlm) and user-defined tokens, longest token first.
//!
//! llama.cpp walks the tokens longest first and cuts every leftmost non-overlapping occurrence
//! of each out of the text fragments still raw. The same result comes from one Aho-Corasick
//! pass that reports every occurrence of every token, then accepting occurrences in that
//! priority order: one is kept unless it overlaps an occurrence already kept (a longer token's,
//! or an earlier one of the same token).

use std::collections::BTreeMap;
use std::collections::HashSet;

use aho_corasick::AhoCorasick;

use super::{token_type, TokenizerError};

/// A piece of text after the split: raw text for the model, or a special token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Piece<'a> {
    Text(&'a str),
    Token(u32),
}

pub(super) struct SpecialSplitter {
    /// `None` when the vocabulary has no special tokens.
    automaton: Option<AhoCorasick>,
    /// Per pattern (in priority order: longest first, then lowest id): its token id.
    ids: Vec<u32>,
}

impl SpecialSplitter {
    pub(super) fn new(tokens: &[String], token_types: &[i32]) -> Result<SpecialSplitter, TokenizerError> {
        let mut specials: Vec<(usize, u32)> = token_types
            .iter()
            .enumerate()
            .filter(|&(id, &kind)| matches!(kind, token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED) && !tokens[id].is_empty())
            .map(|(id, _)| (id, id as u32))
            .collect();
        specials.sort_by_key(|&(index, id)| (std::cmp::Reverse(tokens[index].len()), id));
        // A second token with the same text can never match: the first takes every occurrence.
        let mut seen = HashSet::new();
        specials.retain(|&(index, _)| seen.insert(tokens[index].as_str()));
        if specials.is_empty() {
            return Ok(SpecialSplitter { automaton: None, ids: Vec::new() });
        }
        let automaton = AhoCorasick::new(specials.iter().map(|&(index, _)| tokens[index].as_str()))
            .map_err(|e| TokenizerError::Build(format!("special-token matcher: {e}")))?;
        Ok(SpecialSplitter { automaton: Some(automaton), ids: specials.into_iter().map(|(_, id)| id).collect() })
    }

    /// The text cut into raw pieces (never empty) and special tokens, in order.
    pub(super) fn split<'a>(&self, text: &'a str) -> Vec<Piece<'a>> {
        let Some(automaton) = &self.automaton else {
            return if text.is_empty() { Vec::new() } else { vec![Piece::Text(text)] };
        };
        // (priority, start, end) of every occurrence of every special token.
        let mut found: Vec<(usize, usize, usize)> = automaton.find_overlapping_iter(text).map(|m| (m.pattern().as_usize(), m.start(), m.end())).collect();
        found.sort_unstable();
        // Kept occurrences: start -> (end, pattern).
        let mut kept: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        let mut current = usize::MAX;
        let mut searched_to = 0;
        for (pattern, start, end) in found {
            if pattern != current {
                current = pattern;
                searched_to = 0;
            }
            // Taken intervals are disjoint, so the last one starting before `end` is the only
            // one that can overlap.
            let overlaps_kept = kept.range(..end).next_back().is_some_and(|(_, &(kept_end, _))| kept_end > start);
            if start < searched_to || overlaps_kept {
                continue;
            }
            kept.insert(start, (end, pattern));
            searched_to = end;
        }
        let mut pieces = Vec::with_capacity(2 * kept.len() + 1);
        let mut at = 0;
        for (start, (end, pattern)) in kept {
            if start > at {
                pieces.push(Piece::Text(&text[at..start]));
            }
            pieces.push(Piece::Token(self.ids[pattern]));
            at = end;
        }
        if at < text.len() {
            pieces.push(Piece::Text(&text[at..]));
        }
        pieces
    }
}
