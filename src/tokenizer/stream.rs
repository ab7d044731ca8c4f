//! Streaming decoding: generated ids to text without ever splitting a UTF-8 character, also
//! when one character arrives as several byte-fallback tokens.

use std::sync::Arc;

use super::TokenizerError;

/// Turns generated ids into text incrementally without ever splitting a UTF-8 character: bytes of
/// an incomplete trailing character are held until the token that completes it arrives.
/// Concatenating every `push` result and `finish` gives exactly [`Tokenizer::decode`] of all ids.
pub struct StreamDecoder {
    pub(super) token_bytes: Arc<Vec<Box<[u8]>>>,
    /// Bytes received but not yet emitted: at most one incomplete UTF-8 character (≤ 3 bytes).
    pub(super) pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds one token; returns the text completed by it (often empty mid-character).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self.token_bytes.get(id as usize).ok_or(TokenizerError::UnknownId { id, vocab_size: self.token_bytes.len() })?;
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
