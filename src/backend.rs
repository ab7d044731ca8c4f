//! The two backends behind one interface: WebGPU (the forward graphs of [`crate::model`] on a
//! [`Context`]) and the CPU ([`crate::cpu`]: the same graph by CPU kernels, the KV pool in CPU
//! memory). The engine runs its steps, scores and snapshots through [`Backend`] and never asks
//! which one it holds, except for GPU-only reports (profiles) and to say which runs.
//!
//! A GPU step is submitted and read later ([`Pending::Gpu`]); a CPU step runs when submitted and
//! its outputs wait in [`Pending::Ready`], so the engine's loop (steps planned ahead, tokens
//! handed over between steps, undone rows) is the same for both.

use std::sync::Arc;

use crate::cpu::{HostModel, HostRunner};
use crate::gguf::Gguf;
use crate::gpu::{Context, GpuError};
use crate::kv::{KvCache, SeqId};
use crate::model::{Choose, Logits, Model, ModelConfig, ModelError, PendingStep, RowOutput, Runner, StepRow};

/// Which backend an engine asks for (`backend` in the package, `--backend` in the CLI; both
/// default to `Auto`). The Rust API's default (`EngineOptions::default` in `src/engine.rs`) is
/// `Webgpu`: code that builds options by hand (the tests among it) gets the GPU path it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// WebGPU on a real GPU; the CPU backend when there is no adapter or the adapter is a CPU
    /// emulation (lavapipe, SwiftShader).
    Auto,
    /// WebGPU on whatever adapter there is (a software one included).
    #[default]
    Webgpu,
    /// The CPU backend.
    Cpu,
}

impl BackendChoice {
    /// What the package and the CLI take when no backend is named (the Rust API's default is
    /// `Webgpu`, see above; the worker in `js/worker.js` says `"auto"` for the same reason).
    pub const FOR_USERS: BackendChoice = BackendChoice::Auto;

    /// Parses `auto`, `webgpu` or `cpu`.
    pub fn parse(name: &str) -> Option<BackendChoice> {
        match name {
            "auto" => Some(BackendChoice::Auto),
            "webgpu" => Some(BackendChoice::Webgpu),
            "cpu" => Some(BackendChoice::Cpu),
            _ => None,
        }
    }
}

/// The backend an engine runs on, with its model and runner.
pub enum Backend {
    Gpu { ctx: Arc<Context>, model: Model, runner: Runner },
    Cpu { model: HostModel, runner: HostRunner },
}

/// A submitted step's outputs, on their way back from the GPU or ready.
pub enum Pending {
    Gpu(PendingStep),
    Ready(Vec<RowOutput>),
}

impl Backend {
    /// The CPU backend for `gguf` (its weights copied into memory, kept in their formats).
    pub fn cpu(gguf: &Gguf<'_>, config: &ModelConfig, (prefill_chunk, max_seqs): (u32, u32), int8_activations: bool) -> Result<Backend, ModelError> {
        Ok(Backend::Cpu { model: HostModel::load(gguf, config, int8_activations)?, runner: HostRunner::new(prefill_chunk, max_seqs)? })
    }

