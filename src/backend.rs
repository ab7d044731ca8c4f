//! The one interface both backends implement: the WebGPU backend (`src/webgpu/`: the forward
//! graphs on a GPU [`Context`]) and the CPU backend (`src/cpu/`: the same layer plan by CPU
//! kernels over a KV pool in CPU memory). The engine runs its steps, scores and snapshots through
//! a `Box<dyn Backend>` and never asks which one it holds, except for GPU-only reports
//! (profiles, device loss), which go through [`Backend::device`].
//!
//! A step is submitted and its outputs come back through a [`Pending`]: a GPU step is read later
//! (the engine keeps a step planned ahead on the GPU while it reads the one before), a CPU step
//! runs when it is submitted and its [`Pending`] is ready at once, so the engine's loop (steps
//! planned ahead, tokens handed over between steps, undone rows) is one loop for both.
//!
//! The one-sequence paths outside the scheduler (scoring, benchmarks, profiles, snapshots) are
//! written once here over any backend ([`prefill`], [`decode`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::EngineError;
use crate::gpu::Context;
use crate::kv::{CacheConfig, KvCache, KvShape, SeqId};
use crate::model::{Choose, Logits, ModelConfig, RowOutput, StepRow};

/// A future that stays on its thread (wasm has one; GPU readbacks are not `Send` there).
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A step's rows (their K/V slots appended to their sequences) and the indices of the rows
/// that give logits.
pub type StepRows<'a> = (&'a [StepRow], &'a [u32]);

/// What a step reads back and how it chooses its logit rows' tokens.
pub type Choice<'a> = (Logits, Choose<'a>);

/// A submitted step's outputs: one per logit row, in order, on their way back from the GPU or
/// ready.
pub struct Pending(LocalFuture<'static, Result<Vec<RowOutput>, EngineError>>);

impl Pending {
    /// Outputs computed already (the CPU backend).
    pub fn ready(outputs: Vec<RowOutput>) -> Pending {
        Pending(Box::pin(std::future::ready(Ok(outputs))))
    }

    /// Outputs `read` waits for (a GPU step's readback).
    pub fn later(read: impl Future<Output = Result<Vec<RowOutput>, EngineError>> + 'static) -> Pending {
        Pending(Box::pin(read))
    }

    /// Waits for the outputs.
    pub async fn read(self) -> Result<Vec<RowOutput>, EngineError> {
        self.0.await
    }
}

/// The largest steps a generation runs: a prefill chunk of `chunk_rows` rows and, when
/// `batch` sequences may run together, a batch step of `step_rows` rows with `batch` logit rows.
#[derive(Clone, Copy, Debug)]
pub struct LargestSteps {
    pub chunk_rows: u32,
    pub step_rows: u32,
    pub batch: u32,
}

/// A model loaded on one backend, with what runs rows through it: the forward passes, the
/// tokens steps hand to each other (the feed) and the sampler's penalty rings, one of each per
/// sequence slot of the KV cache.
pub trait Backend {
    /// `"webgpu"` or `"cpu"`.
    fn name(&self) -> &'static str;

    fn config(&self) -> &ModelConfig;

    /// The GPU context, for GPU-only reports (counters, timestamps, device loss); `None` for a
    /// backend without one (the CPU).
    fn device(&self) -> Option<&Arc<Context>> {
        None
    }

    /// The adapter the kernels run on ([`Context::adapter_name`]), or the CPU and its threads.
    fn adapter_name(&self) -> String;

    /// The kernel variants in use ([`Context::variant_name`]), or the CPU kernels'.
    fn variant_name(&self) -> String;

    /// Bytes of the weights (on the GPU, or in CPU memory).
    fn weights_bytes(&self) -> u64;

    /// Bytes the runner holds now (GPU: the forward graphs of the step shapes run lately and the
    /// rings; CPU: the feed and rings, a step's activations being allocated while it runs).
    fn runner_bytes(&self) -> u64;

    /// Most rows of one prefill pass outside the scheduler.
    fn prefill_chunk(&self) -> u32;

    /// The bytes the largest steps of a generation hold at most (measured on the GPU by building
    /// them against a one-block KV cache of `kv`'s shape; 0 on the CPU, whose steps allocate
    /// while they run): what a memory cap keeps free of the KV pool.
    fn largest_steps_bytes(&self, kv: &KvShape, cache: &CacheConfig, steps: LargestSteps) -> Result<u64, EngineError>;

    /// Submits one step: its forward pass and the choice of its logit rows' tokens, without
    /// waiting for them. Rows may be [`StepRow::FED`]: their token is the one their sequence's
    /// last step with a logit row chose, kept by the backend. With [`Choose::Sample`] the tokens
    /// are sampled, each row's penalty window in its slot's ring, and appended to it.
    fn submit(&mut self, kv: &KvCache, step: StepRows<'_>, how: Choice<'_>) -> Result<Pending, EngineError>;

    /// The first half of [`Backend::submit`]: the step's forward pass alone. The next call must
    /// be [`Backend::submit_choice`] with the same rows (the logits are the step's until then):
    /// between the two the caller can work out what the choice needs (a constrained row's mask,
    /// from the step before) while the forward pass runs.
    fn submit_forward(&mut self, kv: &KvCache, step: StepRows<'_>) -> Result<(), EngineError>;

    /// The second half of [`Backend::submit`]: chooses the tokens of the step
    /// [`Backend::submit_forward`] submitted with these rows.
    fn submit_choice(&mut self, kv: &KvCache, step: StepRows<'_>, how: Choice<'_>) -> Result<Pending, EngineError>;

    /// Writes `tokens` (at most [`crate::sampler::MAX_REPETITION_WINDOW`], oldest first) as the
    /// penalty ring of sequence slot `slot`, from the ring's start: a step sampling for it then
    /// names the ring with head and length `tokens.len()` (steps already submitted keep their
    /// view).
    fn write_history(&mut self, slot: u32, tokens: &[u32]) -> Result<(), EngineError>;

    /// Host-clock times of the work of the steps [`prefill`] runs over `rows` (consecutive
    /// positions of one sequence, K/V slots appended), in chunks of the prefill chunk: each GPU
    /// dispatch run alone (for devices without timestamp queries), or each CPU forward pass. The
    /// K/V the steps write are the values already there.
    fn time_kernels<'a>(&'a mut self, kv: &'a KvCache, rows: &'a [StepRow]) -> LocalFuture<'a, Result<Vec<(&'static str, f64)>, EngineError>>;
}

