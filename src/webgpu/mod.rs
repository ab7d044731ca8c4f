//! The WebGPU backend: the model's weights on a GPU [`Context`] ([`weights`]), its layer plan as
//! a graph of kernels recorded into one submission per step ([`graph`]), and what picks the
//! graph for a step's shape and holds what steps hand to each other on the GPU ([`runner`]).
//! The kernels themselves are the GPU layer's (`src/gpu/ops/`).

pub mod graph;
mod plan;
pub mod runner;
pub mod weights;

use std::sync::Arc;

use crate::backend::{Backend, Choice, LargestSteps, LocalFuture, Pending, StepRows};
use crate::error::EngineError;
use crate::gguf::Gguf;
use crate::gpu::{Context, GpuError};
use crate::kv::{CacheConfig, KvCache, KvShape};
use crate::model::{ModelConfig, StepRow};

pub use graph::{Feed, ForwardGraph, PendingStep};
pub use plan::AttentionKind;
pub use runner::{GraphBudget, Model, Runner};
pub use weights::Weights;

/// The model on a GPU, with its runner.
pub struct GpuBackend {
    ctx: Arc<Context>,
    model: Model,
    runner: Runner,
}

impl Model {
    /// Uploads `gguf`'s weights for `config` to the GPU.
    pub fn upload(ctx: &Context, gguf: &Gguf<'_>, config: ModelConfig) -> Result<Model, EngineError> {
        Model::upload_with(ctx, gguf, config, &mut |_| {})
    }

    /// [`Model::upload`], calling `placed` with the bytes of each tensor range placed.
    pub fn upload_with(ctx: &Context, gguf: &Gguf<'_>, config: ModelConfig, placed: &mut dyn FnMut(u64)) -> Result<Model, EngineError> {
        let weights = Weights::upload_with(ctx, gguf, &config, placed)?;
        Ok(Model { config, weights })
    }
}

impl GpuBackend {
    /// The backend of `model` on `ctx`, with a runner for `max_seqs` sequence slots (the KV
    /// cache's).
    pub fn new(ctx: Arc<Context>, model: Model, (prefill_chunk, max_seqs): (u32, u32)) -> Result<GpuBackend, EngineError> {
        let runner = Runner::new(&ctx, prefill_chunk, max_seqs)?;
        Ok(GpuBackend { ctx, model, runner })
    }

    /// Keeps what the backend holds within a memory cap of `cap` bytes beside a KV cache of
    /// `kv_bytes`: the forward graphs get what the weights, the cache and the runner's rings
    /// leave ([`GraphBudget`]), or the cap is refused as out of memory.
    pub fn cap_memory(&mut self, cap: u64, kv_bytes: u64) -> Result<(), EngineError> {
        let fixed = self.model.weights.bytes() + kv_bytes + self.runner.bytes();
        if fixed > cap {
            return Err(GpuError::OutOfMemory(format!("the weights and the KV cache take {fixed} bytes, over the {cap}-byte memory cap")).into());
        }
        self.runner.set_budget(GraphBudget { graphs: cap - fixed, cap });
        Ok(())
    }
}

/// The device bytes the largest steps of a generation hold on `model` (a decode row, a prefill
/// chunk, a full batch step, with a runner's rings), built against a one-block KV cache of
/// `cache`'s shape and dropped again (their pipelines stay compiled).
pub fn largest_steps_bytes(ctx: &Arc<Context>, model: &Model, (kv, cache): (&KvShape, &CacheConfig), steps: LargestSteps) -> Result<u64, EngineError> {
    let block = cache.block_size.max(1);
    let probe_kv = KvCache::new(ctx, kv, CacheConfig { pool_tokens: block, local_pool_tokens: block, prefix_cache: false, ..*cache })?;
    let mut probe = Runner::new(ctx, steps.chunk_rows.max(1), probe_kv.max_seqs())?;
    probe.build_largest(ctx, model, &probe_kv, steps)?;
    Ok(probe.budget_bytes())
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "webgpu"
    }

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn device(&self) -> Option<&Arc<Context>> {
        Some(&self.ctx)
    }

    fn adapter_name(&self) -> String {
        self.ctx.adapter_name()
    }

    fn variant_name(&self) -> String {
        self.ctx.variant_name()
    }

    fn weights_bytes(&self) -> u64 {
        self.model.weights.bytes()
    }

    fn runner_bytes(&self) -> u64 {
        self.runner.bytes()
    }

    fn prefill_chunk(&self) -> u32 {
        self.runner.prefill_chunk()
    }

    fn largest_steps_bytes(&self, kv: &KvShape, cache: &CacheConfig, steps: LargestSteps) -> Result<u64, EngineError> {
        largest_steps_bytes(&self.ctx, &self.model, (kv, cache), steps)
    }

    fn submit(&mut self, kv: &KvCache, step: StepRows<'_>, how: Choice<'_>) -> Result<Pending, EngineError> {
        let pending = self.runner.submit((&self.ctx, &self.model, kv), step, how)?;
        Ok(self.later(pending))
    }

    fn submit_forward(&mut self, kv: &KvCache, step: StepRows<'_>) -> Result<(), EngineError> {
        self.runner.submit_forward((&self.ctx, &self.model, kv), step)
    }

    fn submit_choice(&mut self, kv: &KvCache, step: StepRows<'_>, how: Choice<'_>) -> Result<Pending, EngineError> {
        let pending = self.runner.submit_choice((&self.ctx, &self.model, kv), step, how)?;
        Ok(self.later(pending))
    }

    fn write_history(&mut self, slot: u32, tokens: &[u32]) -> Result<(), EngineError> {
        self.runner.write_history(&self.ctx, slot, tokens)
    }

    fn time_kernels<'a>(&'a mut self, kv: &'a KvCache, rows: &'a [StepRow]) -> LocalFuture<'a, Result<Vec<(&'static str, f64)>, EngineError>> {
        Box::pin(self.runner.time_kernels(&self.ctx, &self.model, kv, rows))
    }
}

impl GpuBackend {
    /// A submitted step's readback as a [`Pending`].
    fn later(&self, step: PendingStep) -> Pending {
        let ctx = self.ctx.clone();
        Pending::later(async move { step.read(&ctx).await })
    }
}
