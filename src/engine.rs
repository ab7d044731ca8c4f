//! The one object a user drives: load a model from bytes, generate with a token stream, score
//! (teacher forcing), and report timings.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gguf::Gguf;
use crate::gpu::{Context, ContextOptions, GpuError};
use crate::kv::{CacheConfig, KvCache, KvError, SeqId};
pub use crate::kv::{KvDtype, KvLayout};
use crate::model::{Logits, ModelConfig, ModelError, StepGraph, Weights};
use crate::sampler::{top_k, Sampler, SamplingError, SamplingParams};
use crate::time::now_ms;
use crate::tokenizer::{ChatMessage, Tokenizer, TokenizerError, TokenizerSpec};

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// The longest sequence (prompt + generation) the engine holds; 0 = min(model context, 4096).
    pub max_context: u32,
    /// Prompt rows per prefill pass; longer prompts run in chunks.
    pub prefill_chunk: u32,
    pub kv_layout: KvLayout,
    pub kv_dtype: KvDtype,
    /// Tokens per KV block (paged layout).
    pub block_size: u32,
    /// Token slots in the KV pool (paged layout); 0 = the maximum context, capped by the device's
    /// storage-binding limit for one layer's buffer.
    pub pool_tokens: u32,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_context: 0,
            prefill_chunk: 512,
            kv_layout: KvLayout::Paged,
            kv_dtype: KvDtype::F32,
            block_size: 16,
            pool_tokens: 0,
        }
    }
}

/// Errors of the engine, each with a message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("invalid sampling parameters: {0}")]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {limit}")]
    ContextOverflow { prompt: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: u32 },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0} is not available yet")]
    NotAvailable(String),
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

/// A generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    /// Text that ends the generation (the stop string itself is not part of the output).
    pub stop: Vec<String>,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest { max_tokens: 128, sampling: SamplingParams::greedy(), stop: Vec::new() }
    }
}

/// One generated token as streamed to the caller.
pub struct TokenEvent<'a> {
    pub id: u32,
    /// Text completed by this token (may be empty while a UTF-8 character is incomplete).
    pub text: &'a str,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

/// How `score` runs the continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreMode {
    /// Prefill the context, then one token at a time through the decode path.
    Decode,
    /// Everything in prefill passes.
    Prefill,
}

pub struct Engine {
    ctx: Arc<Context>,
    cfg: ModelConfig,
    weights: Weights,
    tokenizer: Tokenizer,
    kv: KvCache,
    /// The engine's one sequence (several come with the scheduler).
    seq: SeqId,
    options: EngineOptions,
    decode_graph: Option<StepGraph>,
    prefill_graphs: HashMap<(u32, u32), StepGraph>,
}

impl Engine {
    /// Creates a GPU context and loads a GGUF model from its bytes.
    pub async fn load(bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
        let ctx = Arc::new(Context::new(ContextOptions::default()).await?);
        Engine::load_with_context(ctx, bytes, options)
    }

