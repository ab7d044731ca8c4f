//! The CPU backend: the same forward graph as the WebGPU backend, executed by CPU kernels over
//! a KV cache in CPU memory ([`KvCache::new_host`]: the same blocks, block tables, prefix tree,
//! windows, INT8 format and snapshots), for browsers and machines without a usable GPU.
//!
//! [`HostRunner`] is the CPU twin of [`crate::model::Runner`]: it takes the engine's steps
//! ([`StepRow`]s, logit rows, how to choose) and gives back the same outputs. A step runs when
//! it is submitted (there is no device to run behind the CPU), so its outputs are ready at once;
//! tokens handed from step to step ([`StepRow::FED`]) and the sampler's penalty rings are kept
//! here as the GPU keeps them in its buffers, and sampling is the GPU sampler's CPU reference
//! ([`crate::sampler::sample_cpu`]), so a seeded request draws the same tokens on
//! either backend from the same logits.

pub mod forward;
pub mod kernels;
pub mod qdot;

use crate::sampler::{sample_cpu, SampleShape};
use crate::kv::{KvCache, SeqId};
use crate::model::{Choose, Logits, ModelError, RowOutput, StepRow};
use crate::sampler::MAX_REPETITION_WINDOW;

pub use forward::{forward, HostModel, HostRow};

/// Runs rows through a [`HostModel`]; holds what steps hand to each other.
pub struct HostRunner {
    /// Most rows of one prefill pass outside the scheduler.
    prefill_chunk: u32,
    /// Per sequence slot, the token its last step with a logit row chose ([`StepRow::FED`]).
    feed: Vec<u32>,
    /// Per slot, a ring of [`MAX_REPETITION_WINDOW`] tokens: the sampler's penalty windows.
    history: Vec<u32>,
    /// The step whose forward pass ran and whose tokens are not chosen yet
    /// ([`HostRunner::submit_forward`]): its rows, logit rows and logits.
    open: Option<(Vec<StepRow>, Vec<u32>, Vec<f32>)>,
}

impl HostRunner {
    /// `max_seqs`: the KV cache's sequence slots.
    pub fn new(prefill_chunk: u32, max_seqs: u32) -> Result<HostRunner, ModelError> {
        if prefill_chunk == 0 {
            return Err(ModelError::Format("prefill_chunk must be at least 1".into()));
        }
        Ok(HostRunner {
            prefill_chunk,
            feed: vec![0; max_seqs as usize],
            history: vec![0; max_seqs as usize * MAX_REPETITION_WINDOW as usize],
            open: None,
        })
    }

    /// Bytes the runner holds between steps (the feed and the penalty rings; a step's
    /// activations are allocated while it runs).
    pub fn bytes(&self) -> u64 {
        (self.feed.len() + self.history.len()) as u64 * 4
    }

