//! Continuous batching: a waiting queue and a running set, scheduled one forward step at a time.
//!
//! Every step the scheduler
//! 1. **admits** waiting requests while the running set has room and the pool can hold the
//!    prompt's uncached part, preferring the request with the longest cached prefix (the prefix
//!    cache and the scheduler cooperate, as in SGLang) unless a request has waited longer than
//!    `age_limit` steps, which then goes first, so nothing starves; a request that shares more
//!    full blocks with a prompt still being prefilled than the cache holds waits for that
//!    prefill, whose blocks are published to the prefix cache after every chunk
//!    ([`KvCache::publish`]), instead of computing the same K/V twice;
//! 2. **plans** one batch: the next token of every running sequence that is decoding, plus one
//!    prefill chunk of the oldest sequence still reading its prompt, within `step_tokens` rows
//!    (chunked prefill: a long prompt delays the others' next tokens by one chunk, not by the
//!    whole prompt);
//! 3. **reserves** KV slots for every row; when the pool is short, the prefix cache's least
//!    recently used blocks go first (inside [`KvCache`]), then the most recently admitted
//!    sequence is **preempted**: its computed K/V go to the prefix cache, its blocks are released,
//!    and it returns to the front of the queue, later resuming from whatever of its prefix is
//!    still cached. A step fails for lack of memory only when a single sequence alone cannot grow,
//!    and then only that request ends, with a typed error.
//!
//! 4. **commits** the step's outputs: every request that got a token handles it
//!    ([`Request::accept`]: sampling, end of generation, stop strings, the token limit, streaming
//!    decode), and a prefill chunk's full blocks are published to the prefix cache.
//!
//! Requests leave after any step (stop, length, abort or an error) and waiting ones take their
//! place in the next. The scheduler owns the request's whole life (submit, admit, reserve,
//! preempt, abort, commit) and the KV cache's sequences, but never runs the model or touches the
//! GPU: the engine runs the planned rows between [`Scheduler::reserve`] and [`Scheduler::commit`].

use std::collections::{HashMap, VecDeque};

use crate::error::EngineError;
use crate::kv::{KvCache, KvError, KvLayout, SeqId};
use crate::request::{Event, FinishReason, GenerateRequest, Generation, Handling, Request, RequestId};
use crate::speculate::{Speculative, MAX_VERIFY_ROWS};

mod plan;

use plan::Chunk;
pub(crate) use plan::Plan;
pub use plan::Row;

/// How the scheduler batches.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Most sequences running at once (decode rows per step).
    pub max_batch: u32,
    /// Most rows (decode tokens + prefill tokens) per step.
    pub step_tokens: u32,
    /// Prefer waiting requests with a longer cached prefix.
    pub cache_aware: bool,
    /// A request that has waited this many steps is admitted next whatever its prefix.
    pub age_limit: u64,
    /// Plan the next decode step while the one before is still on the GPU
    /// ([`Scheduler::plan_ahead`]), so that the GPU need not wait for the CPU between steps.
    pub lookahead: bool,
    /// Whether requests draft tokens to verify with their next one ([`crate::speculate`]) unless
    /// a request says otherwise. The Rust API's default is `Off` (a step is one token per
    /// sequence); the package's and the CLI's is [`SchedConfig::FOR_USERS_SPECULATIVE`].
    pub speculative: Speculative,
    /// Most draft tokens per sequence and step (a request may ask for fewer).
    pub max_draft: u32,
}

impl SchedConfig {
    /// What the package and the CLI take when `speculative` is not given: auto, since free text
    /// holds (0.99-1.08× on the README's figures: a sequence whose drafts do not pay pauses) and
    /// verification steps are planned ahead on the GPU like any decode step.
    pub const FOR_USERS_SPECULATIVE: Speculative = Speculative::Auto;

    /// Most logit rows one step may have: a token per sequence; with speculation, their drafts
    /// too, within the step and [`MAX_VERIFY_ROWS`], and a prefill chunk's last row.
    pub fn max_logit_rows(&self) -> u32 {
        if self.speculative == Speculative::Off {
            return self.max_batch;
        }
        (self.max_batch * (1 + self.max_draft)).min(self.step_tokens.max(self.max_batch)).min(self.max_verify_rows()) + 1
    }

