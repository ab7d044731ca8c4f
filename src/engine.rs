//! The one object a user drives: load a model from bytes, generate with a token stream, score
//! (teacher forcing), and report timings.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gguf::Gguf;
use crate::gpu::{Context, ContextOptions};
use crate::kv::{CacheConfig, KvCache, KvError, PoolStats, PrefixStats, SeqId};
use crate::model::{BatchGraph, Logits, ModelError, StepGraph, StepRow, Weights};
use crate::request::{generation_of, Request};
use crate::sampler::{top_k, Sampler};
use crate::sched::Scheduler;
use crate::time::now_ms;
use crate::tokenizer::{Tokenizer, TokenizerSpec};

// The engine's public surface: everything a caller (the CLI, web.rs, tests) needs comes from here.
pub use crate::error::{EngineError, ErrorKind};
pub use crate::kv::{KvDtype, KvLayout};
pub use crate::model::ModelConfig;
pub use crate::request::{Event, FinishReason, GenerateRequest, Generation, RequestId, TokenEvent};
pub use crate::sampler::SamplingParams;
pub use crate::sched::{RunningInfo, SchedConfig, SchedStats};
pub use crate::tokenizer::ChatMessage;

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
    /// Reuse the K/V of earlier requests' common prefixes (paged layout only).
    pub prefix_cache: bool,
    /// Verify the KV cache's invariants after every step (for tests; costs CPU time per step).
    pub check_integrity: bool,
    /// Continuous batching: most sequences per step, most rows per step, cache-aware admission.
    pub sched: SchedConfig,
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
            prefix_cache: true,
            check_integrity: false,
            sched: SchedConfig::default(),
        }
    }
}

/// A live sequence as [`Engine::stats`] shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SequenceInfo {
    pub id: u32,
    pub len: u32,
    pub blocks: Vec<u32>,
}

