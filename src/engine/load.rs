//! Loading a model: the file parsed, the backend chosen and its weights loaded, the KV cache
//! sized (to a memory cap when there is one) and the engine assembled around them.

use std::sync::Arc;

use crate::backend::{Backend, LargestSteps};
use crate::cpu::{CpuBackend, HostModel};
use crate::error::EngineError;
use crate::gguf::{Gguf, ReadAt};
use crate::gpu::{Context, GpuError};
use crate::kv::{CacheConfig, KvCache, KvLayout, KvPool, KvShape};
use crate::model::{ModelConfig, ModelError};
use crate::sched::{SchedConfig, Scheduler};
use crate::tokenizer::{Tokenizer, TokenizerSpec};
use crate::webgpu::{self, GpuBackend, Model};

use super::flight::Flight;
use super::options::{BackendChoice, EngineOptions, CPU_INT8_ACTIVATIONS};
use super::Engine;

/// Where a load is, for its progress ([`Engine::load_from`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadEvent {
    /// Building the tokenizer from the file's vocabulary.
    Tokenizer,
    /// `loaded` of the `total` bytes of the model's tensors read and placed (in GPU buffers, or
    /// in the CPU backend's memory).
    Upload { loaded: u64, total: u64 },
    /// Creating the backend: its kernels and buffers.
    Pipelines,
}

/// The bytes between two `Upload` events.
const UPLOAD_EVENT_BYTES: u64 = 4 << 20;

impl Engine {
    /// Loads a GGUF model from its bytes on the shared context its options ask for
    /// ([`Context::shared`]): the first engine creates the device, the next ones (another model,
    /// other KV settings) reuse it and every pipeline it compiled. For a context of one's own
    /// (counters no other engine touches), use [`Engine::load_with_context`].
    ///
    /// The backend is the one `options.backend` asks for: with [`BackendChoice::Auto`], WebGPU
    /// on a real GPU and the CPU backend when there is no adapter or the adapter is a CPU
    /// emulation ([`Engine::backend`] says which and why).
    pub async fn load(bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
        let gguf = Gguf::parse(bytes).map_err(ModelError::from)?;
        Engine::load_gguf(&gguf, options, &mut |_| {}).await
    }

    /// [`Engine::load`] from a model's files read by ranges (one file, or the parts of a split
    /// model in order): the header first, then each tensor as it is placed, in chunks of at most
    /// a few MiB on the GPU backend, so the file is never whole in memory (the CPU backend keeps
    /// the weights in memory once). `progress` hears each phase.
    pub async fn load_from(files: &[&dyn ReadAt], options: EngineOptions, progress: &mut dyn FnMut(LoadEvent)) -> Result<Engine, EngineError> {
        let gguf = Gguf::open(files).map_err(ModelError::from)?;
        Engine::load_gguf(&gguf, options, progress).await
    }

    async fn load_gguf(gguf: &Gguf<'_>, options: EngineOptions, progress: &mut dyn FnMut(LoadEvent)) -> Result<Engine, EngineError> {
        match options.backend {
            BackendChoice::Cpu => Engine::cpu_from(gguf, options, "asked for".into(), progress),
            BackendChoice::Webgpu => {
                let ctx = Context::shared(options.context_options()).await?;
                Engine::gpu_from(ctx, gguf, options, progress)
            }
            BackendChoice::Auto => match Context::shared(options.context_options()).await {
                Ok(ctx) if !ctx.is_cpu_adapter() => {
                    let mut engine = Engine::gpu_from(ctx, gguf, options, progress)?;
                    engine.backend_reason = "auto: a GPU adapter".into();
                    Ok(engine)
                }
                Ok(ctx) => Engine::cpu_from(gguf, options, format!("auto: the WebGPU adapter is a CPU emulation ({})", ctx.adapter_name()), progress),
                Err(e) => Engine::cpu_from(gguf, options, format!("auto: no usable WebGPU adapter ({e})"), progress),
            },
        }
    }

