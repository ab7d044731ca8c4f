//! One-shot work on one sequence outside the scheduler: teacher-forced scoring, benchmark
//! generations, computing and caching a prefix, and KV snapshots.

use crate::backend;
use crate::error::EngineError;
use crate::kv::SeqId;
use crate::model::Logits;
use crate::request::{GenerateRequest, Generation};
use crate::sampler::top_k;

use super::{Constraint, Engine};

/// How `score` runs the continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreMode {
    /// Prefill the context, then one token at a time through the decode path.
    Decode,
    /// Everything in prefill passes.
    Prefill,
}

impl Engine {
    /// Allocates a sequence for `tokens`, runs `work` on it and frees it (the K/V go nowhere).
    pub(super) async fn scratch_sequence<T>(&mut self, work: impl AsyncFnOnce(&mut Self, SeqId) -> Result<T, EngineError>) -> Result<T, EngineError> {
        let seq = self.kv.allocate()?;
        let out = work(self, seq).await;
        self.kv.free(seq)?;
        out
    }

    pub(super) async fn prefill(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        start: u32,
        first_logit: u32,
        read: Logits,
    ) -> Result<(Vec<u32>, Vec<f32>), EngineError> {
        let out = backend::prefill(&mut *self.backend, &mut self.kv, seq, tokens, (start, first_logit), read).await?;
        self.verify()?;
        Ok(out)
    }

    pub(super) async fn decode(&mut self, seq: SeqId, token: u32, read: Logits) -> Result<(u32, Option<Vec<f32>>), EngineError> {
        let len = self.kv.len(seq)?;
        if len >= self.kv.max_seq_len {
            return Err(EngineError::ContextOverflow { prompt: len as usize + 1, limit: self.kv.max_seq_len as usize });
        }
        let out = backend::decode(&mut *self.backend, &mut self.kv, seq, token, read).await?;
        self.verify()?;
        Ok(out)
    }

    /// Computes `tokens` through the prefix cache like a request's prompt (reusing the cached
    /// prefix, computing the rest) and caches them; returns the last token's logits (with
    /// `read` = Full) and the number of tokens that came from the cache.
    async fn prefill_cached(&mut self, tokens: &[u32], read: Logits) -> Result<(Vec<f32>, u32), EngineError> {
        self.check_tokens(tokens)?;
        let (seq, hit) = self.kv.allocate_for_prompt(tokens)?;
        let last = tokens.len() as u32 - 1;
        match self.prefill(seq, &tokens[hit as usize..], hit, last, read).await {
            Ok((_, logits)) => {
                self.kv.finish(seq, tokens)?;
                Ok((logits, hit))
            }
            Err(e) => {
                // K/V written by a failed step are not trusted: nothing goes to the cache.
                self.kv.free(seq)?;
                Err(e)
            }
        }
    }

    /// The logits predicting the token after `prompt`, computed through the prefix cache like a
    /// generation's first step (and caching `prompt` afterwards). Returns the logits and the
    /// number of prompt tokens that came from the cache.
    pub async fn next_token_logits(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, u32), EngineError> {
        self.prefill_cached(prompt, Logits::Full).await
    }

    /// For benchmarks: generates from `prompt` through the scheduler, like any request, the
    /// first token and then exactly `n` greedy tokens whatever they are (end-of-generation tokens
    /// included; fewer at the context limit). Returns (tokens decoded after the first, their
    /// milliseconds).
    pub async fn generate_ignoring_eos(&mut self, prompt: &[u32], n: u32) -> Result<(u32, f64), EngineError> {
        let (tokens, ms) = self.generate_ignoring_eos_under(prompt, n, None).await?;
        Ok((tokens.len().saturating_sub(1) as u32, ms))
    }