/// The engine's KV pool and prefix cache at one moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EngineStats {
    pub pool: PoolStats,
    pub prefix: PrefixStats,
    /// Per physical block: 0 free, 1 held by a running sequence, 2 held only by the prefix
    /// cache (evictable).
    pub block_states: Vec<u8>,
    pub refcounts: Vec<u32>,
    pub sequences: Vec<SequenceInfo>,
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
    options: EngineOptions,
    decode_graph: Option<StepGraph>,
    prefill_graphs: HashMap<(u32, u32), StepGraph>,
    batch_graphs: HashMap<(u32, u32), BatchGraph>,
    sched: Scheduler,
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
            // The scheduler's running set, plus one for `generate`/`score` outside it. The
            // contiguous baseline reserves the whole maximum length per sequence up front, so it
            // runs one scheduled sequence at a time.
            max_seqs: match options.kv_layout {
                KvLayout::Paged => options.sched.max_batch.max(1) + 1,
                KvLayout::Contiguous => 2,
            },
            max_seq_len: max_context,
            prefix_cache: options.prefix_cache && options.kv_layout == KvLayout::Paged,
        };
        let kv = KvCache::new(&ctx, &cfg, cache_config)?;
        if options.sched.max_batch == 0 || options.sched.step_tokens == 0 {
            return Err(EngineError::InvalidArgument("max_batch and step_tokens must be at least 1".into()));
        }
        let sched = Scheduler::new(options.sched.clone());
        Ok(Engine { ctx, cfg, weights, tokenizer, kv, options, decode_graph: None, prefill_graphs: HashMap::new(), batch_graphs: HashMap::new(), sched })
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

    /// Drops every cached prefix (their blocks return to the pool) and restarts the hit counters.
    pub fn reset_cache(&mut self) -> Result<(), EngineError> {
        Ok(self.kv.reset_prefix_cache()?)
    }

    /// The pool's occupancy, the prefix cache's counters and every block's state.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            pool: self.kv.stats(),
            prefix: self.kv.prefix_stats(),
            block_states: self.kv.block_states(),
            refcounts: self.kv.refcounts(),
            sequences: self
                .kv
                .sequences()
                .into_iter()
                .map(|id| SequenceInfo {
                    id: id.0,
                    len: self.kv.len(id).unwrap_or(0),
                    blocks: self.kv.blocks(id).map(|b| b.to_vec()).unwrap_or_default(),
                })
                .collect(),
        }
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
        seq: SeqId,
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
            let at = self.kv.append(&self.ctx, seq, n)?;
            debug_assert_eq!(at, pos);
            let table_base = self.kv.table_base(seq);
            let graph = self.prefill_graphs.get_mut(&key).expect("inserted above");
            let (ids, l) = graph.run(&self.ctx, piece, pos, table_base, read).await?;
            self.verify()?;
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

    fn verify(&self) -> Result<(), EngineError> {
        if self.options.check_integrity {
            self.kv.check_integrity().map_err(|e| EngineError::Kv(KvError::Internal(e)))?;
        }
        Ok(())
    }

    fn seq_len(&self, seq: SeqId) -> u32 {
        self.kv.len(seq).unwrap_or(0)
    }

    /// One decode step: `token` at the next position of the sequence.
    async fn decode(&mut self, seq: SeqId, token: u32, read: Logits) -> Result<(u32, Option<Vec<f32>>), EngineError> {
        if self.seq_len(seq) >= self.kv.max_seq_len {
            return Err(EngineError::ContextOverflow { prompt: self.seq_len(seq) as usize + 1, limit: self.kv.max_seq_len as usize });
        }
        if self.decode_graph.is_none() {
            self.decode_graph = Some(StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, 1, 1)?);
        }
        let pos = self.kv.append(&self.ctx, seq, 1)?;
        let table_base = self.kv.table_base(seq);
        let graph = self.decode_graph.as_mut().expect("built above");
        let (ids, logits) = graph.run(&self.ctx, &[token], pos, table_base, read).await?;
        self.verify()?;
        Ok((ids[0], logits))
    }

    /// Generates from prompt token ids, calling `on_token` for every token; `on_token` returning
    /// false aborts the generation (finish reason `abort`).
    ///
    /// The request starts from the longest prefix of `prompt` whose K/V the prefix cache holds
    /// (earlier turns of a conversation, a shared system prompt) and computes only the rest; when
    /// it ends (finished, stopped or aborted) its K/V go to the cache for later requests.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        self.check_tokens(prompt)?;
        let t0 = now_ms();
        let (seq, hit) = self.kv.allocate_for_prompt(&self.ctx, prompt)?;
        let mut history = prompt.to_vec();
        match self.generate_in(seq, hit, t0, prompt, &mut history, request, on_token).await {
            Ok(mut g) => {
                g.blocks = self.kv.blocks(seq)?.to_vec();
                self.kv.finish(seq, &history)?;
                Ok(g)
            }
            Err(e) => {
                // K/V written by a failed step are not trusted: nothing goes to the cache.
                self.kv.free(seq)?;
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn generate_in(
        &mut self,
        seq: SeqId,
        hit: u32,
        t0: f64,
        prompt: &[u32],
        history: &mut Vec<u32>,
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        let mut sampler = Sampler::new(request.sampling.clone())?;
        let greedy = request.sampling.is_greedy();
        let read = if greedy { Logits::Argmax } else { Logits::Full };
        let eos = self.tokenizer.eos_ids();
        let mut decoder = self.tokenizer.stream_decoder();
        let mut tokens = Vec::new();
        let mut text = String::new();

        let last = prompt.len() as u32 - 1;
        let (ids, logits) = self.prefill(seq, &prompt[hit as usize..], hit, last, read).await?;
        let mut next = if greedy { ids[ids.len() - 1] } else { sampler.sample(&mut logits.clone(), history) };
        let prefill_ms = now_ms() - t0;
        let ttft_ms = prefill_ms;

        let t1 = now_ms();
        let mut finish = FinishReason::Length;
        let limit = request.max_tokens as usize;
        while tokens.len() < limit {
            if eos.contains(&next) && !request.ignore_eos {
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
            if tokens.len() >= limit || self.seq_len(seq) >= self.kv.max_seq_len {
                break;
            }
            let (id, logits) = self.decode(seq, next, read).await?;
            next = match logits {
                Some(mut l) if !greedy => sampler.sample(&mut l, history),
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
            prefix_hit_tokens: hit,
            prefill_tokens: prompt.len() as u32 - hit,
            ttft_ms,
            prefill_ms,
            decode_ms: now_ms() - t1,
            blocks: Vec::new(),
        })
    }

    /// The logits predicting the token after `prompt`, computed through the prefix cache like a
    /// generation's first step (and caching `prompt` afterwards). Returns the logits and the
    /// number of prompt tokens that came from the cache.
    pub async fn next_token_logits(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, u32), EngineError> {
        self.check_tokens(prompt)?;
        let (seq, hit) = self.kv.allocate_for_prompt(&self.ctx, prompt)?;
        let last = prompt.len() as u32 - 1;
        match self.prefill(seq, &prompt[hit as usize..], hit, last, Logits::Full).await {
            Ok((_, logits)) => {
                self.kv.finish(seq, prompt)?;
                Ok((logits, hit))
            }
            Err(e) => {
                self.kv.free(seq)?;
                Err(e)
            }
        }
    }

    /// Per-kernel GPU time (ms) of one prefill step of `n` tokens and one decode step at context
    /// `n` (see [`StepGraph::profile`]).
    pub async fn profile(&mut self, n: u32) -> Result<(Vec<(String, f64)>, Vec<(String, f64)>), EngineError> {
        let tokens: Vec<u32> = (0..n).map(|i| 100 + i % (self.cfg.vocab - 100)).collect();
        let seq = self.kv.allocate(&self.ctx)?;
        let out = self.profile_in(seq, n, &tokens).await;
        self.kv.free(seq)?;
        out
    }

    async fn profile_in(&mut self, seq: SeqId, n: u32, tokens: &[u32]) -> Result<(Vec<(String, f64)>, Vec<(String, f64)>), EngineError> {
        let mut prefill = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, n, 1)?;
        self.kv.append(&self.ctx, seq, n + 1)?;
        let table_base = self.kv.table_base(seq);
        let p = prefill.profile(&self.ctx, tokens, 0, table_base).await?;
        let mut decode = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, 1, 1)?;
        let d = decode.profile(&self.ctx, &tokens[..1], n, table_base).await?;
        Ok((p, d))
    }

    /// For benchmarks: prefills `prompt`, then decodes exactly `n` greedy tokens whatever they are
    /// (end-of-generation tokens included). Returns (tokens decoded, decode milliseconds).
    pub async fn generate_ignoring_eos(&mut self, prompt: &[u32], n: u32) -> Result<(u32, f64), EngineError> {
        self.check_tokens(prompt)?;
        let seq = self.kv.allocate(&self.ctx)?;
        let out = self.bench_in(seq, prompt, n).await;
        self.kv.free(seq)?;
        out
    }

    async fn bench_in(&mut self, seq: SeqId, prompt: &[u32], n: u32) -> Result<(u32, f64), EngineError> {
        let (ids, _) = self.prefill(seq, prompt, 0, prompt.len() as u32 - 1, Logits::Argmax).await?;
        let mut next = ids[ids.len() - 1];
        let t0 = now_ms();
        let mut done = 0;
        while done < n && self.seq_len(seq) < self.kv.max_seq_len {
            next = self.decode(seq, next, Logits::Argmax).await?.0;
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
        let seq = self.kv.allocate(&self.ctx)?;
        let out = self.score_in(seq, ids, from, mode).await;
        self.kv.free(seq)?;
        out
    }

    async fn score_in(&mut self, seq: SeqId, ids: &[u32], from: usize, mode: ScoreMode) -> Result<Vec<Vec<f32>>, EngineError> {
        let vocab = self.cfg.vocab as usize;
        let mut out = Vec::with_capacity(ids.len() - from + 1);
        match mode {
            ScoreMode::Prefill => {
                let (_, logits) = self.prefill(seq, ids, 0, from as u32 - 1, Logits::Full).await?;
                out.extend(logits.chunks(vocab).map(|row| row.to_vec()));
            }
            ScoreMode::Decode => {
                let (_, logits) = self.prefill(seq, &ids[..from], 0, from as u32 - 1, Logits::Full).await?;
                out.push(logits);
                for &t in &ids[from..] {
                    let (_, logits) = self.decode(seq, t, Logits::Full).await?;
                    out.push(logits.unwrap_or_default());
                }
            }
        }
        Ok(out)
    }

    // ---- Continuous batching -------------------------------------------------------------

    /// Queues a request for [`Engine::step`]; returns its id. The prompt and the sampling
    /// parameters are checked now.
    pub fn submit(&mut self, prompt: Vec<u32>, request: GenerateRequest) -> Result<RequestId, EngineError> {
        self.check_tokens(&prompt)?;
        let sampler = Sampler::new(request.sampling.clone())?;
        let id = self.sched.next_id();
        let step = self.sched.stats.steps;
        self.sched.waiting.push_back(Request {
            id,
            prompt,
            params: request,
            sampler,
            decoder: self.tokenizer.stream_decoder(),
            generated: Vec::new(),
            text: String::new(),
            seq: None,
            computed: 0,
            first_hit: None,
            prefill_tokens: 0,
            submitted_ms: now_ms(),
            first_token_ms: None,
            prefill_done_ms: None,
            enqueued_step: step,
            admitted_step: 0,
            preemptions: 0,
            pending: None,
        });
        Ok(id)
    }

    /// Whether any submitted request has not finished.
    pub fn has_work(&self) -> bool {
        !self.sched.is_idle()
    }

    /// Ends a request now, wherever it is: its computed K/V go to the prefix cache and its
    /// sequence's blocks are released before this returns. Returns its generation so far
    /// (finish reason `abort`), or `None` for an unknown or already finished id.
    pub fn abort(&mut self, id: RequestId) -> Result<Option<Generation>, EngineError> {
        if let Some(i) = self.sched.waiting.iter().position(|r| r.id == id) {
            let mut r = self.sched.waiting.remove(i).expect("found above");
            self.sched.stats.aborted += 1;
            return Ok(Some(generation_of(&mut r, FinishReason::Abort, now_ms(), Vec::new())));
        }
        if let Some(i) = self.sched.running.iter().position(|r| r.id == id) {
            let mut r = self.sched.running.remove(i);
            let blocks = self.release(&mut r)?;
            self.sched.stats.aborted += 1;
            return Ok(Some(generation_of(&mut r, FinishReason::Abort, now_ms(), blocks)));
        }
        Ok(None)
    }

    /// Running and waiting requests, preemptions and each running sequence's block table.
    pub fn sched_stats(&self) -> SchedStats {
        self.sched.snapshot(&self.kv)
    }

    /// Hands a running request's computed K/V to the prefix cache and frees its sequence;
    /// returns the blocks it held.
    fn release(&mut self, r: &mut Request) -> Result<Vec<u32>, EngineError> {
        let Some(seq) = r.seq.take() else { return Ok(Vec::new()) };
        let blocks = self.kv.blocks(seq)?.to_vec();
        let tokens = r.tokens();
        self.kv.finish(seq, &tokens)?;
        Ok(blocks)
    }

    fn finish_running(&mut self, i: usize, result: Result<FinishReason, EngineError>, events: &mut Vec<Event>) -> Result<(), EngineError> {
        let mut r = self.sched.running.remove(i);
        let id = r.id;
        match result {
            Ok(reason) => {
                let blocks = self.release(&mut r)?;
                self.sched.stats.finished += 1;
                events.push(Event::Finished { id, result: Ok(generation_of(&mut r, reason, now_ms(), blocks)) });
            }
            Err(e) => {
                // A failed step's K/V are not trusted: nothing goes to the cache.
                if let Some(seq) = r.seq.take() {
                    self.kv.free(seq)?;
                }
                self.sched.stats.failed += 1;
                events.push(Event::Finished { id, result: Err(e) });
            }
        }
        Ok(())
    }

    /// Makes sure every row of the next plan has a KV slot: when the pool cannot hold them,
    /// preempts the most recently admitted sequences; a lone sequence that still cannot grow
    /// ends with the error.
    fn reserve(&mut self, events: &mut Vec<Event>) -> Result<crate::sched::Plan, EngineError> {
        loop {
            let plan = self.sched.plan();
            let bs = self.kv.block_size();
            let mut need = 0u32;
            let mut last: HashMap<SeqId, u32> = HashMap::new();
            for row in &plan.rows {
                let e = last.entry(row.seq).or_insert(0);
                *e = (*e).max(row.position + 1);
            }
            let mut too_long = None;
            for (&seq, &len) in &last {
                if len > self.kv.max_seq_len {
                    too_long = Some(seq);
                }
                let held = self.kv.blocks(seq)?.len() as u32;
                need += len.div_ceil(bs).saturating_sub(held);
            }
            if let Some(seq) = too_long {
                let i = self.sched.running.iter().position(|r| r.seq == Some(seq)).expect("planned rows are running");
                // The sequence reached the context limit: it ends with what it has.
                self.finish_running(i, Ok(FinishReason::Length), events)?;
                continue;
            }
            let stats = self.kv.stats();
            if need <= stats.blocks_free + stats.blocks_cached || self.kv.layout == KvLayout::Contiguous {
                for (&seq, &len) in &last {
                    let have = self.kv.len(seq)?;
                    if len > have {
                        if let Err(e) = self.kv.append(&self.ctx, seq, len - have) {
                            let i = self.sched.running.iter().position(|r| r.seq == Some(seq)).expect("planned rows are running");
                            self.finish_running(i, Err(e.into()), events)?;
                            return Ok(crate::sched::Plan::default());
                        }
                    }
                }
                return Ok(plan);
            }
            // Keep the oldest admitted sequence; preempt the newest.
            let keep = self.sched.running.iter().min_by_key(|r| (r.admitted_step, r.id)).map(|r| r.id).expect("rows imply running");
            if !self.sched.preempt_one(&mut self.kv, keep)? {
                let i = self.sched.running.iter().position(|r| r.id == keep).expect("kept");
                let stats = self.kv.stats();
                let err = KvError::PoolExhausted { needed: need, free: stats.blocks_free + stats.blocks_cached, total: stats.blocks_total };
                self.finish_running(i, Err(err.into()), events)?;
            }
        }
    }

    /// Runs one scheduling step: admits waiting requests, runs one forward over the batch (each
    /// running sequence's next token plus at most one prefill chunk) and returns what happened:
    /// tokens and finished requests. Does nothing when there is no work.
    pub async fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = self.sched.admit(&self.ctx, &mut self.kv);
        let plan = self.reserve(&mut events)?;
        if plan.rows.is_empty() {
            return Ok(events);
        }
        self.sched.stats.steps += 1;
        // Which rows need logits: every decode row, and the last row of a prefill chunk that
        // completes its context.
        let mut wants: Vec<(usize, usize)> = plan.decode.iter().enumerate().map(|(row, &req)| (row, req)).collect();
        if let Some((req, first, n, true)) = plan.prefill {
            wants.push((first + n as usize - 1, req));
        }
        let full = wants.iter().any(|&(_, req)| !self.sched.running[req].params.sampling.is_greedy());
        let read = if full { Logits::Full } else { Logits::Argmax };
        let outputs = match self.run_rows(&plan, read).await {
            Ok(o) => o,
            Err(e) => {
                // The step failed as a whole: every request in it ends with the error.
                let mut reqs: Vec<usize> = plan.decode.clone();
                reqs.extend(plan.prefill.map(|p| p.0));
                reqs.sort_unstable();
                reqs.dedup();
                for &i in reqs.iter().rev() {
                    let err = e.step_failure();
                    self.finish_running(i, Err(err), &mut events)?;
                }
                return Ok(events);
            }
        };
        self.verify()?;
        let now = now_ms();
        for &i in &plan.decode {
            let r = &mut self.sched.running[i];
            r.computed += 1;
            r.pending = None;
        }
        if let Some((i, _, n, completes)) = plan.prefill {
            let r = &mut self.sched.running[i];
            r.computed += n;
            r.prefill_tokens += n;
            if completes {
                r.prefill_done_ms.get_or_insert(now);
            }
            // Requests arriving while this one runs can share its prompt's K/V from now on.
            let (seq, tokens) = (r.seq.expect("running requests have a sequence"), r.tokens());
            self.kv.publish(seq, &tokens)?;
        }
        let eos = self.tokenizer.eos_ids();
        let mut done: Vec<(usize, FinishReason)> = Vec::new();
        for (k, &(_, req)) in wants.iter().enumerate() {
            let (argmax, logits) = &outputs[k];
            let max_len = self.kv.max_seq_len;
            let r = &mut self.sched.running[req];
            let history = r.tokens();
            let next = match logits {
                Some(l) if !r.params.sampling.is_greedy() => r.sampler.sample(&mut l.clone(), &history),
                _ => *argmax,
            };
            r.first_token_ms.get_or_insert(now);
            if eos.contains(&next) && !r.params.ignore_eos {
                done.push((req, FinishReason::Stop));
                continue;
            }
            r.generated.push(next);
            // The model's own ids always decode; an error here would be a broken vocabulary.
            let piece = r.decoder.push(next).unwrap_or_default();
            r.text.push_str(&piece);
            let stop_at = r.params.stop.iter().filter_map(|s| (!s.is_empty()).then(|| r.text.find(s.as_str())).flatten()).min();
            if let Some(cut) = stop_at {
                r.text.truncate(cut);
                done.push((req, FinishReason::Stop));
                continue;
            }
            events.push(Event::Token { id: r.id, token: next, text: piece });
            if r.generated.len() >= r.params.max_tokens as usize || r.computed >= max_len {
                done.push((req, FinishReason::Length));
            } else {
                r.pending = Some(next);
            }
        }
        done.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, reason) in done {
            self.finish_running(i, Ok(reason), &mut events)?;
        }
        Ok(events)
    }

    /// Runs the planned rows and returns, per row that wants logits (decode rows in order, then
    /// the completing prefill row), its argmax and (with `Logits::Full`) its logits.
    async fn run_rows(&mut self, plan: &crate::sched::Plan, read: Logits) -> Result<Vec<(u32, Option<Vec<f32>>)>, EngineError> {
        // Steps of one sequence take the single-sequence graphs (their prefill attention shares
        // each key between the rows of a chunk); steps of several take one batched forward.
        let sequences = plan.decode.len() + plan.prefill.is_some() as usize;
        if sequences > 1 {
            return self.run_rows_batched(plan, read).await;
        }
        self.run_rows_per_sequence(plan, read).await
    }

    /// One forward over all rows of the step ([`BatchGraph`]): the weights are read once for
    /// the whole batch. Graphs are built for power-of-two row and logit-row capacities.
    async fn run_rows_batched(&mut self, plan: &crate::sched::Plan, read: Logits) -> Result<Vec<(u32, Option<Vec<f32>>)>, EngineError> {
        let rows: Vec<StepRow> = plan
            .rows
            .iter()
            .map(|r| StepRow { token: r.token, position: r.position, table_base: self.kv.table_base(r.seq) })
            .collect();
        let mut logit_rows: Vec<u32> = (0..plan.decode.len() as u32).collect();
        if let Some((_, first, n, true)) = plan.prefill {
            logit_rows.push((first + n as usize - 1) as u32);
        }
        if logit_rows.is_empty() {
            // A prefill chunk that does not finish its prompt: its last row stands in.
            logit_rows.push(rows.len() as u32 - 1);
        }
        let key = (rows.len().next_power_of_two() as u32, logit_rows.len().next_power_of_two() as u32);
        if !self.batch_graphs.contains_key(&key) {
            if self.batch_graphs.len() >= 6 {
                self.batch_graphs.clear();
            }
            let g = BatchGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, key.0, key.1.min(key.0))?;
            self.batch_graphs.insert(key, g);
        }
        let graph = self.batch_graphs.get_mut(&key).expect("inserted above");
        let wanted = plan.decode.len() + matches!(plan.prefill, Some((_, _, _, true))) as usize;
        let (ids, logits) = graph.run(&self.ctx, &rows, &logit_rows, if wanted > 0 { read } else { Logits::Argmax }).await?;
        let vocab = self.cfg.vocab as usize;
        Ok((0..wanted).map(|k| (ids[k], logits.as_ref().map(|l| l[k * vocab..(k + 1) * vocab].to_vec()))).collect())
    }

    /// The rows sequence by sequence through the single-sequence graphs (one submission per
    /// sequence): steps of one sequence.
    async fn run_rows_per_sequence(&mut self, plan: &crate::sched::Plan, read: Logits) -> Result<Vec<(u32, Option<Vec<f32>>)>, EngineError> {
        let mut out = Vec::new();
        for (k, row) in plan.rows.iter().enumerate().take(plan.decode.len()) {
            debug_assert!(k < plan.decode.len());
            if self.decode_graph.is_none() {
                self.decode_graph = Some(StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, 1, 1)?);
            }
            let table_base = self.kv.table_base(row.seq);
            let graph = self.decode_graph.as_mut().expect("built above");
            let (ids, logits) = graph.run(&self.ctx, &[row.token], row.position, table_base, read).await?;
            out.push((ids[0], logits));
        }
        if let Some((_, first, n, completes)) = plan.prefill {
            let rows = &plan.rows[first..first + n as usize];
            let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
            let key = (n, 1);
            if !self.prefill_graphs.contains_key(&key) {
                if self.prefill_graphs.len() >= 4 {
                    self.prefill_graphs.clear();
                }
                let g = StepGraph::build(&self.ctx, &self.cfg, &self.weights, &self.kv, n, 1)?;
                self.prefill_graphs.insert(key, g);
            }
            let table_base = self.kv.table_base(rows[0].seq);
            let graph = self.prefill_graphs.get_mut(&key).expect("inserted above");
            let (ids, logits) = graph.run(&self.ctx, &tokens, rows[0].position, table_base, if completes { read } else { Logits::Argmax }).await?;
            if completes {
                out.push((ids[0], logits));
            }
        }
        Ok(out)
    }

    /// Runs steps until every submitted request has finished, calling `on_event` for each event.
    pub async fn run_to_completion(&mut self, on_event: &mut dyn FnMut(&Event)) -> Result<(), EngineError> {
        while self.has_work() {
            for e in self.step().await? {
                on_event(&e);
            }
        }
        Ok(())
    }

    // ---- KV transfer ---------------------------------------------------------------------

    /// Computes and caches the K/V of `tokens` that the prefix cache lacks (no logits are read).
    pub async fn cache_prefix(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        self.check_tokens(tokens)?;
        if self.kv.peek_prefix(tokens) as usize >= tokens.len() {
            return Ok(());
        }
        let (seq, hit) = self.kv.allocate_for_prompt(&self.ctx, tokens)?;
        let last = tokens.len() as u32 - 1;
        match self.prefill(seq, &tokens[hit as usize..], hit, last, Logits::Argmax).await {
            Ok(_) => Ok(self.kv.finish(seq, tokens)?),
            Err(e) => {
                self.kv.free(seq)?;
                Err(e)
            }
        }
    }

    /// A snapshot of the K/V of `tokens` (a conversation's history: prompt and reply ids),
    /// computing whatever part is not cached. See [`crate::kv::snapshot`] for the format.
    pub async fn export_snapshot(&mut self, tokens: &[u32]) -> Result<Vec<u8>, EngineError> {
        self.cache_prefix(tokens).await?;
        Ok(self.kv.export_prefix(&self.ctx, tokens).await?)
    }

    /// Loads a snapshot into the prefix cache; the next request whose prompt starts with its
    /// tokens reuses them. Returns the tokens. Refused with a typed error, changing nothing, if
    /// it comes from another model, KV dtype, layout, block size or format version, or is damaged.
    pub fn import_snapshot(&mut self, bytes: &[u8]) -> Result<Vec<u32>, EngineError> {
        Ok(self.kv.import(&self.ctx, bytes, self.cfg.vocab)?)
    }
}
