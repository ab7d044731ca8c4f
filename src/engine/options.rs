//! What an engine is asked to be: its options and their defaults, defined once here and taken
//! by the CLI and the package ([`EngineOptions::for_users`]).

use crate::gpu::{AdapterClass, ContextOptions, DeviceLimits};
use crate::kv::{KvDtype, KvLayout};
use crate::sched::SchedConfig;

/// Whether the CPU backend quantizes its matmuls' activations to int8 unless asked otherwise
/// (`EngineOptions::int8_activations`): yes, in both runtimes. In wasm one SIMD128 thread is
/// bound by the arithmetic (Chromium: an aggregate of 8 1.7×, decode 1.05-1.2×, prefill
/// 1.2-1.5×); natively decode and prefill run as fast as on f32 activations, but a step's extra
/// rows (a batch, a speculative draft) cost less, and the int8 kernels give a row the same bits
/// whatever rows share its step, which the f32 ones for quantized weights do not (1-3 rows
/// fused, 4 or more expanded). SmolLM2 and Gemma 3 keep every confident step of llama.cpp's
/// (`tests/golden.rs`, `tests/golden_gemma.rs`).
pub const CPU_INT8_ACTIVATIONS: bool = true;

/// Which backend an engine asks for (`backend` in the package, `--backend` in the CLI; both
/// default to `Auto`). The Rust API's default ([`EngineOptions::default`]) is
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
    /// What the package and the CLI take when no backend is named ([`EngineOptions::for_users`];
    /// the Rust API's default is `Webgpu`, see above).
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

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// The longest sequence (prompt + generation) the engine holds; 0 = min(model context, 4096).
    pub max_context: u32,
    /// Prompt rows per prefill pass; longer prompts run in chunks.
    pub prefill_chunk: u32,
    pub kv_layout: KvLayout,
    pub kv_dtype: KvDtype,
    /// Tokens per KV block (paged layout).
    pub block_size: u32,
    /// Token slots in the KV pool (paged layout); 0 = the maximum context, capped by the device's
    /// storage-binding limit for one layer's buffer.
    pub pool_tokens: u32,
    /// Reuse the K/V of earlier requests' common prefixes (paged layout only).
    pub prefix_cache: bool,
    /// Verify the KV cache's invariants after every step (for tests; costs CPU time per step).
    pub check_integrity: bool,
    /// Continuous batching: most sequences per step, most rows per step, cache-aware admission.
    pub sched: SchedConfig,
    /// Run as on a device whose largest storage binding and buffer are this many bytes (see
    /// [`ContextOptions::max_storage_binding`]); `None` = what the device offers. Used by
    /// [`Engine::load`](super::Engine::load), which creates the context; a context handed to
    /// [`Engine::load_with_context`](super::Engine::load_with_context) has its limits already.
    pub max_binding_bytes: Option<u64>,
    /// Tune the kernels as for this kind of adapter ([`ContextOptions::class`]); `None` = the
    /// adapter's own. Like `max_binding_bytes`, used by [`Engine::load`](super::Engine::load).
    pub adapter_class: Option<AdapterClass>,
    /// Use the adapter's optional features where offered ([`ContextOptions::optional_features`]).
    pub optional_features: bool,
    /// Whether the matmuls quantize their activations to int8 ([`ContextOptions::int8_activations`]);
    /// `None` = the adapter's default. Like `max_binding_bytes`, used by [`Engine::load`](super::Engine::load).
    pub int8_activations: Option<bool>,
    /// Create the device with the adapter's limits or a phone's ([`DeviceLimits`]). Like
    /// `max_binding_bytes`, used by [`Engine::load`](super::Engine::load).
    pub device_limits: DeviceLimits,
    /// Cap on the GPU memory the engine holds (weights, KV pool, activations): the default pool
    /// shrinks to fit, a load that cannot fit is refused, and a step whose activations would go
    /// past it fails its requests; all as [`ErrorKind::OutOfMemory`](crate::error::ErrorKind::OutOfMemory). `None` = no cap.
    pub max_memory_bytes: Option<u64>,
    /// Which backend runs the model ([`BackendChoice`]); used by [`Engine::load`](super::Engine::load).
    pub backend: BackendChoice,
}

impl EngineOptions {
    /// The options the package and the CLI start from: the defaults, with the backend users get
    /// when they name none ([`BackendChoice::FOR_USERS`]).
    pub fn for_users() -> EngineOptions {
        let sched = SchedConfig { speculative: SchedConfig::FOR_USERS_SPECULATIVE, ..SchedConfig::default() };
        EngineOptions { backend: BackendChoice::FOR_USERS, sched, ..EngineOptions::default() }
    }

    /// The context these options ask for: their binding limit, adapter class, optional features
    /// and activation type.
    pub fn context_options(&self) -> ContextOptions {
        ContextOptions {
            max_storage_binding: self.max_binding_bytes,
            class: self.adapter_class,
            optional_features: self.optional_features,
            int8_activations: self.int8_activations,
            limits: self.device_limits,
            ..Default::default()
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_context: 0,
            prefill_chunk: 512,
            kv_layout: KvLayout::Paged,
            kv_dtype: KvDtype::F32,
            block_size: 16,
            pool_tokens: 0,
            prefix_cache: true,
            check_integrity: false,
            sched: SchedConfig::default(),
            max_binding_bytes: None,
            adapter_class: None,
            optional_features: true,
            int8_activations: None,
            device_limits: DeviceLimits::default(),
            max_memory_bytes: None,
            backend: BackendChoice::default(),
        }
    }
}
