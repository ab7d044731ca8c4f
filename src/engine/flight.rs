//! The steps the engine has submitted to its backend and not yet read back, and everything that
//! goes with them, in one owner: the queue of submitted steps (two while a decode step planned
//! ahead runs behind the one before), the step whose forward pass is submitted and whose tokens
//! wait for its constrained rows' masks, and where each sequence slot's penalty ring stands on
//! the backend. A step that cannot be submitted or read fails its requests through one path
//! ([`Flight::fail`]).

use std::collections::VecDeque;

use crate::backend::{Backend, Pending};
use crate::error::{EngineError, ErrorKind};
use crate::kv::KvCache;
use crate::model::{Choose, Logits, StepRow};
use crate::request::Event;
use crate::sampler::{HistoryRing, RowParams, SamplingParams, MAX_REPETITION_WINDOW};
use crate::sched::{Plan, Scheduler};

/// What launching or choosing a step works on.
pub(super) type Parts<'a> = (&'a mut dyn Backend, &'a mut KvCache, &'a mut Scheduler);

/// A step whose forward pass is submitted and whose tokens are not chosen yet.
struct Open {
    plan: Plan,
    rows: Vec<StepRow>,
    logit_rows: Vec<u32>,
    /// The sampler's parameters of its logit rows (`None`: all greedy).
    params: Option<Vec<RowParams>>,
}

pub(super) struct Flight {
    /// Steps whose outputs are not read yet, oldest first.
    queue: VecDeque<(Plan, Pending)>,
    open: Option<Open>,
    /// Where each sequence slot's penalty ring stands on the backend ([`Flight::row_params`]).
    rings: Vec<HistoryRing>,
}

impl Flight {
    /// Nothing in flight, for a KV cache of `max_seqs` sequence slots.
    pub fn new(max_seqs: u32) -> Flight {
        Flight { queue: VecDeque::new(), open: None, rings: vec![HistoryRing::default(); max_seqs as usize] }
    }