    /// Runs one step over `rows` (their K/V slots appended) and returns one output per entry of
    /// `logit_rows`, in order, its tokens chosen as `choose` says.
    pub fn submit(&mut self, model: &HostModel, kv: &KvCache, (rows, logit_rows): (&[StepRow], &[u32]), (read, choose): (Logits, Choose<'_>)) -> Result<Vec<RowOutput>, ModelError> {
        self.submit_forward(model, kv, (rows, logit_rows))?;
        self.submit_choice((read, choose))
    }

    /// The forward pass of a step; [`HostRunner::submit_choice`] chooses its tokens.
    pub fn submit_forward(&mut self, model: &HostModel, kv: &KvCache, (rows, logit_rows): (&[StepRow], &[u32])) -> Result<(), ModelError> {
        if rows.is_empty() {
            return Err(ModelError::Format("a step needs at least one row".into()));
        }
        if self.open.is_some() {
            return Err(ModelError::Format("a step was submitted while another waits for its choice".into()));
        }
        let host_rows = rows
            .iter()
            .map(|r| {
                let token = if r.token == StepRow::FED { *self.feed.get(r.slot as usize).ok_or_else(|| ModelError::Format(format!("sequence slot {}", r.slot)))? } else { r.token };
                Ok(HostRow { token, position: r.position, seq: SeqId(r.slot) })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let logits = forward(model, kv, &host_rows, logit_rows)?;
        self.open = Some((rows.to_vec(), logit_rows.to_vec(), logits));
        Ok(())
    }

    /// Chooses the tokens of the step [`HostRunner::submit_forward`] ran: the argmax, or sampled
    /// with each row's parameters and penalty ring (and masked), as the GPU's sampler does.
    pub fn submit_choice(&mut self, (read, choose): (Logits, Choose<'_>)) -> Result<Vec<RowOutput>, ModelError> {
        let (rows, logit_rows, logits) = self.open.take().ok_or_else(|| ModelError::Format("no step's forward pass waits for its choice".into()))?;
        let m = logit_rows.len();
        let vocab = if m == 0 { 0 } else { logits.len() / m };
        let kept = (read == Logits::Full).then(|| logits.clone());
        let tokens: Vec<u32> = match choose {
            Choose::Argmax => logits.chunks(vocab.max(1)).take(m).map(crate::sampler::argmax).collect(),
            Choose::Sample(params, masks) => {
                if params.len() != m {
                    return Err(ModelError::Format(format!("{} sampler rows for {m} logit rows", params.len())));
                }
                let words = vocab.div_ceil(32);
                let mut mask = vec![u32::MAX; m * words];
                for &(row, bits) in masks {
                    let at = row as usize * words;
                    mask.get_mut(at..at + words).ok_or_else(|| ModelError::Format(format!("a mask for logit row {row} of {m}")))?.copy_from_slice(bits.get(..words).ok_or_else(|| ModelError::Format("a short token mask".into()))?);
                }
                let shape = SampleShape { n_rows: m as u32, vocab: vocab as u32, history_capacity: MAX_REPETITION_WINDOW, n_rings: self.feed.len() as u32, out_offset: 0, out_stride: 1 };
                let mut logits = logits;
                sample_cpu(&mut logits, params, &mut self.history, &mask, &shape).into_iter().map(|t| t.unwrap_or(0)).collect()
            }
        };
        for (&r, &t) in logit_rows.iter().zip(&tokens) {
            if let Some(slot) = self.feed.get_mut(rows[r as usize].slot as usize) {
                *slot = t;
            }
        }
        Ok(tokens.into_iter().enumerate().map(|(i, t)| (t, kept.as_ref().map(|l| l[i * vocab..(i + 1) * vocab].to_vec()))).collect())
    }

    /// Writes `tokens` (oldest first) as the penalty ring of slot `slot`, from its start.
    pub fn write_history(&mut self, slot: u32, tokens: &[u32]) -> Result<(), ModelError> {
        let cap = MAX_REPETITION_WINDOW as usize;
        if tokens.len() > cap || slot as usize >= self.feed.len() {
            return Err(ModelError::Format(format!("a penalty ring of {} tokens for slot {slot}", tokens.len())));
        }
        self.history[slot as usize * cap..slot as usize * cap + tokens.len()].copy_from_slice(tokens);
        Ok(())
    }

    /// Host-clock times of the forward passes over `rows` (consecutive positions of one sequence,
    /// K/V slots appended) in chunks of the prefill chunk, one entry per pass; the K/V they
    /// write are the values already there.
    pub fn time_kernels(&mut self, model: &HostModel, kv: &KvCache, rows: &[StepRow]) -> Result<Vec<(&'static str, f64)>, ModelError> {
        let mut times = Vec::new();
        for piece in rows.chunks(self.prefill_chunk as usize) {
            let t0 = crate::time::now_ms();
            let host_rows: Vec<HostRow> = piece.iter().map(|r| HostRow { token: r.token, position: r.position, seq: SeqId(r.slot) }).collect();
            forward(model, kv, &host_rows, &[piece.len() as u32 - 1])?;
            times.push(("cpu.forward", crate::time::now_ms() - t0));
        }
        Ok(times)
    }

    /// Most rows of one prefill pass outside the scheduler.
    pub fn prefill_chunk(&self) -> u32 {
        self.prefill_chunk
    }
}