    /// Most logit rows of decoding sequences in a step with drafts.
    fn max_verify_rows(&self) -> u32 {
        MAX_VERIFY_ROWS.max(self.max_batch)
    }
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            max_batch: 8,
            step_tokens: 256,
            cache_aware: true,
            age_limit: 64,
            lookahead: true,
            speculative: Speculative::Off,
            max_draft: crate::speculate::DEFAULT_MAX_DRAFT,
        }
    }
}

/// Scheduler counters and the running set's block tables.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SchedStats {
    pub running: u32,
    pub waiting: u32,
    pub steps: u64,
    /// Steps planned ahead, while the step before was still on the GPU.
    pub steps_ahead: u64,
    /// Times a sequence got no row in a step planned ahead because the draft its rows in flight
    /// verify is likely cut (the rows planned past it would be discarded): it gets its row in
    /// the step after, planned once the draft's tokens are known.
    pub drafts_held: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub aborted: u64,
    pub failed: u64,
    pub sequences: Vec<RunningInfo>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RunningInfo {
    pub request: RequestId,
    pub seq: u32,
    pub len: u32,
    pub prefilling: bool,
    pub blocks: Vec<u32>,
}

pub(crate) struct Scheduler {
    config: SchedConfig,
    /// Most rows of one prefill chunk (the engine's `prefill_chunk`), within the step's budget.
    max_chunk: u32,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
    stats: SchedStats,
    next_id: u64,
}

impl Scheduler {
    pub fn new(config: SchedConfig, max_chunk: u32) -> Result<Scheduler, EngineError> {
        if config.max_batch == 0 || config.step_tokens == 0 || max_chunk == 0 {
            return Err(EngineError::InvalidArgument("max_batch, step_tokens and prefill_chunk must be at least 1".into()));
        }
        Ok(Scheduler { config, max_chunk, waiting: VecDeque::new(), running: Vec::new(), stats: SchedStats::default(), next_id: 0 })
    }

