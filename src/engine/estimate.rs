//! What a model will take in memory, from its header alone (a few MB read before a download of
//! gigabytes): its weights on each backend, its KV cache per token and for the context asked
//! for, its activations, compared with what the device and the wasm32 address space allow.

use crate::gguf::Gguf;
use crate::kv::{KvDtype, KvLayout};
use crate::model::ModelConfig;
use crate::webgpu::Weights;

use super::load::{cache_config, kv_bytes_per_token, kv_shape, largest_steps};
use super::options::{BackendChoice, EngineOptions};
use crate::error::EngineError;

/// The most a wasm32 module addresses: its linear memory is at most 4 GiB.
pub const WASM32_BYTES: u64 = 4 << 30;
/// What the CPU backend's module holds besides the engine's data (code, stacks, the
/// tokenizer's tables, allocator slack), counted against [`WASM32_BYTES`].
pub const WASM_OVERHEAD_BYTES: u64 = 256 << 20;

/// What the device allows, as the caller knows it (the adapter's limits, a memory budget).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DeviceBudget {
    /// The adapter's `maxBufferSize`.
    pub max_buffer_size: Option<u64>,
    /// The adapter's `maxStorageBufferBindingSize`.
    pub max_storage_buffer_binding_size: Option<u64>,
    /// Memory the model may take on the device (a cap, or what the device is said to have).
    pub memory_bytes: Option<u64>,
}

/// Bytes for each backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PerBackend {
    pub webgpu: u64,
    pub cpu: u64,
}

/// Bytes for each KV precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PerDtype {
    pub f32: u64,
    pub int8: u64,
}

/// Whether the model fits each backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FitsPerBackend {
    pub webgpu: bool,
    pub cpu: bool,
}