    /// Loads a GGUF model on an existing context.
    pub fn load_with_context(ctx: Arc<Context>, bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
        if options.prefill_chunk == 0 {
            return Err(EngineError::InvalidArgument("prefill_chunk must be at least 1".into()));
        }
        let gguf = Gguf::parse(bytes).map_err(ModelError::from)?;
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&gguf)?)?;
        let weights = Weights::upload(&ctx, &gguf, &cfg)?;
        let max_context = match options.max_context {
            0 => cfg.context_length.min(4096),
            n => n.min(cfg.context_length.max(1)),
        };
        let cache_config = CacheConfig {
            layout: options.kv_layout,
            dtype: options.kv_dtype,
            block_size: options.block_size,
            // Default: room for the longest sequence, capped by what one layer's buffer may bind
            // on this device.
            pool_tokens: if options.pool_tokens == 0 {
                let device_max = crate::kv::KvPool::max_blocks(&ctx, &cfg, options.block_size.max(1)) * options.block_size.max(1) as u64;
                (max_context as u64).min(device_max) as u32
            } else {
                options.pool_tokens
            },
            max_seqs: 1,
            max_seq_len: max_context,
        };
        let mut kv = KvCache::new(&ctx, &cfg, cache_config)?;
        let seq = kv.allocate(&ctx)?;
        Ok(Engine { ctx, cfg, weights, tokenizer, kv, seq, options, decode_graph: None, prefill_graphs: HashMap::new() })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn max_context(&self) -> u32 {
        self.kv.max_seq_len
    }

    /// GPU bytes held by the weights and by the KV cache.
    pub fn memory(&self) -> (u64, u64) {
        (self.weights.bytes(), self.kv.pool.bytes_total())
    }

    /// The KV cache (pool statistics, integrity checks).
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// Renders chat messages with the model's template and tokenizes them.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let text = self.tokenizer.apply_chat_template(messages, true)?;
        Ok(self.tokenizer.encode(&text)?)
    }

    fn check_tokens(&self, ids: &[u32]) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= self.cfg.vocab) {
            return Err(EngineError::BadToken { id, vocab: self.cfg.vocab });
        }
        if ids.len() > self.kv.max_seq_len as usize {
            return Err(EngineError::ContextOverflow { prompt: ids.len(), limit: self.kv.max_seq_len as usize });
        }
        Ok(())
    }

    /// Runs `tokens` at positions `start..` through prefill passes of at most `prefill_chunk` rows.
    /// Returns, for each position p in `start..start+len` with p >= `first_logit`, the argmax and
    /// (with `Logits::Full`) the logits predicting position p + 1.
    async fn prefill(
        &mut self,
        tokens: &[u32],
        start: u32,
        first_logit: u32,
        read: Logits,
    ) -> Result<(Vec<u32>, Vec<f32>), EngineError> {
        let chunk = self.options.prefill_chunk as usize;
        let mut argmaxes = Vec::new();
        let mut logits = Vec::new();
        let mut pos = start;
        for piece in tokens.chunks(chunk) {
            let n = piece.len() as u32;
            let end = pos + n;
            let want = end.saturating_sub(first_logit.max(pos)).max(1);
            let key = (n, want);
            if !self.prefill_graphs.contains_key(&key) {
                if self.prefill_graphs.len() >= 4 {
                    self.prefill_graphs.clear();
                }
                let g = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, n, want)?;
                self.prefill_graphs.insert(key, g);
            }
            let at = self.kv.append(&self.ctx, self.seq, n)?;
            debug_assert_eq!(at, pos);
            let table_base = self.kv.table_base(self.seq);
            let graph = self.prefill_graphs.get_mut(&key).expect("inserted above");
            let (ids, l) = graph.run(&self.ctx, piece, pos, table_base, read).await?;
            if end > first_logit {
                argmaxes.extend(ids);
                if let Some(l) = l {
                    logits.extend(l);
                }
            }
            pos = end;
        }
        Ok((argmaxes, logits))
    }

    /// Tokens in the engine's sequence.
    fn seq_len(&self) -> u32 {
        self.kv.len(self.seq).unwrap_or(0)
    }

    /// Empties the engine's sequence (its blocks return to the pool).
    fn reset_sequence(&mut self) -> Result<(), EngineError> {
        Ok(self.kv.truncate(&self.ctx, self.seq, 0)?)
    }

    /// One decode step: `token` at the next position of the sequence.
    async fn decode(&mut self, token: u32, read: Logits) -> Result<(u32, Option<Vec<f32>>), EngineError> {
        if self.seq_len() >= self.kv.max_seq_len {
            return Err(EngineError::ContextOverflow { prompt: self.seq_len() as usize + 1, limit: self.kv.max_seq_len as usize });
        }
        if self.decode_graph.is_none() {
            self.decode_graph = Some(StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, 1, 1)?);
        }
        let pos = self.kv.append(&self.ctx, self.seq, 1)?;
        let table_base = self.kv.table_base(self.seq);
        let graph = self.decode_graph.as_mut().expect("built above");
        let (ids, logits) = graph.run(&self.ctx, &[token], pos, table_base, read).await?;
        Ok((ids[0], logits))
    }

    /// Generates from prompt token ids, calling `on_token` for every token; `on_token` returning
    /// false aborts the generation (finish reason `abort`).
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        self.check_tokens(prompt)?;
        let mut sampler = Sampler::new(request.sampling.clone())?;
        let greedy = request.sampling.is_greedy();
        let read = if greedy { Logits::Argmax } else { Logits::Full };
        let eos = self.tokenizer.eos_ids();
        let mut decoder = self.tokenizer.stream_decoder();
        let mut history: Vec<u32> = prompt.to_vec();
        let mut tokens = Vec::new();
        let mut text = String::new();

        self.reset_sequence()?;
        let t0 = now_ms();
        let last = prompt.len() as u32 - 1;
        let (ids, logits) = self.prefill(prompt, 0, last, read).await?;
        let mut next = if greedy { ids[ids.len() - 1] } else { sampler.sample(&mut logits.clone(), &history) };
        let prefill_ms = now_ms() - t0;

        let t1 = now_ms();
        let mut finish = FinishReason::Length;
        let limit = request.max_tokens as usize;
        while tokens.len() < limit {
            if eos.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(next);
            history.push(next);
            let piece = decoder.push(next)?;
            text.push_str(&piece);
            if let Some(cut) = request.stop.iter().filter_map(|s| (!s.is_empty()).then(|| text.find(s.as_str())).flatten()).min() {
                text.truncate(cut);
                finish = FinishReason::Stop;
                break;
            }
            if !on_token(&TokenEvent { id: next, text: &piece }) {
                finish = FinishReason::Abort;
                break;
            }
            if tokens.len() >= limit || self.seq_len() >= self.kv.max_seq_len {
                break;
            }
            let (id, logits) = self.decode(next, read).await?;
            next = match logits {
                Some(mut l) if !greedy => sampler.sample(&mut l, &history),
                _ => id,
            };
        }
        if finish != FinishReason::Stop {
            text.push_str(&decoder.finish());
        }
        Ok(Generation {
            prompt_tokens: prompt.to_vec(),
            tokens,
            text,
            finish_reason: finish,
            prefill_ms,
            decode_ms: now_ms() - t1,
        })
    }

    /// Per-kernel GPU time (ms) of one prefill step of `n` tokens and one decode step at context
    /// `n` (see [`StepGraph::profile`]).
    pub async fn profile(&mut self, n: u32) -> Result<(Vec<(String, f64)>, Vec<(String, f64)>), EngineError> {
        let tokens: Vec<u32> = (0..n).map(|i| 100 + i % (self.cfg.vocab - 100)).collect();
        let mut prefill = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, n, 1)?;
        self.reset_sequence()?;
        self.kv.append(&self.ctx, self.seq, n + 1)?;
        let table_base = self.kv.table_base(self.seq);
        let p = prefill.profile(&self.ctx, &tokens, 0, table_base).await?;
        let mut decode = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, 1, 1)?;
        let d = decode.profile(&self.ctx, &tokens[..1], n, table_base).await?;
        self.reset_sequence()?;
        Ok((p, d))
    }

    /// For benchmarks: prefills `prompt`, then decodes exactly `n` greedy tokens whatever they are
    /// (end-of-generation tokens included). Returns (tokens decoded, decode milliseconds).
    pub async fn generate_ignoring_eos(&mut self, prompt: &[u32], n: u32) -> Result<(u32, f64), EngineError> {
        self.check_tokens(prompt)?;
        self.reset_sequence()?;
        let (ids, _) = self.prefill(prompt, 0, prompt.len() as u32 - 1, Logits::Argmax).await?;
        let mut next = ids[ids.len() - 1];
        let t0 = now_ms();
        let mut done = 0;
        while done < n && self.seq_len() < self.kv.max_seq_len {
            next = self.decode(next, Logits::Argmax).await?.0;
            done += 1;
        }
        Ok((done, now_ms() - t0))
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
        let vocab = self.cfg.vocab as usize;
        self.reset_sequence()?;
        let mut out = Vec::with_capacity(ids.len() - from + 1);
        match mode {
            ScoreMode::Prefill => {
                let (_, logits) = self.prefill(ids, 0, from as u32 - 1, Logits::Full).await?;
                out.extend(logits.chunks(vocab).map(|row| row.to_vec()));
            }
            ScoreMode::Decode => {
                let (_, logits) = self.prefill(&ids[..from], 0, from as u32 - 1, Logits::Full).await?;
                out.push(logits);
                for &t in &ids[from..] {
                    let (_, logits) = self.decode(t, Logits::Full).await?;
                    out.push(logits.unwrap_or_default());
                }
            }
        }
        Ok(out)
    }
}
