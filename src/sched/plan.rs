//! A step's plan: its rows (decode rows with their drafts, then at most one prefill chunk),
//! which of them give logits and how each chooses its token.

use crate::kv::SeqId;
use crate::request::{Request, RequestId, RowSampling};

/// One row of a step: a token at a position of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub seq: SeqId,
    /// `None` in a step planned ahead: the token the step before produces for this sequence,
    /// which the GPU hands over itself.
    pub token: Option<u32>,
    pub position: u32,
}

/// A prefill chunk of a step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) id: RequestId,
    /// Its first row in the plan.
    pub(super) first: usize,
    pub(super) rows: u32,
    /// It ends the context, so that its last row's logits give the next token (not when a
    /// token is already pending: see [`Scheduler::plan`](super::Scheduler::plan)).
    pub(super) completes: bool,
}

/// The rows of one step: decode rows first (one per decoding request, followed by its draft's
/// rows when it drafts), then at most one prefill chunk.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub(super) rows: Vec<Row>,
    /// The request of each decode row, in row order (a drafting request's rows one after the
    /// other: its next token's, then its draft's).
    pub(super) decode: Vec<RequestId>,
    /// Draft rows in the step.
    pub(super) drafted: u32,
    /// The requests asked for a draft in this step (whether one matched or not).
    pub(super) asked: Vec<RequestId>,
    /// The masks of constrained draft rows (logit row, mask): the constraint's state after the
    /// draft tokens before the row ([`crate::constraint::Constrained::draft_masks`]).
    pub(super) masks: Vec<(u32, Vec<u32>)>,
    pub(super) prefill: Option<Chunk>,
    /// How each logit row chooses its token, in [`Plan::logit_rows`] order: `None` greedy (the
    /// argmax), else sampled on the GPU.
    pub(super) sampling: Vec<Option<RowSampling>>,
}

impl Plan {
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The rows whose logits the step reads, in the order [`Scheduler::commit`](super::Scheduler::commit) takes their
    /// outputs: every decode row, then the last row of a prefill chunk that ends its context.
    pub fn logit_rows(&self) -> Vec<u32> {
        let mut rows: Vec<u32> = (0..self.decode.len() as u32).collect();
        if let Some(c) = self.prefill.filter(|c| c.completes) {
            rows.push((c.first + c.rows as usize - 1) as u32);
        }
        rows
    }

    /// How each logit row chooses its token ([`Plan::logit_rows`] order); all `None` when
    /// every row is greedy.
    pub fn sampling(&self) -> &[Option<RowSampling>] {
        &self.sampling
    }

    /// Whether the step verifies drafts.
    pub fn drafts(&self) -> bool {
        self.drafted > 0
    }

    /// Adds request `r`'s decode rows: its next token (`None`: fed on the GPU by the step in
    /// flight) at `position` of `seq`, then `draft`'s tokens, each a logit row; `asked` when it
    /// was asked for a draft.
    pub(super) fn decode_rows(&mut self, r: &mut Request, (seq, token, position): (SeqId, Option<u32>, u32), draft: &[u32], asked: bool) {
        if asked {
            self.asked.push(r.id);
        }
        self.drafted += draft.len() as u32;
        self.rows.push(Row { seq, token, position });
        for (i, &d) in draft.iter().enumerate() {
            self.rows.push(Row { seq, token: Some(d), position: position + 1 + i as u32 });
        }
        self.decode.extend(std::iter::repeat_n(r.id, draft.len() + 1));
        if draft.is_empty() {
            // A row fed on the GPU continues the penalty ring there; one fed here writes it.
            self.sampling.push(r.row_sampling(position + 1, token.is_some()));
        } else {
            self.sampling.extend(r.draft_sampling(position, draft));
        }
    }

    /// Notes in each request of `running` with decode rows here where they start and the draft
    /// they verify ([`Request::planned`]): once the step is sure to run.
    pub(super) fn note_planned(&self, running: &mut [Request]) {
        let mut first = 0;
        while first < self.decode.len() {
            let id = self.decode[first];
            let n = self.decode[first..].iter().take_while(|&&d| d == id).count();
            if let Some(r) = running.iter_mut().find(|r| r.id == id) {
                let draft: Vec<u32> = self.rows[first + 1..first + n].iter().filter_map(|row| row.token).collect();
                r.planned(self.rows[first].position, &draft);
            }
            first += n;
        }
    }

    /// Whether a constrained row's mask comes from the token the step before produces: a step
    /// planned ahead whose tokens must not be chosen before that step commits.
    pub fn awaits_masks(&self) -> bool {
        self.rows.iter().any(|r| r.token.is_none()) && self.sampling.iter().flatten().any(|s| s.constrained)
    }

    /// The request of each logit row, in [`Plan::logit_rows`] order.
    pub(super) fn logit_requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.decode.iter().copied().chain(self.prefill.filter(|c| c.completes).map(|c| c.id))
    }

    /// The requests with rows in this step.
    pub(super) fn requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.decode.iter().copied().chain(self.prefill.map(|c| c.id))
    }
}