    /// Queues a request (its prompt and parameters already checked); returns its id.
    pub fn submit(&mut self, prompt: Vec<u32>, params: GenerateRequest, handling: Handling) -> RequestId {
        self.next_id += 1;
        let id = RequestId(self.next_id);
        self.waiting.push_back(Request::new(id, prompt, params, handling, self.stats.steps));
        id
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn running_index(&self, id: RequestId) -> usize {
        self.running.iter().position(|r| r.id == id).expect("planned requests are running")
    }

    /// The running request `id`, if it still runs: a step planned ahead may carry rows of
    /// requests that ended when the step before it committed (or were aborted meanwhile).
    fn still_running(&self, id: RequestId) -> Option<usize> {
        self.running.iter().position(|r| r.id == id)
    }

    /// Picks the waiting request to admit next: an over-age one if any (oldest first), else the
    /// longest cached prefix (ties: the oldest), or plain FIFO when cache-awareness is off.
    fn pick(&self, kv: &KvCache, deferred: &[RequestId]) -> Option<usize> {
        if self.waiting.is_empty() {
            return None;
        }
        let step = self.stats.steps;
        if !self.config.cache_aware {
            return Some(0);
        }
        if let Some((i, _)) = self.waiting.iter().enumerate().filter(|(_, r)| self.over_age(r, step)).min_by_key(|(_, r)| r.enqueued_step) {
            return Some(i);
        }
        self.waiting
            .iter()
            .enumerate()
            .filter(|(_, r)| !deferred.contains(&r.id))
            .max_by_key(|(i, r)| (kv.peek_prefix(&r.cache_probe()), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    }

    fn over_age(&self, r: &Request, step: u64) -> bool {
        step.saturating_sub(r.enqueued_step) >= self.config.age_limit
    }

    /// Full blocks of `tokens` that a running request still reading its prompt will have
    /// computed (and published to the prefix cache, see [`KvCache::publish`]) once its prefill
    /// ends: the longest block-aligned common prefix with its context.
    fn shared_with_prefilling(&self, tokens: &[u32], block_size: u32) -> u32 {
        let bs = block_size as usize;
        self.running
            .iter()
            .filter(|r| r.in_prefill())
            .map(|r| {
                let common = tokens.iter().zip(r.context(tokens.len())).take_while(|(a, b)| a == b).count();
                (common / bs * bs) as u32
            })
            .max()
            .unwrap_or(0)
    }

    /// Admits waiting requests into free running slots while the pool can hold their uncached
    /// context. Returns an [`Event::Admitted`] per first admission, and ends with an error (an
    /// [`Event::Finished`]) the requests that can never run: their context exceeds the whole
    /// pool or the sequence limit.
    ///
    /// With `cache_aware`, a request whose prompt shares at least one more full block with a
    /// running request still in prefill than the prefix cache holds now waits until that
    /// prefill has published its blocks: admitted now, it would compute the same K/V again, and
    /// it could not start its own prefill earlier anyway (one prefill chunk per step, oldest
    /// first). Over-age requests are never held back.
    pub fn admit(&mut self, kv: &mut KvCache) -> Vec<Event> {
        let mut events = Vec::new();
        let mut deferred: Vec<RequestId> = Vec::new();
        while (self.running.len() as u32) < self.config.max_batch {
            let Some(i) = self.pick(kv, &deferred) else { break };
            match self.try_admit(kv, i) {
                Admission::Admitted(event) => events.extend(event),
                Admission::Deferred => deferred.push(self.waiting[i].id),
                Admission::Wait => break,
                Admission::Rejected(err) => {
                    let r = self.waiting.remove(i).expect("picked index");
                    self.stats.failed += 1;
                    events.push(Event::Finished { id: r.id, result: Err(err) });
                }
            }
        }
        events
    }

    /// Tries to admit waiting request `i` (see [`Scheduler::admit`]).
    fn try_admit(&mut self, kv: &mut KvCache, i: usize) -> Admission {
        let r = &self.waiting[i];
        let ctx_len = r.context_len();
        let probe = r.cache_probe();
        let hit = kv.peek_prefix(&probe);
        let bs = kv.block_size();
        if self.config.cache_aware
            && kv.prefix_cache_enabled()
            && !self.over_age(r, self.stats.steps)
            && self.shared_with_prefilling(&probe, bs) >= hit / bs * bs + bs
        {
            return Admission::Deferred;
        }
        let need_blocks = (ctx_len + 1).div_ceil(bs);
        if ctx_len + 1 > kv.max_seq_len {
            return Admission::Rejected(EngineError::ContextOverflow { prompt: ctx_len as usize + 1, limit: kv.max_seq_len as usize });
        }
        let stats = kv.stats();
        if need_blocks > stats.blocks_total {
            // More than the whole pool: no amount of waiting makes room.
            let free = stats.blocks_free + stats.blocks_cached;
            return Admission::Rejected(KvError::PoolExhausted { needed: need_blocks, free, total: stats.blocks_total }.into());
        }
        // Room for the uncached part now (free blocks plus what the prefix cache could give up);
        // otherwise wait for running sequences to finish.
        let fresh = need_blocks.saturating_sub(hit / bs);
        if fresh > stats.blocks_free + stats.blocks_cached && !self.running.is_empty() {
            return Admission::Wait;
        }
        let context: Vec<u32> = r.context(ctx_len as usize).copied().collect();
        let (seq, hit) = match kv.allocate_for_prompt(&context) {
            Ok(x) => x,
            Err(KvError::TooManySequences(_)) | Err(KvError::PoolExhausted { .. }) if !self.running.is_empty() => return Admission::Wait,
            Err(e) => return Admission::Rejected(EngineError::Kv(e)),
        };
        let mut r = self.waiting.remove(i).expect("picked index");
        let event = r.admitted(seq, hit, self.stats.steps);
        self.running.push(r);
        Admission::Admitted(event)
    }

    /// Plans the rows of the next step (nothing is reserved yet). With `drafts`, a decoding
    /// request that drafts ([`Request::draft`]) gets its draft's rows after its next token's, each
    /// a logit row, within the step's rows (one is kept for a prefill chunk) and `max_len`.
    fn plan(&mut self, max_len: u32, drafts: bool) -> Plan {
        let mut plan = Plan::default();
        let decoding: Vec<usize> = (0..self.running.len())
            .filter(|&i| !self.running[i].in_prefill() && self.running[i].pending().is_some() && self.running[i].seq.is_some())
            .collect();
        let prefilling = self.running.iter().any(|r| r.in_prefill());
        let rows = decoding.len() as u32;
        let mut spare = self.config.step_tokens.saturating_sub(rows + prefilling as u32).min(self.config.max_verify_rows().saturating_sub(rows));
        for i in decoding {
            let r = &mut self.running[i];
            let (Some(token), Some(seq)) = (r.pending(), r.seq) else { continue };
            let room = max_len.saturating_sub(r.computed + 1);
            let ask = drafts && spare > 0 && room > 0 && r.drafting();
            let (draft, masks) = if ask { r.draft(spare.min(room)) } else { (Vec::new(), Vec::new()) };
            spare -= draft.len() as u32;
            let first = plan.decode.len() as u32;
            // Row i (after the draft's first i tokens) chooses under the mask after them.
            plan.masks.extend(masks.into_iter().enumerate().map(|(i, m)| (first + 1 + i as u32, m)));
            plan.decode_rows(r, (seq, Some(token), r.computed), &draft, ask);
        }
        let budget = self.config.step_tokens.saturating_sub(plan.rows.len() as u32).clamp(1, self.max_chunk);
        // The oldest admitted sequence still reading its context gets the chunk.
        if let Some(r) = self.running.iter().filter(|r| r.in_prefill()).min_by_key(|r| (r.admitted_step, r.id)) {
            let end = r.context_len();
            let n = (end - r.computed).min(budget);
            let seq = r.seq.expect("running requests have a sequence");
            let first = plan.rows.len();
            for p in r.computed..r.computed + n {
                plan.rows.push(Row { seq, token: Some(r.token_at(p)), position: p });
            }
            // After a preemption a request may hold a pending token (sampled and streamed, not
            // yet fed): its next decode row feeds it, so the prefill that rebuilds its context
            // must not predict a token again.
            let completes = r.computed + n == end && r.pending().is_none();
            if completes {
                plan.sampling.push(r.row_sampling(end, true));
            }
            plan.prefill = Some(Chunk { id: r.id, first, rows: n, completes });
        }
        plan
    }

    /// Plans the next step and makes sure every row has a KV slot: when the pool cannot hold
    /// them, preempts the most recently admitted sequences; a lone sequence that still cannot
    /// grow ends with the error, and a sequence at the context limit ends with what it has
    /// (both reported in `events`). An empty plan means there is nothing to run.
    pub fn reserve(&mut self, kv: &mut KvCache, events: &mut Vec<Event>) -> Result<Plan, EngineError> {
        // Each request's drafter decides whether it drafts ([`Request::draft`]).
        let mut drafts = true;
        loop {
            let plan = self.plan(kv.max_seq_len, drafts);
            let bs = kv.block_size();
            let mut last: HashMap<SeqId, (RequestId, u32)> = HashMap::new();
            for id in plan.requests() {
                let r = &self.running[self.running_index(id)];
                let seq = r.seq.expect("running requests have a sequence");
                let end = plan.rows.iter().filter(|row| row.seq == seq).map(|row| row.position + 1).max().unwrap_or(0);
                last.insert(seq, (id, end));
            }
            if let Some((_, &(id, _))) = last.iter().find(|(_, &(_, len))| len > kv.max_seq_len) {
                // The sequence reached the context limit: it ends with what it has.
                self.finish_running(kv, id, Ok(FinishReason::Length), events)?;
                continue;
            }
            let mut need = 0u32;
            for (&seq, &(_, len)) in &last {
                need += len.div_ceil(bs).saturating_sub(kv.blocks(seq)?.len() as u32);
            }
            let stats = kv.stats();
            if need <= stats.blocks_free + stats.blocks_cached || kv.layout == KvLayout::Contiguous {
                for (&seq, &(id, len)) in &last {
                    let have = kv.len(seq)?;
                    if len > have {
                        if let Err(e) = kv.append(seq, len - have) {
                            self.finish_running(kv, id, Err(e.into()), events)?;
                            return Ok(Plan::default());
                        }
                    }
                }
                if !plan.rows.is_empty() {
                    self.stats.steps += 1;
                }
                plan.note_planned(&mut self.running);
                return Ok(plan);
            }
            if plan.drafts() {
                // Short of blocks: the drafts go before any sequence is preempted.
                drafts = false;
                continue;
            }
            // Keep the oldest admitted sequence; preempt the newest.
            let keep = self.running.iter().min_by_key(|r| (r.admitted_step, r.id)).map(|r| r.id).expect("rows imply running");
            if !self.preempt_one(kv, keep)? {
                let err = KvError::PoolExhausted { needed: need, free: stats.blocks_free + stats.blocks_cached, total: stats.blocks_total };
                self.finish_running(kv, keep, Err(err.into()), events)?;
            }
        }
    }

    /// The token masks of `plan`'s constrained logit rows whose requests still run, as (logit row,
    /// mask) from each request's matcher as it stands: called when the step's tokens are chosen
    /// (for a step planned ahead, after the step before has committed). A row whose request
    /// ended has none (its token is discarded).
    pub fn masks<'a>(&'a self, plan: &'a Plan) -> Vec<(u32, &'a [u32])> {
        let masked = plan.logit_requests().zip(&plan.sampling).enumerate().filter(|(_, (_, s))| s.as_ref().is_some_and(|s| s.constrained));
        masked
            .filter_map(|(k, (id, _))| {
                let r = &self.running[self.still_running(id)?];
                match plan.masks.iter().find(|(row, _)| *row == k as u32) {
                    Some((_, mask)) => Some((k as u32, mask.as_slice())),
                    None => Some((k as u32, r.mask()?)),
                }
            })
            .collect()
    }

    /// Plans the step after the one in flight, before that one's tokens are known: the next row
    /// of every running sequence, each fed on the GPU with the token the step in flight produces
    /// for it ([`Row::token`] `None`). The engine asks only with exactly one step in flight;
    /// the plan comes only in steady decoding: no request waits for a free place in the batch, no sequence is reading its context, and
    /// the pool holds the new rows without preempting; otherwise `None`, and the engine commits
    /// the step in flight and plans as usual. A constrained sequence's row is planned too, but
    /// its mask needs the token in flight ([`Plan::awaits_masks`]): the engine submits such a
    /// step's forward pass at once and chooses its tokens after the step before commits, so
    /// the GPU runs the forward pass while the CPU reads the token and computes the mask.
    ///
    /// A sequence whose rows in flight verify a draft gets its row after them, as if the draft
    /// is taken whole, and a draft of its own after that ([`Request::draft_ahead`]): when the
    /// draft in flight is cut, those rows start past what the sequence took and are discarded
    /// when they commit ([`Scheduler::commit_decode`]), and the step planned after that one
    /// gives the sequence its row where it stands, with the token it took (known by then). A
    /// sequence that may draft under a constraint or a penalty plans no step ahead.
    ///
    /// A sequence whose step in flight may reach its token or context limit gets no row (it
    /// ends when that step commits); one that ends otherwise (end of generation, a stop string,
    /// an abort) has its extra rows undone when it ends (its sequence is cut back to what was
    /// committed, [`Scheduler::finish_running`]), so what it returns and what the prefix cache
    /// keeps are as without lookahead.
    pub fn plan_ahead(&mut self, kv: &mut KvCache) -> Result<Option<Plan>, EngineError> {
        let could_admit = !self.waiting.is_empty() && self.running.len() < self.config.max_batch as usize;
        if !self.config.lookahead || could_admit {
            return Ok(None);
        }
        if self.running.iter().any(|r| r.in_prefill() || r.pending().is_none() || (r.drafting() && !r.drafts_ahead())) {
            return Ok(None);
        }
        let bs = kv.block_size();
        let max_len = kv.max_seq_len;
        let mut plan = Plan::default();
        let rows = self.running.len() as u32;
        let mut spare = self.config.step_tokens.saturating_sub(rows).min(self.config.max_verify_rows().saturating_sub(rows));
        let mut need = 0u32;
        for r in &mut self.running {
            let seq = r.seq.expect("running requests have a sequence");
            let len = kv.len(seq)?;
            // After its rows in flight, fed the token they end with; or, when those rows will be
            // discarded (or it has none), where it stands, with the token it took.
            let (token, flight) = match r.in_flight() {
                Some(flight) if len > r.computed => {
                    if r.ends_within(len - r.computed, max_len) {
                        continue;
                    }
                    if !flight.is_empty() && !r.confident() {
                        self.stats.drafts_held += 1;
                        continue;
                    }
                    (None, flight.to_vec())
                }
                _ if len == r.computed => (r.pending(), Vec::new()),
                _ => return Ok(None),
            };
            if len >= max_len {
                continue;
            }
            let room = max_len.saturating_sub(len + 1);
            let ask = spare > 0 && room > 0 && r.drafting();
            let draft = match (ask, token) {
                (false, _) => Vec::new(),
                (true, None) => r.draft_ahead(&flight, spare.min(room)),
                (true, Some(_)) => r.draft(spare.min(room)).0,
            };
            spare -= draft.len() as u32;
            need += (len + 1 + draft.len() as u32).div_ceil(bs).saturating_sub(kv.blocks(seq)?.len() as u32);
            plan.decode_rows(r, (seq, token, len), &draft, ask);
        }
        let stats = kv.stats();
        if plan.rows.is_empty() || (need > stats.blocks_free + stats.blocks_cached && kv.layout != KvLayout::Contiguous) {
            return Ok(None);
        }
        // Each sequence's rows start at its length: one append for them all.
        let mut grown: Vec<(SeqId, u32)> = Vec::new();
        for row in &plan.rows {
            match grown.last_mut() {
                Some((seq, n)) if *seq == row.seq => *n += 1,
                _ => grown.push((row.seq, 1)),
            }
        }
        for (i, &(seq, n)) in grown.iter().enumerate() {
            if kv.append(seq, n).is_err() {
                // Short of blocks after all (a windowed group): undo and plan as usual.
                for &(done, m) in &grown[..i] {
                    let len = kv.len(done)?;
                    kv.truncate(done, len - m)?;
                }
                return Ok(None);
            }
        }
        plan.note_planned(&mut self.running);
        self.stats.steps += 1;
        self.stats.steps_ahead += 1;
        Ok(Some(plan))
    }

    /// Preempts the most recently admitted running request other than `keep`: its computed K/V
    /// go to the prefix cache, its sequence is freed, and it returns to the front of the queue.
    /// Returns false when there is nothing else to preempt.
    fn preempt_one(&mut self, kv: &mut KvCache, keep: RequestId) -> Result<bool, EngineError> {
        let Some(i) = self.running.iter().enumerate().filter(|(_, r)| r.id != keep).max_by_key(|(_, r)| (r.admitted_step, r.id)).map(|(i, _)| i) else {
            return Ok(false);
        };
        let mut r = self.running.remove(i);
        let seq = r.seq.expect("running requests have a sequence");
        kv.finish(seq, &r.tokens())?;
        r.preempted(self.stats.steps);
        self.stats.preemptions += 1;
        self.waiting.push_front(r);
        Ok(true)
    }

    /// Takes a run step's outputs (one per [`Plan::logit_rows`] entry, in order): the rows'
    /// K/V are now computed, a prefill chunk's full blocks are published to the prefix cache
    /// (requests arriving while this one runs can share them from now on), and every request
    /// that got logits handles its next token. A drafting request takes its tokens one after
    /// the other while each equals the draft token its row fed ([`Scheduler::commit_decode`]).
    /// Returns the tokens and finished requests.
    pub fn commit(&mut self, kv: &mut KvCache, plan: &Plan, outputs: Vec<(u32, Option<Vec<f32>>)>, eos: &[u32]) -> Result<Vec<Event>, EngineError> {
        let completes = plan.prefill.is_some_and(|c| c.completes);
        if outputs.len() != plan.decode.len() + completes as usize {
            return Err(EngineError::InvalidArgument(format!(
                "a step of {} logit rows gave {} outputs",
                plan.decode.len() + completes as usize,
                outputs.len()
            )));
        }
        let tokens: Vec<u32> = outputs.into_iter().map(|(t, _)| t).collect();
        let mut events = Vec::new();
        let mut done = Vec::new();
        let mut first = 0;
        while first < plan.decode.len() {
            let id = plan.decode[first];
            let n = plan.decode[first..].iter().take_while(|&&d| d == id).count();
            if let Some(i) = self.still_running(id) {
                let asked = plan.asked.contains(&id);
                self.commit_decode(kv, (i, &plan.rows[first..first + n], asked), &tokens[first..first + n], eos, (&mut events, &mut done))?;
            }
            first += n;
        }
        if let Some(c) = plan.prefill {
            let i = self.running_index(c.id);
            let r = &mut self.running[i];
            r.computed_rows(c.rows, true, c.completes);
            kv.publish(r.seq.expect("running requests have a sequence"), &r.tokens())?;
            if c.completes {
                let accepted = r.accept(tokens[plan.decode.len()], eos, kv.max_seq_len);
                Self::took(c.id, accepted, (&mut events, &mut done));
            }
        }
        for (id, result) in done {
            self.finish_running(kv, id, result, &mut events)?;
        }
        Ok(events)
    }

    /// One request's decode rows of a step (its next token's, then its draft's) and the tokens
    /// chosen at them: row j's token is taken, and row j + 1's computed, while row j + 1 fed that
    /// very token (its draft token was right) and the request goes on; the K/V of the rows past
    /// that are cut from its sequence, with any rows a step planned ahead put after them. Rows
    /// that do not start where the request stands were planned ahead past a draft that was cut
    /// ([`Scheduler::plan_ahead`]): their tokens are discarded (their K/V went with the cut).
    fn commit_decode(
        &mut self,
        kv: &mut KvCache,
        (i, rows, asked): (usize, &[Row], bool),
        tokens: &[u32],
        eos: &[u32],
        (events, done): Outcomes<'_>,
    ) -> Result<(), EngineError> {
        let r = &mut self.running[i];
        if rows[0].position != r.computed {
            return Ok(());
        }
        let id = r.id;
        let mut taken = 0u32;
        let mut ended = false;
        for (j, &token) in tokens.iter().enumerate() {
            r.computed_rows(1, false, false);
            let accepted = r.accept(token, eos, kv.max_seq_len);
            ended = accepted.finish.is_some() || accepted.failure.is_some();
            Self::took(id, accepted, (events, done));
            if ended || rows.get(j + 1).is_none_or(|next| next.token != Some(token)) {
                break;
            }
            taken += 1;
        }
        let drafted = rows.len() as u32 - 1;
        r.record_draft(drafted, taken, asked);
        // The rejected draft rows' K/V, and those of rows planned ahead behind them. (A request
        // that ended is cut back when it finishes.)
        let seq = r.seq.expect("running requests have a sequence");
        if !ended && taken < drafted && kv.len(seq)? > r.computed {
            kv.truncate(seq, r.computed)?;
        }
        Ok(())
    }

    /// Streams what a request did with a token and notes its end.
    fn took(id: RequestId, accepted: crate::request::Accepted, (events, done): Outcomes<'_>) {
        if let Some((token, text, reasoning)) = accepted.token {
            events.push(Event::Token { id, token, text, reasoning });
        }
        done.extend(accepted.finish.map(|reason| (id, Ok(reason))));
        done.extend(accepted.failure.map(|e| (id, Err(e))));
    }

    /// A step failed as a whole: every request in it ends with (a copy of) the error, and
    /// their K/V, which the step may have half written, are not cached.
    pub fn fail(&mut self, kv: &mut KvCache, plan: &Plan, err: &EngineError) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        for id in plan.requests() {
            if self.still_running(id).is_some() {
                self.finish_running(kv, id, Err(err.step_failure()), &mut events)?;
            }
        }
        Ok(events)
    }

    /// The device is lost: every running and waiting request ends with
    /// [`EngineError::DeviceLost`] carrying what it had generated, and nothing goes to the
    /// prefix cache (the K/V went with the device).
    pub fn lose_all(&mut self, kv: &mut KvCache, message: &str) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        let running = std::mem::take(&mut self.running).into_iter().map(|mut r| (r.seq.take(), r));
        let waiting = std::mem::take(&mut self.waiting).into_iter().map(|r| (None, r));
        for (seq, mut r) in running.chain(waiting).collect::<Vec<_>>() {
            if let Some(seq) = seq {
                kv.free(seq)?;
            }
            let id = r.id;
            let g = r.finish(FinishReason::Abort, Vec::new());
            self.stats.failed += 1;
            events.push(Event::Finished { id, result: Err(EngineError::DeviceLost { message: message.into(), tokens: g.tokens, text: g.text }) });
        }
        Ok(events)
    }