    /// Loads a GGUF model on the CPU backend ([`crate::cpu`]): weights and KV pool in CPU
    /// memory, no device. `reason`: why this backend, for [`Engine::backend`].
    /// A step runs when it is submitted there, so steps are not planned ahead
    /// ([`crate::sched::SchedConfig::lookahead`] off): one planned past a request's end would
    /// only be undone.
    pub fn load_cpu(bytes: &[u8], options: EngineOptions, reason: String) -> Result<Engine, EngineError> {
        let gguf = Gguf::parse(bytes).map_err(ModelError::from)?;
        Engine::cpu_from(&gguf, options, reason, &mut |_| {})
    }

    fn cpu_from(gguf: &Gguf<'_>, mut options: EngineOptions, reason: String, progress: &mut dyn FnMut(LoadEvent)) -> Result<Engine, EngineError> {
        options.sched.lookahead = false;
        let (config, tokenizer) = parse(gguf, &options, progress)?;
        let shape = kv_shape(&config);
        let mut cache = cache_config(None, &config, &options);
        let int8 = options.int8_activations.unwrap_or(CPU_INT8_ACTIVATIONS);
        let model = HostModel::load_with(gguf, &config, int8, &mut upload_progress(gguf, progress))?;
        if let Some(cap) = options.max_memory_bytes {
            fit_pool(cap, (model.bytes(), 0), kv_bytes_per_token(&shape, &cache)?, options.pool_tokens != 0, &mut cache)?;
        }
        progress(LoadEvent::Pipelines);
        let kv = KvCache::new_host(&shape, cache)?;
        let backend = CpuBackend::new(model, (options.prefill_chunk, kv.max_seqs()))?;
        Engine::assemble(Box::new(backend), reason, (gguf, tokenizer, kv), options)
    }

    /// Loads a GGUF model on an existing context.
    pub fn load_with_context(ctx: Arc<Context>, bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
        let gguf = Gguf::parse(bytes).map_err(ModelError::from)?;
        Engine::gpu_from(ctx, &gguf, options, &mut |_| {})
    }

    fn gpu_from(ctx: Arc<Context>, gguf: &Gguf<'_>, options: EngineOptions, progress: &mut dyn FnMut(LoadEvent)) -> Result<Engine, EngineError> {
        let (config, tokenizer) = parse(gguf, &options, progress)?;
        let shape = kv_shape(&config);
        let mut cache = cache_config(Some(&ctx), &config, &options);
        if let Some(cap) = options.max_memory_bytes {
            // The weights first: a file that cannot fit is refused before anything is read.
            weights_fit(cap, webgpu::Weights::planned_bytes(gguf, &config)?)?;
        }
        let model = Model::upload_with(&ctx, gguf, config, &mut upload_progress(gguf, progress))?;
        progress(LoadEvent::Pipelines);
        if let Some(cap) = options.max_memory_bytes {
            let weights = model.weights.bytes();
            let graphs = webgpu::largest_steps_bytes(&ctx, &model, (&shape, &cache), largest_steps(&options.sched, options.prefill_chunk))?;
            fit_pool(cap, (weights, graphs), kv_bytes_per_token(&shape, &cache)?, options.pool_tokens != 0, &mut cache)?;
        }
        let kv = KvCache::new(&ctx, &shape, cache)?;
        let mut backend = GpuBackend::new(ctx.clone(), model, (options.prefill_chunk, kv.max_seqs()))?;
        if let Some(cap) = options.max_memory_bytes {
            backend.cap_memory(cap, kv.bytes_total())?;
        }
        // An allocation the device refused while loading (natively reported by now).
        if let Some(e) = ctx.take_reported() {
            return Err(e.into());
        }
        Engine::assemble(Box::new(backend), "asked for".into(), (gguf, tokenizer, kv), options)
    }