/// [`estimate`]'s answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MemoryEstimate {
    /// Whether the model fits the backend the options ask for (either, for `auto`).
    pub fits: bool,
    pub fits_backend: FitsPerBackend,
    /// The backend the options ask for: "webgpu", "cpu" or "auto".
    pub backend: &'static str,
    pub weights_bytes: PerBackend,
    pub kv_bytes_per_token: PerDtype,
    /// Tokens the KV pool holds for the options (the context asked for, or the pool size).
    pub kv_tokens: u64,
    pub kv_bytes: PerDtype,
    /// The step's activations and scratch (an estimate from the model's shapes).
    pub activations_bytes: PerBackend,
    /// Weights, KV cache at the options' precision and activations.
    pub total_bytes: PerBackend,
    /// The largest single weight matrix, and one layer's KV buffer: what one GPU buffer must
    /// hold unless it is split (matrices are split at row groups; a KV layer is not).
    pub largest_buffer_bytes: u64,
    pub kv_layer_bytes: u64,
    pub limits: DeviceBudget,
    pub wasm32_bytes: u64,
    /// Why it does not fit, one line each (empty when it fits).
    pub reasons: Vec<String>,
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// The memory the model of `gguf` (its header: no tensor data is read) takes under `options`,
/// against `budget`.
pub fn estimate(gguf: &Gguf<'_>, options: &EngineOptions, budget: DeviceBudget) -> Result<MemoryEstimate, EngineError> {
    let mut config = ModelConfig::from_header(gguf)?;
    let context = super::load::max_context(&config, options);
    config.use_context(context);
    let shape = kv_shape(&config);
    let cache = cache_config(None, &config, options);
    let per_token = |dtype| kv_bytes_per_token(&shape, &crate::kv::CacheConfig { dtype, ..cache });
    let kv_bytes_per_token = PerDtype { f32: per_token(KvDtype::F32)?, int8: per_token(KvDtype::Int8)? };
    let kv_tokens = match cache.layout {
        KvLayout::Paged => cache.pool_tokens as u64,
        KvLayout::Contiguous => cache.max_seqs as u64 * cache.max_seq_len as u64,
    };
    let kv_bytes = PerDtype { f32: kv_bytes_per_token.f32 * kv_tokens, int8: kv_bytes_per_token.int8 * kv_tokens };
    let kv_now = match options.kv_dtype {
        KvDtype::F32 => kv_bytes.f32,
        KvDtype::Int8 => kv_bytes.int8,
    };
    let weights_bytes = PerBackend { webgpu: Weights::planned_bytes(gguf, &config)?, cpu: gguf.tensors.iter().map(|t| t.size_bytes).sum() };
    let activations_bytes = activations(&config, options);
    let total_bytes = PerBackend { webgpu: weights_bytes.webgpu + kv_now + activations_bytes.webgpu, cpu: weights_bytes.cpu + kv_now + activations_bytes.cpu };
    let largest_buffer_bytes = gguf.tensors.iter().map(|t| t.size_bytes).max().unwrap_or(0);
    let kv_layer_bytes = kv_now / config.n_layers.max(1) as u64;
    let mut reasons = Vec::new();
    let mut fits_backend = FitsPerBackend { webgpu: true, cpu: true };
    if let Some(memory) = budget.memory_bytes {
        if total_bytes.webgpu > memory {
            fits_backend.webgpu = false;
            reasons.push(format!(
                "WebGPU: needs {} (weights {} + KV {} + activations {}), the device offers {}",
                gib(total_bytes.webgpu),
                gib(weights_bytes.webgpu),
                gib(kv_now),
                gib(activations_bytes.webgpu),
                gib(memory)
            ));
        }
        if total_bytes.cpu > memory {
            fits_backend.cpu = false;
            reasons.push(format!("CPU: needs {}, the device offers {}", gib(total_bytes.cpu), gib(memory)));
        }
    }
    let binding = budget.max_storage_buffer_binding_size.into_iter().chain(budget.max_buffer_size).min();
    if let Some(limit) = binding.filter(|&limit| kv_layer_bytes > limit) {
        fits_backend.webgpu = false;
        reasons.push(format!(
            "WebGPU: one layer's KV cache for {kv_tokens} tokens takes {}, over the adapter's {limit}-byte buffer limit: ask for a shorter context",
            kv_layer_bytes
        ));
    }
    if largest_buffer_bytes > isize::MAX as u64 {
        fits_backend.cpu = false;
        reasons.push(format!("CPU: a tensor of {} is larger than one allocation here ({} bytes)", gib(largest_buffer_bytes), isize::MAX));
    }
    if total_bytes.cpu + WASM_OVERHEAD_BYTES > WASM32_BYTES {
        fits_backend.cpu = false;
        reasons.push(format!("CPU: needs {} in wasm memory, over the 4 GiB a wasm32 module addresses", gib(total_bytes.cpu + WASM_OVERHEAD_BYTES)));
    }
    let (backend, fits) = match options.backend {
        BackendChoice::Webgpu => ("webgpu", fits_backend.webgpu),
        BackendChoice::Cpu => ("cpu", fits_backend.cpu),
        BackendChoice::Auto => ("auto", fits_backend.webgpu || fits_backend.cpu),
    };
    Ok(MemoryEstimate {
        fits,
        fits_backend,
        backend,
        weights_bytes,
        kv_bytes_per_token,
        kv_tokens,
        kv_bytes,
        activations_bytes,
        total_bytes,
        largest_buffer_bytes,
        kv_layer_bytes,
        limits: budget,
        wasm32_bytes: WASM32_BYTES,
        reasons,
    })
}

/// The activations of the largest step, from the model's shapes: every row of a prefill chunk
/// holds the residual stream and its normed copy, q, k and v, and the FFN's gate and up values
/// (the other buffers alias these); a batch step's rows each hold logits. Measured on SmolLM2
/// with a 512-row chunk on lavapipe: 9.6 MB held, 10.6 MB from this formula.
fn activations(config: &ModelConfig, options: &EngineOptions) -> PerBackend {
    let steps = largest_steps(&options.sched, options.prefill_chunk);
    let q = (config.n_heads * config.head_dim) as u64;
    let kv = (config.n_kv_heads * config.head_dim) as u64;
    let per_row = 4 * (2 * config.hidden as u64 + q + 2 * kv + 2 * config.ffn as u64);
    let logits = 4 * config.vocab as u64 * steps.batch.max(1) as u64;
    let bytes = per_row * steps.chunk_rows as u64 + logits;
    PerBackend { webgpu: bytes, cpu: bytes }
}