    /// Cuts `seq` back to the K/V its request has committed: a row planned ahead for it
    /// ([`Scheduler::plan_ahead`]) whose step has not committed is undone, its slot freed.
    fn undo_ahead(kv: &mut KvCache, seq: SeqId, r: &Request) -> Result<(), EngineError> {
        if kv.len(seq)? > r.computed {
            kv.truncate(seq, r.computed)?;
        }
        Ok(())
    }

    /// Ends running request `id` with `result`: finished, its computed K/V go to the prefix
    /// cache; failed, its K/V are not trusted and nothing goes to the cache.
    fn finish_running(
        &mut self,
        kv: &mut KvCache,
        id: RequestId,
        result: Result<FinishReason, EngineError>,
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        let mut r = self.running.remove(self.running_index(id));
        let seq = r.seq.take().expect("running requests have a sequence");
        Self::undo_ahead(kv, seq, &r)?;
        let result = match result {
            Ok(reason) => {
                let blocks = kv.blocks(seq)?.to_vec();
                kv.finish(seq, &r.tokens())?;
                self.stats.finished += 1;
                Ok(r.finish(reason, blocks))
            }
            Err(e) => {
                kv.free(seq)?;
                self.stats.failed += 1;
                Err(e)
            }
        };
        events.push(Event::Finished { id, result });
        Ok(())
    }