    /// Steps submitted whose outputs are not read yet.
    pub fn len(&self) -> usize {
        self.queue.len() + usize::from(self.open.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The oldest step in flight, to read.
    pub fn next(&mut self) -> Option<(Plan, Pending)> {
        self.queue.pop_front()
    }

    /// Forgets every step in flight (the device is lost: nothing will be read).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.open = None;
    }

    /// Forgets the steps in flight once no request is left to take their tokens (the last one
    /// ended or was aborted while a step planned ahead ran): nothing waits on them, and the
    /// backend finishes them before anything submitted later.
    pub fn drop_orphans(&mut self, sched: &Scheduler) {
        if sched.is_idle() {
            self.clear();
        }
    }

    /// A step failed as a whole (it could not be submitted, chosen or read): every request in
    /// it ends with the error, after `events`.
    pub fn fail((kv, sched): (&mut KvCache, &mut Scheduler), plan: &Plan, err: &EngineError, events: &mut Vec<Event>) -> Result<(), EngineError> {
        events.extend(sched.fail(kv, plan, err)?);
        Ok(())
    }

    /// Submits a planned step (its rows' K/V slots reserved) and queues it for reading; a step
    /// that cannot be submitted fails its requests. A step whose masks wait for the step in
    /// flight ([`Plan::awaits_masks`]) has only its forward pass submitted: it stays open for
    /// [`Flight::choose_open`].
    pub fn launch(&mut self, (backend, kv, sched): Parts<'_>, plan: Plan, events: &mut Vec<Event>) -> Result<(), EngineError> {
        if self.open.is_some() {
            // The open step's logits are the backend's until its tokens are chosen.
            let message = "a step was launched while another waits for its choice".into();
            return Err(EngineError::Step { kind: ErrorKind::Internal, message });
        }
        let rows: Vec<StepRow> = plan
            .rows()
            .iter()
            .map(|r| StepRow { token: r.token.unwrap_or(StepRow::FED), position: r.position, table_base: kv.table_base(r.seq), slot: r.seq.0 })
            .collect();
        let logit_rows = plan.logit_rows();
        let launched = self.row_params(backend, &plan, (&rows, &logit_rows)).and_then(|params| {
            if plan.awaits_masks() {
                backend.submit_forward(kv, (&rows, &logit_rows))?;
                return Ok(Launched::Open(params));
            }
            let masks = sched.masks(&plan);
            let choose = params.as_deref().map_or(Choose::Argmax, |p| Choose::Sample(p, &masks));
            backend.submit(kv, (&rows, &logit_rows), (Logits::Argmax, choose)).map(Launched::Submitted)
        });
        match launched {
            Ok(Launched::Open(params)) => self.open = Some(Open { plan, rows, logit_rows, params }),
            Ok(Launched::Submitted(pending)) => self.queue.push_back((plan, pending)),
            Err(e) => Flight::fail((kv, sched), &plan, &e, events)?,
        }
        Ok(())
    }

    /// Chooses the tokens of the open step, now that the step before has committed: each
    /// constrained row with its request's mask as it stands (a row whose request ended meanwhile
    /// is chosen unmasked and discarded), and queues it for reading. A step that cannot be
    /// chosen fails its requests.
    pub fn choose_open(&mut self, (backend, kv, sched): Parts<'_>, events: &mut Vec<Event>) -> Result<(), EngineError> {
        let Some(Open { plan, rows, logit_rows, mut params }) = self.open.take() else { return Ok(()) };
        let masks = sched.masks(&plan);
        for (k, p) in params.iter_mut().flatten().enumerate() {
            if !masks.iter().any(|&(m, _)| m as usize == k) {
                p.flags &= !RowParams::MASKED;
            }
        }
        let choose = params.as_deref().map_or(Choose::Argmax, |p| Choose::Sample(p, &masks));
        match backend.submit_choice(kv, (&rows, &logit_rows), (Logits::Argmax, choose)) {
            Ok(pending) => self.queue.push_back((plan, pending)),
            Err(e) => Flight::fail((kv, sched), &plan, &e, events)?,
        }
        Ok(())
    }

    /// The sampler's parameters of a step's logit rows, `None` when all are greedy. Writes the
    /// penalty windows the plan carries into their sequences' rings and keeps where each ring
    /// stands: a row appends its token at its ring's head on the backend, so the next step's
    /// ring is one longer without the engine knowing the token.
    fn row_params(&mut self, backend: &mut dyn Backend, plan: &Plan, (rows, logit_rows): (&[StepRow], &[u32])) -> Result<Option<Vec<RowParams>>, EngineError> {
        if plan.sampling().iter().all(Option::is_none) {
            return Ok(None);
        }
        let cap = MAX_REPETITION_WINDOW;
        let mut params = Vec::with_capacity(logit_rows.len());
        for (&r, sampling) in logit_rows.iter().zip(plan.sampling()) {
            let slot = rows[r as usize].slot;
            let counter = rows[r as usize].position + 1;
            let Some(s) = sampling else {
                params.push(RowParams::new(&SamplingParams::greedy(), counter, HistoryRing { head: 0, len: 0, ring: slot })?);
                continue;
            };
            let ring = &mut self.rings[slot as usize];
            if let Some(window) = &s.window {
                backend.write_history(slot, window)?;
                *ring = HistoryRing { head: window.len() as u32 % cap, len: window.len() as u32, ring: slot };
            }
            if let Some(hidden) = s.hidden {
                // A verification row: the ring holds the window and the draft; the row sees it
                // up to its own token and appends nothing (the next step writes its window).
                let view = HistoryRing { head: (ring.head + cap - hidden % cap) % cap, len: ring.len.saturating_sub(hidden), ring: slot };
                let mut row = RowParams::new(&s.params, s.counter, view)?;
                if s.constrained {
                    row.flags |= RowParams::MASKED;
                }
                params.push(row);
                continue;
            }
            let mut row = RowParams::new(&s.params, s.counter, *ring)?;
            row.flags |= RowParams::APPEND_HISTORY;
            if s.constrained {
                row.flags |= RowParams::MASKED;
            }
            params.push(row);
            *ring = HistoryRing { head: (ring.head + 1) % cap, len: (ring.len + 1).min(cap), ring: slot };
        }
        Ok(Some(params))
    }
}

/// What [`Flight::launch`] submitted: a whole step, or its forward pass alone.
enum Launched {
    Submitted(Pending),
    Open(Option<Vec<RowParams>>),
}
