//! What the engine asks of a backend for one forward step, whichever backend runs it: the rows
//! (a token at an absolute position of a sequence), which of them give logits, what is read back
//! and how the tokens are chosen.

use crate::sampler::RowParams;

/// What a step reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the argmax token of each logit row.
    Argmax,
    /// The argmax and the full logits of each logit row.
    Full,
}

/// One row of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    /// The token, or [`StepRow::FED`].
    pub token: u32,
    /// Absolute position in its sequence.
    pub position: u32,
    /// The sequence's row in the block-table buffer (`KvCache::table_base`).
    pub table_base: u32,
    /// The sequence's index (`SeqId.0`): its entry in the backend's feed of tokens and its
    /// sampler's penalty ring.
    pub slot: u32,
}

impl StepRow {
    /// The token is the one the sequence's last step with a logit row chose, kept by the backend
    /// (on the GPU, in its feed buffer): consecutive decode steps need no round trip through the
    /// caller.
    pub const FED: u32 = u32::MAX;
}

/// How a step chooses its logit rows' tokens.
#[derive(Clone, Copy, Debug)]
pub enum Choose<'a> {
    /// The argmax of every row (greedy without a penalty).
    Argmax,
    /// Sampled ([`crate::sampler`]: on the GPU by its sampling op, on the CPU by `sample_cpu`),
    /// one [`RowParams`] per logit row (penalty windows in the backend's rings of the rows'
    /// slots), and the token masks of its [`RowParams::MASKED`] rows: (logit row index,
    /// `ceil(vocab / 32)` words).
    Sample(&'a [RowParams], &'a [(u32, &'a [u32])]),
}

/// What one logit row of a step gives: its argmax and, with [`Logits::Full`], its logits.
pub type RowOutput = (u32, Option<Vec<f32>>);
