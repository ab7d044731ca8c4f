//! What the engine reports: the model and its backend, the memory it holds, the KV pool's and
//! the prefix cache's state.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::EngineError;
use crate::gpu::Context;
use crate::kv::{KvCache, PoolStats, PrefixStats};
use crate::model::ModelConfig;
use crate::tokenizer::Tokenizer;

use super::load::{cache_config, kv_shape, largest_steps};
use super::Engine;

/// GPU memory an engine holds ([`Engine::memory`]), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryUse {
    /// The weights, fixed at load.
    pub weights_bytes: u64,
    /// The KV pool and its block tables, fixed at load.
    pub kv_bytes: u64,
    /// The forward graphs of the step shapes run lately (activations, scratch, staging) and the
    /// runner's rings: it grows with new shapes and shrinks when a graph cache is full.
    pub graph_bytes: u64,
}

impl MemoryUse {
    pub fn total(&self) -> u64 {
        self.weights_bytes + self.kv_bytes + self.graph_bytes
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
    /// The GPU memory the engine holds now.
    pub memory: MemoryUse,
    /// `None` while the KV cache's invariants hold ([`KvCache::check_integrity`]), else what
    /// broke (a bug: tests and the soak run watch it).
    pub integrity: Option<String>,
}

impl Engine {
    /// The model's hyper-parameters and features.
    pub fn config(&self) -> &ModelConfig {
        self.backend.config()
    }

    /// The backend that runs the model (`"webgpu"` or `"cpu"`) and why it was chosen.
    pub fn backend(&self) -> (&'static str, &str) {
        (self.backend.name(), &self.backend_reason)
    }

    /// How many tensors of each weight type the model file holds, by ggml's type name
    /// (`{"F32": 61, "Q4_1": 210, "Q8_0": 1}`): what `engine.info` and the page show.
    pub fn weight_types(&self) -> &BTreeMap<String, u32> {
        &self.weight_types
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The GPU context; `None` on the CPU backend.
    pub fn context(&self) -> Option<&Arc<Context>> {
        self.backend.device()
    }

    /// The WebGPU adapter ([`Context::adapter_name`]), or the CPU backend and its threads.
    pub fn adapter_name(&self) -> String {
        self.backend.adapter_name()
    }

    /// The kernel variants in use ([`Context::variant_name`]); `"cpu"` on the CPU backend, with
    /// `+simd128` when the wasm build has SIMD and `+int8-activations` when its matmuls use them.
    pub fn variant_name(&self) -> String {
        self.backend.variant_name()
    }

    /// Whether the kernels run on a CPU: the CPU backend, or WebGPU on a CPU emulation
    /// (kernels tuned for one, [`Context::is_cpu`]).
    pub fn is_cpu(&self) -> bool {
        self.backend.device().is_none_or(|ctx| ctx.is_cpu())
    }

    pub fn max_context(&self) -> u32 {
        self.kv.max_seq_len
    }

    /// The device bytes the largest steps of a generation hold (a decode row, a prefill chunk
    /// and a full batch step, measured by building them): what a memory cap keeps free of the KV
    /// pool (`max_memory_bytes`).
    /// On the CPU backend, 0: a step's activations are allocated while it runs.
    pub fn largest_steps_bytes(&self) -> Result<u64, EngineError> {
        let shape = kv_shape(self.config());
        let cache = cache_config(self.backend.device(), self.config(), &self.options);
        self.backend.largest_steps_bytes(&shape, &cache, largest_steps(&self.options.sched, self.options.prefill_chunk))
    }

    /// Bytes the engine holds now, on the GPU or (CPU backend) in memory (see [`MemoryUse`]).
    pub fn memory(&self) -> MemoryUse {
        MemoryUse { weights_bytes: self.backend.weights_bytes(), kv_bytes: self.kv.bytes_total(), graph_bytes: self.backend.runner_bytes() }
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
                .map(|id| SequenceInfo { id: id.0, len: self.kv.len(id).unwrap_or(0), blocks: self.kv.blocks(id).map(|b| b.to_vec()).unwrap_or_default() })
                .collect(),
            memory: self.memory(),
            integrity: self.kv.check_integrity().err().map(|e| e.to_string()),
        }
    }
}