    /// The engine around a loaded backend and KV cache.
    fn assemble(
        backend: Box<dyn Backend>,
        backend_reason: String,
        (gguf, tokenizer, kv): (&Gguf<'_>, Tokenizer, KvCache),
        options: EngineOptions,
    ) -> Result<Engine, EngineError> {
        let sched = Scheduler::new(options.sched.clone(), options.prefill_chunk)?;
        let flight = Flight::new(kv.max_seqs());
        let weight_types = gguf.tensor_type_counts();
        Ok(Engine { backend, backend_reason, tokenizer, kv, options, sched, weight_types, flight, backlog: Vec::new(), grammars: None })
    }
}

/// The file's configuration and its tokenizer.
fn parse(gguf: &Gguf<'_>, options: &EngineOptions, progress: &mut dyn FnMut(LoadEvent)) -> Result<(ModelConfig, Tokenizer), EngineError> {
    if options.prefill_chunk == 0 {
        return Err(EngineError::InvalidArgument("prefill_chunk must be at least 1".into()));
    }
    let mut config = ModelConfig::from_gguf(gguf)?;
    config.use_context(max_context(&config, options));
    progress(LoadEvent::Tokenizer);
    let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(gguf)?)?;
    Ok((config, tokenizer))
}

/// The callback a backend's loader calls with each range of tensor bytes it placed, turned into
/// `Upload` events every few MiB (and at the end).
fn upload_progress<'p>(gguf: &Gguf<'_>, progress: &'p mut dyn FnMut(LoadEvent)) -> impl FnMut(u64) + 'p {
    let total: u64 = gguf.tensors.iter().map(|t| t.size_bytes).sum();
    let (mut loaded, mut told) = (0u64, 0u64);
    move |bytes| {
        loaded += bytes;
        if loaded - told >= UPLOAD_EVENT_BYTES || loaded >= total {
            told = loaded;
            progress(LoadEvent::Upload { loaded: loaded.min(total), total });
        }
    }
}

/// What the KV cache needs of the model: its pool shape (layers, KV heads, head size, which
/// layers attend through a window) and identity.
pub fn kv_shape(config: &ModelConfig) -> KvShape {
    let local_layers = (0..config.n_layers).filter(|&l| config.layer_window(l).is_some()).fold(0u64, |m, l| m | 1 << l);
    KvShape {
        n_layers: config.n_layers,
        n_kv_heads: config.n_kv_heads,
        head_dim: config.head_dim,
        fingerprint: config.fingerprint,
        window: config.sliding_window.unwrap_or(0),
        local_layers,
    }
}

/// The largest steps of a generation under the scheduler's `sched` and the one-sequence path's
/// `prefill_chunk`: a prefill chunk (of the one or the other's rows, whichever is larger) and a
/// full batch step.
pub(super) fn largest_steps(sched: &SchedConfig, prefill_chunk: u32) -> LargestSteps {
    // A step verifying drafts has a logit row per draft token too.
    LargestSteps { chunk_rows: prefill_chunk.max(sched.step_tokens), step_rows: sched.step_tokens, batch: sched.max_logit_rows() }
}

/// Bytes of K/V one token takes in a pool of `cache`'s dtype for `shape` (every layer, the
/// local layers' group included), measured on a one-block cache.
pub(super) fn kv_bytes_per_token(shape: &KvShape, cache: &CacheConfig) -> Result<u64, EngineError> {
    let block = cache.block_size.max(1);
    let probe = KvCache::new_host(shape, CacheConfig { pool_tokens: block, local_pool_tokens: block, prefix_cache: false, ..*cache })?;
    Ok(probe.bytes_per_token().max(1))
}

fn out_of_memory(message: String) -> EngineError {
    EngineError::Gpu(GpuError::OutOfMemory(message))
}