/// The rows of positions `start..start + len` of `seq` (their slots appended), with `tokens`.
pub fn rows_of(kv: &KvCache, seq: SeqId, tokens: &[u32], start: u32) -> Vec<StepRow> {
    let table_base = kv.table_base(seq);
    tokens.iter().enumerate().map(|(i, &token)| StepRow { token, position: start + i as u32, table_base, slot: seq.0 }).collect()
}

/// Runs one step of argmax choices and waits for its outputs.
pub async fn run(backend: &mut dyn Backend, kv: &KvCache, step: StepRows<'_>, read: Logits) -> Result<Vec<RowOutput>, EngineError> {
    if step.0.is_empty() {
        return Ok(Vec::new());
    }
    backend.submit(kv, step, (read, Choose::Argmax))?.read().await
}

/// Runs `tokens` at positions `start..` of `seq` (appending their K/V slots) through prefill
/// passes of at most the prefill chunk's rows. Returns, for each position p in
/// `start..start + len` with p >= `first_logit`, the argmax and (with [`Logits::Full`]) the
/// logits predicting position p + 1, concatenated.
pub async fn prefill(
    backend: &mut dyn Backend,
    kv: &mut KvCache,
    seq: SeqId,
    tokens: &[u32],
    (start, first_logit): (u32, u32),
    read: Logits,
) -> Result<(Vec<u32>, Vec<f32>), EngineError> {
    let mut argmaxes = Vec::new();
    let mut logits = Vec::new();
    let mut pos = start;
    for piece in tokens.chunks(backend.prefill_chunk() as usize) {
        let rows = append_rows(kv, seq, piece, pos)?;
        let end = pos + piece.len() as u32;
        let logit_rows: Vec<u32> = (first_logit.max(pos).min(end)..end).map(|p| p - pos).collect();
        for (id, l) in run(backend, kv, (&rows, &logit_rows), read).await? {
            argmaxes.push(id);
            logits.extend(l.unwrap_or_default());
        }
        pos = end;
    }
    Ok((argmaxes, logits))
}

/// One decode step: `token` at the next position of `seq`.
pub async fn decode(backend: &mut dyn Backend, kv: &mut KvCache, seq: SeqId, token: u32, read: Logits) -> Result<RowOutput, EngineError> {
    let pos = kv.len(seq)?;
    let rows = append_rows(kv, seq, &[token], pos)?;
    let mut out = run(backend, kv, (&rows, &[0]), read).await?;
    Ok(out.remove(0))
}

/// Appends K/V slots for `tokens` at `start..` of `seq` and returns their rows.
fn append_rows(kv: &mut KvCache, seq: SeqId, tokens: &[u32], start: u32) -> Result<Vec<StepRow>, EngineError> {
    let at = kv.append(seq, tokens.len() as u32)?;
    debug_assert_eq!(at, start);
    Ok(rows_of(kv, seq, tokens, start))
}