    /// [`Engine::generate_ignoring_eos`] under `constraint` (which may end it early, when its
    /// output is complete). Returns every generated token (the first included) and the
    /// milliseconds of those after the first.
    pub async fn generate_ignoring_eos_under(&mut self, prompt: &[u32], n: u32, constraint: Option<Constraint>) -> Result<(Vec<u32>, f64), EngineError> {
        // One token a step: what this measures is plain decoding.
        let speculative = Some(crate::speculate::Speculative::Off);
        let request = GenerateRequest { max_tokens: n.saturating_add(1), ignore_eos: true, constraint, speculative, ..Default::default() };
        let (g, ms) = self.generate_timed(prompt, &request).await?;
        Ok((g.tokens, ms))
    }

    /// For benchmarks: [`Engine::generate`] with the milliseconds from its first token to its end
    /// (the decode of the tokens after the first, as a caller sees it).
    pub async fn generate_timed(&mut self, prompt: &[u32], request: &GenerateRequest) -> Result<(Generation, f64), EngineError> {
        let mut first = None;
        let g = self
            .generate(prompt, request, &mut |_| {
                first.get_or_insert_with(crate::time::now_ms);
                true
            })
            .await?;
        Ok((g, first.map_or(0.0, |t0| crate::time::now_ms() - t0)))
    }

    /// Teacher forcing: reads `ids` and, for every position p from `from - 1` to `len - 1`,
    /// returns the top-5 (id, logit) predicting position p + 1.
    pub async fn score(&mut self, ids: &[u32], from: usize, mode: ScoreMode) -> Result<Vec<Vec<(u32, f32)>>, EngineError> {
        let rows = self.score_logits(ids, from, mode).await?;
        Ok(rows.iter().map(|row| top_k(row, 5)).collect())
    }

    /// Teacher forcing with full logits: one row of `vocab` logits per position p from `from - 1`
    /// to `len - 1` (the prediction for position p + 1).
    pub async fn score_logits(&mut self, ids: &[u32], from: usize, mode: ScoreMode) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_tokens(ids)?;
        if from == 0 || from > ids.len() {
            return Err(EngineError::InvalidArgument(format!("from must be in 1..={}, got {from}", ids.len())));
        }
        let vocab = self.config().vocab as usize;
        self.scratch_sequence(async |e: &mut Self, seq| {
            let mut out = Vec::with_capacity(ids.len() - from + 1);
            match mode {
                ScoreMode::Prefill => {
                    let (_, logits) = e.prefill(seq, ids, 0, from as u32 - 1, Logits::Full).await?;
                    out.extend(logits.chunks(vocab).map(|row| row.to_vec()));
                }
                ScoreMode::Decode => {
                    let (_, logits) = e.prefill(seq, &ids[..from], 0, from as u32 - 1, Logits::Full).await?;
                    out.push(logits);
                    for &t in &ids[from..] {
                        let (_, logits) = e.decode(seq, t, Logits::Full).await?;
                        out.push(logits.unwrap_or_default());
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    // ---- KV transfer ---------------------------------------------------------------------

    /// Computes and caches the K/V of `tokens` that the prefix cache lacks (no logits are read).
    pub async fn cache_prefix(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        self.check_tokens(tokens)?;
        if self.kv.peek_prefix(tokens) as usize >= tokens.len() {
            return Ok(());
        }
        self.prefill_cached(tokens, Logits::Argmax).await.map(|_| ())
    }

    /// A snapshot of the K/V of `tokens` (a conversation's history: prompt and reply ids),
    /// computing whatever part is not cached. See [`crate::kv::snapshot`] for the format.
    pub async fn export_snapshot(&mut self, tokens: &[u32]) -> Result<Vec<u8>, EngineError> {
        self.cache_prefix(tokens).await?;
        Ok(self.kv.export_prefix(tokens).await?)
    }

    /// Loads a snapshot into the prefix cache; the next request whose prompt starts with its
    /// tokens reuses them. Returns the tokens. Refused with a typed error, changing nothing, if
    /// it comes from another model, KV dtype, layout, block size or format version, or is damaged.
    pub fn import_snapshot(&mut self, bytes: &[u8]) -> Result<Vec<u32>, EngineError> {
        Ok(self.kv.import(bytes, self.config().vocab)?)
    }
}
