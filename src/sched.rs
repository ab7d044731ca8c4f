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
//! Requests leave after any step (stop, length, abort or an error) and waiting ones take their
//! place in the next. Nothing here touches the GPU: the engine runs the planned rows
//! ([`crate::engine::Engine::step`]).

use std::collections::VecDeque;

use crate::error::EngineError;
use crate::kv::{KvCache, KvError, SeqId};
use crate::request::{Event, Request, RequestId};

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
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig { max_batch: 8, step_tokens: 256, cache_aware: true, age_limit: 64 }
    }
}

/// One row of a step: a token at a position of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub seq: SeqId,
    pub token: u32,
    pub position: u32,
}

/// The rows of one step: decode rows first (one per decoding request), then at most one prefill
/// chunk.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub rows: Vec<Row>,
    /// For each decode row, the request's index in `running`.
    pub decode: Vec<usize>,
    /// The prefill chunk: (index in `running`, first row, rows, whether it ends the context so
    /// that its last row's logits give the next token: not when a token is already pending).
    pub prefill: Option<(usize, usize, u32, bool)>,
}

/// Scheduler counters and the running set's block tables.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SchedStats {
    pub running: u32,
    pub waiting: u32,
    pub steps: u64,
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
    pub config: SchedConfig,
    pub waiting: VecDeque<Request>,
    pub running: Vec<Request>,
    pub stats: SchedStats,
    next_id: u64,
}

impl Scheduler {
    pub fn new(config: SchedConfig) -> Scheduler {
        Scheduler { config, waiting: VecDeque::new(), running: Vec::new(), stats: SchedStats::default(), next_id: 0 }
    }