    /// `"webgpu"` or `"cpu"`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Gpu { .. } => "webgpu",
            Backend::Cpu { .. } => "cpu",
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Backend::Gpu { model, .. } => &model.config,
            Backend::Cpu { model, .. } => &model.config,
        }
    }

    /// Whether the CPU backend quantizes its matmuls' activations to int8 (`false` on the GPU,
    /// whose `Context` says for itself).
    pub fn cpu_int8_activations(&self) -> bool {
        matches!(self, Backend::Cpu { model, .. } if model.int8_activations)
    }

    /// The GPU context; `None` on the CPU.
    pub fn ctx(&self) -> Option<&Arc<Context>> {
        match self {
            Backend::Gpu { ctx, .. } => Some(ctx),
            Backend::Cpu { .. } => None,
        }
    }

    /// Bytes of the weights (on the GPU, or in CPU memory).
    pub fn weights_bytes(&self) -> u64 {
        match self {
            Backend::Gpu { model, .. } => model.weights.bytes(),
            Backend::Cpu { model, .. } => model.bytes(),
        }
    }

    /// Bytes the runner holds now (graphs and rings; the CPU's feed and rings).
    pub fn runner_bytes(&self) -> u64 {
        match self {
            Backend::Gpu { runner, .. } => runner.bytes(),
            Backend::Cpu { runner, .. } => runner.bytes(),
        }
    }

    /// Whether the GPU device is lost (never on the CPU).
    pub fn is_lost(&self) -> bool {
        self.ctx().is_some_and(|c| c.is_lost())
    }

    /// Why the device was lost, once it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.ctx().and_then(|c| c.lost_reason())
    }

    /// An error the device reported since the last call ([`Context::take_reported`]).
    pub fn take_reported(&self) -> Option<GpuError> {
        self.ctx().and_then(|c| c.take_reported())
    }

    /// After a failed read: whether the device is lost ([`Context::confirm_lost`]).
    pub async fn confirm_lost(&self) -> bool {
        match self.ctx() {
            Some(ctx) => ctx.confirm_lost().await,
            None => false,
        }
    }

    /// Submits one step (see [`Runner::submit`]); on the CPU it runs now.
    pub fn submit(&mut self, kv: &KvCache, step: (&[StepRow], &[u32]), how: (Logits, Choose<'_>)) -> Result<Pending, ModelError> {
        match self {
            Backend::Gpu { ctx, model, runner } => runner.submit(ctx, model, kv, step, how).map(Pending::Gpu),
            Backend::Cpu { model, runner } => runner.submit(model, kv, step, how).map(Pending::Ready),
        }
    }

    /// Submits a step's forward pass; [`Backend::submit_choice`] chooses its tokens.
    pub fn submit_forward(&mut self, kv: &KvCache, step: (&[StepRow], &[u32])) -> Result<(), ModelError> {
        match self {
            Backend::Gpu { ctx, model, runner } => runner.submit_forward(ctx, model, kv, step),
            Backend::Cpu { model, runner } => runner.submit_forward(model, kv, step),
        }
    }

    /// Chooses the tokens of the step [`Backend::submit_forward`] submitted.
    pub fn submit_choice(&mut self, kv: &KvCache, how: (Logits, Choose<'_>)) -> Result<Pending, ModelError> {
        match self {
            Backend::Gpu { ctx, model, runner } => runner.submit_choice(ctx, model, kv, how).map(Pending::Gpu),
            Backend::Cpu { runner, .. } => runner.submit_choice(how).map(Pending::Ready),
        }
    }

    /// Waits for a submitted step's outputs.
    pub async fn read(&self, pending: Pending) -> Result<Vec<RowOutput>, ModelError> {
        match (pending, self) {
            (Pending::Ready(outputs), _) => Ok(outputs),
            (Pending::Gpu(step), Backend::Gpu { ctx, .. }) => step.read(ctx).await,
            (Pending::Gpu(_), Backend::Cpu { .. }) => Err(ModelError::Format("a GPU step read on the CPU backend".into())),
        }
    }

    /// Writes sequence slot `slot`'s penalty ring ([`Runner::write_history`]).
    pub fn write_history(&mut self, slot: u32, tokens: &[u32]) -> Result<(), ModelError> {
        match self {
            Backend::Gpu { ctx, runner, .. } => runner.write_history(ctx, slot, tokens),
            Backend::Cpu { runner, .. } => runner.write_history(slot, tokens),
        }
    }

    /// Runs one step and waits for its outputs (see [`Runner::run`]).
    pub async fn run(&mut self, kv: &KvCache, rows: &[StepRow], logit_rows: &[u32], read: Logits) -> Result<Vec<RowOutput>, ModelError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let pending = self.submit(kv, (rows, logit_rows), (read, Choose::Argmax))?;
        self.read(pending).await
    }

    /// Host-clock times of the work of the steps [`Backend::prefill`] runs over `rows`
    /// (consecutive positions of one sequence, K/V slots appended): each GPU dispatch run alone
    /// ([`Runner::time_kernels`]), or the CPU forward pass's stages ([`crate::cpu::forward`]).
    pub async fn time_kernels(&mut self, kv: &KvCache, rows: &[StepRow]) -> Result<Vec<(&'static str, f64)>, ModelError> {
        match self {
            Backend::Gpu { ctx, model, runner } => runner.time_kernels(ctx, model, kv, rows).await,
            Backend::Cpu { model, runner } => runner.time_kernels(model, kv, rows),
        }
    }

    /// Most rows of one prefill pass outside the scheduler.
    fn prefill_chunk(&self) -> u32 {
        match self {
            Backend::Gpu { runner, .. } => runner.prefill_chunk(),
            Backend::Cpu { runner, .. } => runner.prefill_chunk(),
        }
    }

    /// Runs `tokens` at positions `start..` of `seq` (appending their K/V slots) through
    /// prefill passes of at most the prefill chunk's rows. Returns, for each position p in
    /// `start..start + len` with p >= `first_logit`, the argmax and (with [`Logits::Full`]) the
    /// logits predicting position p + 1, concatenated.
    pub async fn prefill(&mut self, kv: &mut KvCache, seq: SeqId, tokens: &[u32], (start, first_logit): (u32, u32), read: Logits) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        let mut argmaxes = Vec::new();
        let mut logits = Vec::new();
        let mut pos = start;
        for piece in tokens.chunks(self.prefill_chunk() as usize) {
            let rows = append_rows(kv, seq, piece, pos)?;
            let end = pos + piece.len() as u32;
            let logit_rows: Vec<u32> = (first_logit.max(pos).min(end)..end).map(|p| p - pos).collect();
            for (id, l) in self.run(kv, &rows, &logit_rows, read).await? {
                argmaxes.push(id);
                logits.extend(l.unwrap_or_default());
            }
            pos = end;
        }
        Ok((argmaxes, logits))
    }

    /// One decode step: `token` at the next position of `seq`.
    pub async fn decode(&mut self, kv: &mut KvCache, seq: SeqId, token: u32, read: Logits) -> Result<RowOutput, ModelError> {
        let pos = kv.len(seq)?;
        let rows = append_rows(kv, seq, &[token], pos)?;
        let mut out = self.run(kv, &rows, &[0], read).await?;
        Ok(out.remove(0))
    }
}

/// Appends K/V slots for `tokens` at `start..` of `seq` and returns their rows.
fn append_rows(kv: &mut KvCache, seq: SeqId, tokens: &[u32], start: u32) -> Result<Vec<StepRow>, ModelError> {
    let at = kv.append(seq, tokens.len() as u32)?;
    debug_assert_eq!(at, start);
    Ok(Runner::rows_of(kv, seq, tokens, start))
}