    /// Ends a request now, wherever it is: a running one's computed K/V go to the prefix cache
    /// and its blocks are released. Returns its generation so far (finish reason `abort`), or
    /// `None` for an unknown or already finished id.
    pub fn abort(&mut self, kv: &mut KvCache, id: RequestId) -> Result<Option<Generation>, EngineError> {
        let (mut r, blocks) = if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            (self.waiting.remove(i).expect("found above"), Vec::new())
        } else if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let mut r = self.running.remove(i);
            let seq = r.seq.take().expect("running requests have a sequence");
            Self::undo_ahead(kv, seq, &r)?;
            let blocks = kv.blocks(seq)?.to_vec();
            kv.finish(seq, &r.tokens())?;
            (r, blocks)
        } else {
            return Ok(None);
        };
        self.stats.aborted += 1;
        Ok(Some(r.finish(FinishReason::Abort, blocks)))
    }

    pub fn stats(&self, kv: &KvCache) -> SchedStats {
        let mut s = self.stats.clone();
        s.running = self.running.len() as u32;
        s.waiting = self.waiting.len() as u32;
        s.sequences = self
            .running
            .iter()
            .filter_map(|r| {
                let seq = r.seq?;
                Some(RunningInfo {
                    request: r.id,
                    seq: seq.0,
                    len: kv.len(seq).unwrap_or(0),
                    prefilling: r.in_prefill(),
                    blocks: kv.blocks(seq).map(|b| b.to_vec()).unwrap_or_default(),
                })
            })
            .collect();
        s
    }
}

/// What a commit gathers: the events so far, and the requests that end with it (and how).
type Outcomes<'a> = (&'a mut Vec<Event>, &'a mut Vec<(RequestId, Result<FinishReason, EngineError>)>);

/// What [`Scheduler::try_admit`] did with a waiting request.
enum Admission {
    /// Running now; the event of its first admission.
    Admitted(Option<Event>),
    /// Held back for a prefill in flight that computes its prefix.
    Deferred,
    /// No room now: admission stops for this step.
    Wait,
    /// It can never run.
    Rejected(EngineError),
}