    pub fn next_id(&mut self) -> RequestId {
        self.next_id += 1;
        RequestId(self.next_id)
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
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
        if let Some((i, _)) = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, r)| self.over_age(r, step))
            .min_by_key(|(_, r)| r.enqueued_step)
        {
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
                let theirs = r.prompt.iter().chain(&r.generated).take(r.context_len() as usize);
                let common = tokens.iter().zip(theirs).take_while(|(a, b)| a == b).count();
                (common / bs * bs) as u32
            })
            .max()
            .unwrap_or(0)
    }

    /// Admits waiting requests into free running slots while the pool can hold their uncached
    /// context. Returns requests that can never run (their context exceeds the whole pool or
    /// the sequence limit), to be finished with an error.
    ///
    /// With `cache_aware`, a request whose prompt shares at least one more full block with a
    /// running request still in prefill than the prefix cache holds now waits until that
    /// prefill has published its blocks: admitted now, it would compute the same K/V again, and
    /// it could not start its own prefill earlier anyway (one prefill chunk per step, oldest
    /// first). Over-age requests are never held back.
    pub fn admit(&mut self, ctx: &crate::gpu::Context, kv: &mut KvCache) -> Vec<Event> {
        let mut rejected: Vec<(Request, EngineError)> = Vec::new();
        let mut events = Vec::new();
        let mut deferred: Vec<RequestId> = Vec::new();
        while (self.running.len() as u32) < self.config.max_batch {
            let Some(i) = self.pick(kv, &deferred) else { break };
            let tokens = self.waiting[i].tokens();
            let ctx_len = self.waiting[i].context_len() as usize;
            let probe = self.waiting[i].cache_probe();
            let hit = kv.peek_prefix(&probe);
            if self.config.cache_aware && kv.prefix_cache_enabled() && !self.over_age(&self.waiting[i], self.stats.steps) {
                let bs = kv.block_size();
                if self.shared_with_prefilling(&probe, bs) >= hit / bs * bs + bs {
                    deferred.push(self.waiting[i].id);
                    continue;
                }
            }
            let need_blocks = (ctx_len as u32 + 1).div_ceil(kv.block_size());
            if ctx_len as u32 + 1 > kv.max_seq_len || need_blocks > kv.pool.n_blocks {
                let r = self.waiting.remove(i).expect("picked index");
                let err = EngineError::ContextOverflow { prompt: ctx_len + 1, limit: kv.max_seq_len.min(kv.pool.n_blocks * kv.block_size()) as usize };
                rejected.push((r, err));
                continue;
            }
            // Room for the uncached part now (free blocks plus what the prefix cache could give
            // up); otherwise wait for running sequences to finish.
            let fresh = need_blocks.saturating_sub(hit / kv.block_size());
            let stats = kv.stats();
            if fresh > stats.blocks_free + stats.blocks_cached && !self.running.is_empty() {
                break;
            }
            let (seq, hit) = match kv.allocate_for_prompt(ctx, &tokens[..ctx_len]) {
                Ok(x) => x,
                Err(KvError::TooManySequences(_)) | Err(KvError::PoolExhausted { .. }) if !self.running.is_empty() => break,
                Err(e) => {
                    let r = self.waiting.remove(i).expect("picked index");
                    rejected.push((r, EngineError::Kv(e)));
                    continue;
                }
            };
            let mut r = self.waiting.remove(i).expect("picked index");
            r.seq = Some(seq);
            r.computed = hit;
            if r.first_hit.is_none() {
                events.push(Event::Admitted { id: r.id, prompt_tokens: r.prompt.len() as u32, prefix_hit_tokens: hit });
            }
            r.first_hit.get_or_insert(hit);
            r.admitted_step = self.stats.steps;
            self.running.push(r);
        }
        for (r, err) in rejected {
            self.stats.failed += 1;
            events.push(Event::Finished { id: r.id, result: Err(err) });
        }
        events
    }

    /// Plans the rows of the next step (nothing is reserved yet).
    pub fn plan(&self) -> Plan {
        let mut plan = Plan::default();
        for (i, r) in self.running.iter().enumerate() {
            if !r.in_prefill() {
                if let (Some(token), Some(seq)) = (r.pending, r.seq) {
                    plan.rows.push(Row { seq, token, position: r.computed });
                    plan.decode.push(i);
                }
            }
        }
        let budget = self.config.step_tokens.saturating_sub(plan.rows.len() as u32).max(1);
        // The oldest admitted sequence still reading its context gets the chunk.
        if let Some((i, r)) = self.running.iter().enumerate().filter(|(_, r)| r.in_prefill()).min_by_key(|(_, r)| (r.admitted_step, r.id)) {
            let tokens = r.tokens();
            let end = r.context_len();
            let n = (end - r.computed).min(budget);
            let seq = r.seq.expect("running requests have a sequence");
            let first = plan.rows.len();
            for p in r.computed..r.computed + n {
                plan.rows.push(Row { seq, token: tokens[p as usize], position: p });
            }
            // After a preemption a request may hold a pending token (sampled and streamed, not
            // yet fed): its next decode row feeds it, so the prefill that rebuilds its context
            // must not predict a token again.
            plan.prefill = Some((i, first, n, r.computed + n == end && r.pending.is_none()));
        }
        plan
    }

    /// Preempts the most recently admitted running request other than `keep`: its computed K/V
    /// go to the prefix cache, its sequence is freed, and it returns to the front of the queue.
    /// Returns false when there is nothing else to preempt.
    pub fn preempt_one(&mut self, kv: &mut KvCache, keep: RequestId) -> Result<bool, EngineError> {
        let Some(i) = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.id != keep)
            .max_by_key(|(_, r)| (r.admitted_step, r.id))
            .map(|(i, _)| i)
        else {
            return Ok(false);
        };
        let mut r = self.running.remove(i);
        let seq = r.seq.take().expect("running requests have a sequence");
        let tokens = r.tokens();
        kv.finish(seq, &tokens)?;
        r.computed = 0;
        r.preemptions += 1;
        r.enqueued_step = self.stats.steps;
        self.stats.preemptions += 1;
        self.waiting.push_front(r);
        Ok(true)
    }

    pub fn snapshot(&self, kv: &KvCache) -> SchedStats {
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