/// Refuses a memory cap of `cap` bytes that the weights alone exceed.
fn weights_fit(cap: u64, weights: u64) -> Result<(), EngineError> {
    if weights > cap {
        return Err(out_of_memory(format!("the weights take {weights} bytes, over the {cap}-byte memory cap")));
    }
    Ok(())
}

/// Sizes the KV pool of `cache` to what a memory cap of `cap` bytes leaves after the `weights`
/// and the largest step's activations (`graphs`), the pool taking `per_token` bytes a token:
/// the pool asked for (`asked`: a size was given) if it fits, else the largest whole number of
/// blocks; or refuses the cap as out of memory, naming what does not fit.
fn fit_pool(cap: u64, (weights, graphs): (u64, u64), per_token: u64, asked: bool, cache: &mut CacheConfig) -> Result<(), EngineError> {
    weights_fit(cap, weights)?;
    let block = cache.block_size.max(1);
    let room = cap.saturating_sub(weights + graphs);
    let per_token = per_token.max(1);
    let fits = match cache.layout {
        KvLayout::Paged => (room / per_token).min(u32::MAX as u64) as u32 / block * block,
        KvLayout::Contiguous => u32::MAX,
    };
    let asked = match cache.layout {
        KvLayout::Paged if asked => Some(cache.pool_tokens),
        KvLayout::Paged => None,
        KvLayout::Contiguous => Some(cache.max_seqs * cache.max_seq_len),
    };
    let need = |tokens: u32| tokens as u64 * per_token;
    match asked {
        Some(tokens) if need(tokens) > room => Err(out_of_memory(format!(
            "a KV pool of {tokens} tokens takes {} bytes, but the {cap}-byte memory cap leaves {room} after the weights ({weights}) and a step's activations ({graphs})",
            need(tokens)
        ))),
        Some(_) => Ok(()),
        None if fits < block => Err(out_of_memory(format!(
            "the {cap}-byte memory cap leaves {room} bytes after the weights ({weights}) and a step's activations ({graphs}): not one KV block of {block} tokens ({} bytes) fits",
            need(block)
        ))),
        None => {
            cache.pool_tokens = cache.pool_tokens.min(fits);
            Ok(())
        }
    }
}

/// The longest sequence the engine holds: `options.max_context` within the model's context
/// (0: up to 4,096).
pub(super) fn max_context(config: &ModelConfig, options: &EngineOptions) -> u32 {
    match options.max_context {
        0 => config.context_length.min(4096),
        n => n.min(config.context_length.max(1)),
    }
}

/// The KV cache's configuration for `config` under `options`, on `ctx` (whose binding limit
/// caps the default pool) or in CPU memory.
pub(super) fn cache_config(ctx: Option<&Arc<Context>>, config: &ModelConfig, options: &EngineOptions) -> CacheConfig {
    let max_context = max_context(config, options);
    let block_size = options.block_size.max(1);
    CacheConfig {
        layout: options.kv_layout,
        dtype: options.kv_dtype,
        block_size: options.block_size,
        // Default: room for the longest sequence, capped by what one layer's buffer may bind
        // on this device.
        pool_tokens: if options.pool_tokens == 0 {
            let device_max = ctx.map_or(u64::MAX, |ctx| KvPool::max_blocks(ctx, &kv_shape(config), block_size) * block_size as u64);
            (max_context as u64).min(device_max) as u32
        } else {
            options.pool_tokens
        },
        // The scheduler's running set, plus one for scoring, benchmarks and snapshots outside
        // it. The contiguous baseline reserves the whole maximum length per sequence up front,
        // so it runs one scheduled sequence at a time.
        max_seqs: match options.kv_layout {
            KvLayout::Paged => options.sched.max_batch.max(1) + 1,
            KvLayout::Contiguous => 2,
        },
        max_seq_len: max_context,
        prefix_cache: options.prefix_cache && options.kv_layout == KvLayout::Paged,
        // The default from the shape; the engine's step budget is within `LOCAL_STEP_TOKENS`.
        local_pool_tokens: 0,
    }
}
