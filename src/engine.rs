//! The one object a user drives: load a model from bytes, generate with a token stream, run
//! many requests together, score (teacher forcing), move K/V snapshots, and report.
//!
//! The engine is the wiring between three parts that never see each other: the scheduler
//! ([`crate::sched`]: every request's life, the KV cache's sequences), the model's runner
//! ([`crate::model::Runner`]: rows through the forward graphs) and the KV cache
//! ([`crate::kv`]). A step is: the scheduler admits and plans, the runner runs the plan's rows,
//! the scheduler commits their outputs. [`Engine::generate`] is one submitted request stepped
//! to its end: there is one token loop.
//!
//! In steady decoding the loop keeps the GPU ahead of the CPU: before a step's tokens are read,
//! the next decode step is planned ([`crate::sched::Scheduler::plan_ahead`]) and submitted, its
//! input tokens handed over on the GPU ([`crate::model::Feed`]); end of generation, stop strings
//! and token limits are found in the tokens read behind it, and the row planned past an end is
//! undone through the KV cache, so nothing a caller sees or the cache keeps changes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::backend::{Backend, Pending};
use crate::constraint::Grammars;
use crate::gguf::Gguf;
use crate::gpu::{ContextOptions, Counters, GpuError, TimingMethod};
use crate::kv::{CacheConfig, KvCache, KvPool, PoolStats, PrefixStats, SeqId};
use crate::model::{Choose, GraphBudget, Logits, Model, ModelError, Runner, StepRow, Weights};
use crate::sampler::{top_k, HistoryRing, RowParams, Sampler, MAX_REPETITION_WINDOW};
use crate::request::Handling;
use crate::sched::{Plan, Scheduler};
use crate::tokenizer::{Tokenizer, TokenizerSpec};

// The engine's public surface: everything a caller (the CLI, web.rs, tests) needs comes from here.
pub use crate::error::{EngineError, ErrorKind};
pub use crate::backend::BackendChoice;
pub use crate::gpu::{AdapterClass, Context, DeviceLimits};
pub use crate::kv::{KvDtype, KvLayout};
pub use crate::model::ModelConfig;
pub use crate::profile::{ColdStep, Profile, ProfileSummary, StepProfile, TimedRun};
pub use crate::constraint::{Constraint, ConstraintError};
pub use crate::tools::{Message, ToolCall, ToolChoice, Tools};
pub use crate::request::{Event, FinishReason, GenerateRequest, Generation, RequestId, TokenEvent};
pub use crate::sampler::SamplingParams;
pub use crate::sched::{RunningInfo, SchedConfig, SchedStats};
pub use crate::tokenizer::{ChatFormatKind, ChatMessage};

/// Whether the CPU backend quantizes its matmuls' activations to int8 unless asked otherwise
/// (`EngineOptions::int8_activations`): in wasm, where one SIMD128 thread is bound by the
/// arithmetic (Chromium: an aggregate of 8 1.7×, decode 1.05-1.2×, prefill 1.2-1.5×) and
/// SmolLM2 keeps every confident step of llama.cpp's; not natively, where AVX2 on f32
/// activations is as fast.
pub const CPU_INT8_ACTIVATIONS: bool = cfg!(target_arch = "wasm32");

/// Decode steps [`Engine::profile`] runs before it measures (graphs built, pipelines compiled).
pub const PROFILE_WARMUP_DECODE: u32 = 4;
/// Decode steps [`Engine::profile`] measures; it reports the one of median wall time.
pub const PROFILE_DECODE_SAMPLES: u32 = 5;
/// Context [`Engine::profile`] needs beyond its prompt: the decode steps it runs (warm-up,
/// measured, and as many timed with timestamps), the first token's and a few to spare (a step
/// planned ahead, a call that yields no token).
pub const PROFILE_EXTRA_TOKENS: u32 = PROFILE_WARMUP_DECODE + 2 * PROFILE_DECODE_SAMPLES + 3;
/// Dispatches a capture is armed for beyond the measured step's (a step never records more than
/// its twin did; the slack only keeps a miscount from failing the profile).
const PROFILE_CAPTURE_SLACK: u32 = 64;

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
    /// [`Engine::load`], which creates the context; a context handed to
    /// [`Engine::load_with_context`] has its limits already.
    pub max_binding_bytes: Option<u64>,
    /// Tune the kernels as for this kind of adapter ([`ContextOptions::class`]); `None` = the
    /// adapter's own. Like `max_binding_bytes`, used by [`Engine::load`].
    pub adapter_class: Option<AdapterClass>,
    /// Use the adapter's optional features where offered ([`ContextOptions::optional_features`]).
    pub optional_features: bool,
    /// Whether the matmuls quantize their activations to int8 ([`ContextOptions::int8_activations`]);
    /// `None` = the adapter's default. Like `max_binding_bytes`, used by [`Engine::load`].
    pub int8_activations: Option<bool>,
    /// Create the device with the adapter's limits or a phone's ([`DeviceLimits`]). Like
    /// `max_binding_bytes`, used by [`Engine::load`].
    pub device_limits: DeviceLimits,
    /// Cap on the GPU memory the engine holds (weights, KV pool, activations): the default pool
    /// shrinks to fit, a load that cannot fit is refused, and a step whose activations would go
    /// past it fails its requests; all as [`ErrorKind::OutOfMemory`]. `None` = no cap.
    pub max_memory_bytes: Option<u64>,
    /// Which backend runs the model ([`BackendChoice`]); used by [`Engine::load`].
    pub backend: BackendChoice,
}

impl EngineOptions {
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

/// How `score` runs the continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreMode {
    /// Prefill the context, then one token at a time through the decode path.
    Decode,
    /// Everything in prefill passes.
    Prefill,
}

pub struct Engine {
    /// The model on its backend (WebGPU or the CPU), with its runner.
    backend: Backend,
    /// Which backend runs and why ([`Engine::backend`]).
    backend_reason: String,
    tokenizer: Tokenizer,
    kv: KvCache,
    options: EngineOptions,
    sched: Scheduler,
    /// Tensors of each type in the model file ([`Gguf::tensor_type_counts`]).
    weight_types: BTreeMap<String, u32>,
    /// Events of other requests that a [`Engine::generate`] call stepped past; the next
    /// [`Engine::step`] returns them first.
    backlog: Vec<Event>,
    /// Steps on the GPU whose outputs are not read yet, oldest first (two while a decode step
    /// planned ahead runs behind the one before it).
    in_flight: VecDeque<(Plan, Pending)>,
    /// A step planned ahead whose forward pass is on the GPU and whose tokens wait for its
    /// constrained rows' masks ([`Engine::choose_open`]), with its rows' sampler parameters.
    open: Option<(Plan, Option<Vec<RowParams>>)>,
    /// Where each sequence slot's penalty ring stands on the GPU ([`Engine::row_params`]).
    rings: Vec<HistoryRing>,
    /// The constraint engine over this model's vocabulary, built at the first constrained
    /// request, and the milliseconds that took.
    grammars: Option<(Grammars, f64)>,
}

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
        match options.backend {
            BackendChoice::Cpu => Engine::load_cpu(bytes, options, "asked for".into()),
            BackendChoice::Webgpu => {
                let ctx = Context::shared(options.context_options()).await?;
                Engine::load_with_context(ctx, bytes, options)
            }
            BackendChoice::Auto => match Context::shared(options.context_options()).await {
                Ok(ctx) if !ctx.is_cpu_adapter() => {
                    let mut engine = Engine::load_with_context(ctx, bytes, options)?;
                    engine.backend_reason = "auto: a GPU adapter".into();
                    Ok(engine)
                }
                Ok(ctx) => Engine::load_cpu(bytes, options, format!("auto: the WebGPU adapter is a CPU emulation ({})", ctx.adapter_name())),
                Err(e) => Engine::load_cpu(bytes, options, format!("auto: no usable WebGPU adapter ({e})")),
            },
        }
    }

    /// Loads a GGUF model on the CPU backend ([`crate::cpu`]): weights and KV pool in CPU
    /// memory, no device. `reason`: why this backend, for [`Engine::backend`].
    /// A step runs when it is submitted there, so steps are not planned ahead
    /// ([`SchedConfig::lookahead`] off): one planned past a request's end would only be undone.
    pub fn load_cpu(bytes: &[u8], mut options: EngineOptions, reason: String) -> Result<Engine, EngineError> {
        options.sched.lookahead = false;
        let (gguf, config, tokenizer) = Engine::parse(bytes, &options)?;
        let mut cache = cache_config(None, &config, &options);
        let backend = Backend::cpu(&gguf, &config, (options.prefill_chunk, cache.max_seqs), options.int8_activations.unwrap_or(CPU_INT8_ACTIVATIONS))?;
        if let Some(cap) = options.max_memory_bytes {
            let block = cache.block_size.max(1);
            let probe = KvCache::new_host(&config.kv_shape(), CacheConfig { pool_tokens: block, local_pool_tokens: block, prefix_cache: false, ..cache })?;
            fit_pool_to(cap, backend.weights_bytes(), (0, probe.bytes_per_token().max(1)), &options, &mut cache)?;
        }
        let kv = KvCache::new_host(&config.kv_shape(), cache)?;
        Engine::assemble(backend, reason, (&gguf, tokenizer, kv), options)
    }

    /// The parsed file, its configuration and its tokenizer.
    fn parse<'a>(bytes: &'a [u8], options: &EngineOptions) -> Result<(Gguf<'a>, ModelConfig, Tokenizer), EngineError> {
        if options.prefill_chunk == 0 {
            return Err(EngineError::InvalidArgument("prefill_chunk must be at least 1".into()));
        }
        let gguf = Gguf::parse(bytes).map_err(ModelError::from)?;
        let config = ModelConfig::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&gguf)?)?;
        Ok((gguf, config, tokenizer))
    }

    /// The engine around a loaded backend and KV cache.
    fn assemble(backend: Backend, backend_reason: String, (gguf, tokenizer, kv): (&Gguf<'_>, Tokenizer, KvCache), options: EngineOptions) -> Result<Engine, EngineError> {
        let sched = Scheduler::new(options.sched.clone(), options.prefill_chunk)?;
        let rings = vec![HistoryRing::default(); kv.max_seqs() as usize];
        let weight_types = gguf.tensor_type_counts();
        Ok(Engine { backend, backend_reason, tokenizer, kv, options, sched, weight_types, backlog: Vec::new(), in_flight: VecDeque::new(), open: None, rings, grammars: None })
    }

    /// Loads a GGUF model on an existing context.
    pub fn load_with_context(ctx: Arc<Context>, bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
        let (gguf, config, tokenizer) = Engine::parse(bytes, &options)?;
        let weights = Weights::upload(&ctx, &gguf, &config)?;
        let model = Model { config, weights };
        let mut cache = cache_config(Some(&ctx), &model.config, &options);
        if let Some(cap) = options.max_memory_bytes {
            fit_pool(&ctx, &model, &options, &mut cache, cap)?;
        }
        let kv = KvCache::new(&ctx, &model.config.kv_shape(), cache)?;
        let mut runner = Runner::new(&ctx, options.prefill_chunk, kv.max_seqs())?;
        if let Some(cap) = options.max_memory_bytes {
            let fixed = model.weights.bytes() + kv.bytes_total() + runner.bytes();
            if fixed > cap {
                return Err(out_of_memory(format!("the weights and the KV cache take {fixed} bytes, over the {cap}-byte memory cap")));
            }
            runner.set_budget(GraphBudget { graphs: cap - fixed, cap });
        }
        // An allocation the device refused while loading (natively reported by now).
        if let Some(e) = ctx.take_reported() {
            return Err(e.into());
        }
        Engine::assemble(Backend::Gpu { ctx, model, runner }, "asked for".into(), (&gguf, tokenizer, kv), options)
    }

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
        self.backend.ctx()
    }

    /// The WebGPU adapter ([`Context::adapter_name`]), or the CPU backend and its threads.
    pub fn adapter_name(&self) -> String {
        match self.backend.ctx() {
            Some(ctx) => ctx.adapter_name(),
            None => format!("CPU backend ({} threads)", crate::cpu::kernels::threads()),
        }
    }

    /// The kernel variants in use ([`Context::variant_name`]); `"cpu"` on the CPU backend, with
    /// `+simd128` when the wasm build has SIMD and `+int8-activations` when its matmuls use them.
    pub fn variant_name(&self) -> String {
        match self.backend.ctx() {
            Some(ctx) => ctx.variant_name(),
            None => {
                let mut name = String::from("cpu");
                if cfg!(target_feature = "simd128") {
                    name += "+simd128";
                }
                if self.backend.cpu_int8_activations() {
                    name += "+int8-activations";
                }
                name
            }
        }
    }

    /// Whether the kernels run on a CPU: the CPU backend, or WebGPU on a CPU emulation
    /// (kernels tuned for one, [`Context::is_cpu`]).
    pub fn is_cpu(&self) -> bool {
        self.backend.ctx().is_none_or(|ctx| ctx.is_cpu())
    }

    pub fn max_context(&self) -> u32 {
        self.kv.max_seq_len
    }

    /// The device bytes the largest steps of a generation hold (a decode row, a prefill chunk
    /// and a full batch step, measured by building them): what a memory cap keeps free of the KV
    /// pool (`max_memory_bytes`).
    /// On the CPU backend, 0: a step's activations are allocated while it runs.
    pub fn largest_steps_bytes(&self) -> Result<u64, EngineError> {
        match &self.backend {
            Backend::Gpu { ctx, model, .. } => Ok(largest_steps(ctx, model, &self.options, &cache_config(Some(ctx), &model.config, &self.options))?.0),
            Backend::Cpu { .. } => Ok(0),
        }
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
                .map(|id| SequenceInfo {
                    id: id.0,
                    len: self.kv.len(id).unwrap_or(0),
                    blocks: self.kv.blocks(id).map(|b| b.to_vec()).unwrap_or_default(),
                })
                .collect(),
            memory: self.memory(),
            integrity: self.kv.check_integrity().err().map(|e| e.to_string()),
        }
    }

    /// Renders chat messages with the model's template and the assistant's generation prompt,
    /// and tokenizes them: the prompt of the next reply.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.render(messages, true)
    }

    /// The prompt of an OpenAI-style chat request: `messages` (which may hold tool calls and
    /// tool results) with `tools`' section in the system turn when they are offered, rendered
    /// with the chat template and the generation prompt ([`crate::tools::chat_messages`]).
    pub fn openai_chat_prompt(&self, messages: &[Message], tools: Option<&Tools>) -> Result<Vec<u32>, EngineError> {
        self.chat_prompt(&self.openai_messages(messages, tools)?)
    }

    /// `messages` as the chat template takes them ([`crate::tools::chat_messages`], with this
    /// model's default system prompt).
    pub fn openai_messages(&self, messages: &[Message], tools: Option<&Tools>) -> Result<Vec<ChatMessage>, EngineError> {
        Ok(crate::tools::chat_messages(messages, tools, self.tokenizer.default_system_prompt())?)
    }

    /// The ids of a conversation so far (its messages rendered without the generation prompt):
    /// a later prompt of these messages plus a new turn begins with exactly these ids, so they
    /// are what a snapshot of the conversation keeps.
    pub fn history_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.render(messages, false)
    }

    /// The prompt of a text completion: the text's ids, after BOS when the model file asks for
    /// it (Gemma), exactly as a chat prompt starts.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode_prompt(text)?)
    }

    fn render(&self, messages: &[ChatMessage], generation_prompt: bool) -> Result<Vec<u32>, EngineError> {
        let text = self.tokenizer.apply_chat_template(messages, generation_prompt)?;
        self.text_prompt(&text)
    }

    fn check_tokens(&self, ids: &[u32]) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.config().vocab;
        if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        if ids.len() > self.kv.max_seq_len as usize {
            return Err(EngineError::ContextOverflow { prompt: ids.len(), limit: self.kv.max_seq_len as usize });
        }
        Ok(())
    }

    fn verify(&self) -> Result<(), EngineError> {
        if self.options.check_integrity {
            self.kv.check_integrity().map_err(crate::kv::KvError::from)?;
        }
        Ok(())
    }

    // ---- Requests: submit and step ------------------------------------------------------

    /// Queues a request for [`Engine::step`]; returns its id. The prompt and the sampling
    /// parameters are checked now.
    pub fn submit(&mut self, prompt: Vec<u32>, request: GenerateRequest) -> Result<RequestId, EngineError> {
        if let Some(message) = self.backend.lost_reason() {
            return Err(EngineError::DeviceLost { message, tokens: Vec::new(), text: String::new() });
        }
        self.check_tokens(&prompt)?;
        let sampler = Sampler::new(request.sampling.clone())?;
        let constrained = match &request.output_constraint()? {
            Some(c) => Some(self.grammars()?.start(c)?),
            None => None,
        };
        let handling = Handling { sampler, decoder: self.tokenizer.stream_decoder(), constrained };
        Ok(self.sched.submit(prompt, request, handling))
    }

    /// The constraint engine of this model's vocabulary, built at its first use.
    pub fn grammars(&mut self) -> Result<&Grammars, EngineError> {
        if self.grammars.is_none() {
            let t0 = crate::time::now_ms();
            let grammars = Grammars::new(&self.tokenizer, self.config().vocab)?;
            self.grammars = Some((grammars, crate::time::now_ms() - t0));
        }
        Ok(&self.grammars.as_ref().expect("built above").0)
    }

    /// Milliseconds it took to build the constraint engine (the token trie and llguidance's
    /// tables), once a constrained request has been submitted.
    pub fn grammar_build_ms(&self) -> Option<f64> {
        self.grammars.as_ref().map(|g| g.1)
    }

    /// Whether any submitted request has not finished (or has events not yet returned).
    pub fn has_work(&self) -> bool {
        !self.sched.is_idle() || !self.backlog.is_empty() || !self.in_flight.is_empty()
    }

    /// Ends a request now, wherever it is: its computed K/V go to the prefix cache and its
    /// sequence's blocks are released before this returns. Returns its generation so far
    /// (finish reason `abort`), or `None` for an unknown or already finished id.
    pub fn abort(&mut self, id: RequestId) -> Result<Option<Generation>, EngineError> {
        let generation = self.sched.abort(&mut self.kv, id)?;
        self.drop_orphan_steps()?;
        Ok(generation)
    }

    /// Forgets the steps in flight once no request is left to take their tokens (the last one
    /// ended or was aborted while a step planned ahead ran): nothing waits on them, and the GPU
    /// finishes them before anything submitted later. Their staging buffers are not reused.
    fn drop_orphan_steps(&mut self) -> Result<(), EngineError> {
        while self.sched.is_idle() {
            let Some((plan, _pending)) = self.in_flight.pop_front() else { break };
            // No request of the plan runs any more: this only settles the scheduler's count.
            self.sched.fail(&mut self.kv, &plan, &EngineError::InvalidArgument("a step planned ahead outlived its requests".into()))?;
        }
        Ok(())
    }

    /// Running and waiting requests, preemptions and each running sequence's block table.
    pub fn sched_stats(&self) -> SchedStats {
        self.sched.stats(&self.kv)
    }

    /// Runs one scheduling step: admits waiting requests, runs one forward over the batch (each
    /// running sequence's next token plus at most one prefill chunk) and returns what happened:
    /// admissions, tokens and finished requests. Does nothing when there is no work.
    pub async fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = std::mem::take(&mut self.backlog);
        events.extend(self.step_once().await?);
        Ok(events)
    }

    async fn step_once(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        if self.backend.is_lost() {
            return self.lose_device(events);
        }
        if self.in_flight.is_empty() {
            events.extend(self.sched.admit(&mut self.kv));
            let plan = self.sched.reserve(&mut self.kv, &mut events)?;
            if plan.rows().is_empty() {
                return Ok(events);
            }
            self.launch(plan, &mut events)?;
        }
        // The next decode step goes to the GPU before this one's tokens come back, fed with
        // them there; this one's tokens are read behind it. When its constrained rows' masks
        // need those tokens, only its forward pass goes now, its choice after the commit.
        if let Some(plan) = self.sched.plan_ahead(&mut self.kv)? {
            self.launch(plan, &mut events)?;
        }
        let Some((plan, pending)) = self.in_flight.pop_front() else { return Ok(events) };
        let read = self.backend.read(pending).await;
        if read.is_err() && self.backend.confirm_lost().await {
            // The device went: every request, in this step or not, ends with what it has.
            return self.lose_device(events);
        }
        // An error the device reported for this step's work (an allocation it refused, a
        // validation error): what it read back cannot be trusted, so its requests fail.
        let read = match self.backend.take_reported() {
            Some(e) => Err(ModelError::from(e)),
            None => read,
        };
        let committed = match read {
            Ok(outputs) => self.verify().and_then(|()| self.sched.commit(&mut self.kv, &plan, outputs, &self.tokenizer.eos_ids())),
            // The step failed as a whole: every request in it ends with the error.
            Err(e) => self.sched.fail(&mut self.kv, &plan, &e.into()),
        };
        let chosen = self.choose_open();
        events.extend(committed?);
        events.extend(chosen?);
        self.drop_orphan_steps()?;
        Ok(events)
    }

    /// The device is lost: the steps in flight are dropped and every running and waiting request
    /// ends with [`EngineError::DeviceLost`] and what it had generated (after `events`, the
    /// step's so far). Later submissions are refused the same way.
    fn lose_device(&mut self, mut events: Vec<Event>) -> Result<Vec<Event>, EngineError> {
        self.in_flight.clear();
        self.open = None;
        let reason = self.backend.lost_reason().unwrap_or_default();
        events.extend(self.sched.lose_all(&mut self.kv, &reason)?);
        Ok(events)
    }

    /// Whether the engine's GPU device is lost: it runs nothing more (see
    /// [`EngineError::DeviceLost`]).
    pub fn is_lost(&self) -> bool {
        self.backend.is_lost()
    }

    /// The sampler's parameters of a step's logit rows, `None` when all are greedy. Writes the
    /// penalty windows the plan carries into their sequences' rings and keeps where each ring
    /// stands: a row appends its token at its ring's head on the GPU, so the next step's ring is
    /// one longer without the CPU knowing the token.
    fn row_params(&mut self, plan: &Plan, rows: &[StepRow], logit_rows: &[u32]) -> Result<Option<Vec<RowParams>>, EngineError> {
        if plan.sampling().iter().all(Option::is_none) {
            return Ok(None);
        }
        let cap = MAX_REPETITION_WINDOW;
        let mut params = Vec::with_capacity(logit_rows.len());
        for (&r, sampling) in logit_rows.iter().zip(plan.sampling()) {
            let slot = rows[r as usize].slot;
            let counter = rows[r as usize].position + 1;
            let Some(s) = sampling else {
                params.push(RowParams::new(&SamplingParams::greedy(), counter, HistoryRing { head: 0, len: 0, ring: slot })?);
                continue;
            };
            let ring = &mut self.rings[slot as usize];
            if let Some(window) = &s.window {
                self.backend.write_history(slot, window)?;
                *ring = HistoryRing { head: window.len() as u32 % cap, len: window.len() as u32, ring: slot };
            }
            let mut row = RowParams::new(&s.params, s.counter, *ring)?;
            row.flags |= RowParams::APPEND_HISTORY;
            if s.constrained {
                row.flags |= RowParams::MASKED;
            }
            params.push(row);
            *ring = HistoryRing { head: (ring.head + 1) % cap, len: (ring.len + 1).min(cap), ring: slot };
        }
        Ok(Some(params))
    }

    /// Submits a planned step (its rows' K/V slots reserved) and queues it for reading; a step
    /// that cannot be submitted fails its requests. A step whose masks wait for the step in
    /// flight ([`Plan::awaits_masks`]) has only its forward pass submitted: it waits in
    /// `open` for [`Engine::choose_open`].
    fn launch(&mut self, plan: Plan, events: &mut Vec<Event>) -> Result<(), EngineError> {
        let rows: Vec<StepRow> = plan
            .rows()
            .iter()
            .map(|r| StepRow { token: r.token.unwrap_or(StepRow::FED), position: r.position, table_base: self.kv.table_base(r.seq), slot: r.seq.0 })
            .collect();
        let logit_rows = plan.logit_rows();
        let params = match self.row_params(&plan, &rows, &logit_rows) {
            Ok(params) => params,
            Err(e) => {
                events.extend(self.sched.fail(&mut self.kv, &plan, &e)?);
                return Ok(());
            }
        };
        if plan.awaits_masks() {
            match self.backend.submit_forward(&self.kv, (&rows, &logit_rows)) {
                Ok(()) => self.open = Some((plan, params)),
                Err(e) => events.extend(self.sched.fail(&mut self.kv, &plan, &e.into())?),
            }
            return Ok(());
        }
        let masks = self.sched.masks(&plan);
        let choose = match &params {
            Some(p) => Choose::Sample(p, &masks),
            None => Choose::Argmax,
        };
        match self.backend.submit(&self.kv, (&rows, &logit_rows), (Logits::Argmax, choose)) {
            Ok(pending) => self.in_flight.push_back((plan, pending)),
            Err(e) => events.extend(self.sched.fail(&mut self.kv, &plan, &e.into())?),
        }
        Ok(())
    }

    /// Chooses the tokens of the step whose forward pass [`Engine::launch`] submitted ahead,
    /// now that the step before has committed: each constrained row with its request's mask as
    /// it stands (a row whose request ended meanwhile is chosen unmasked and discarded), and
    /// queues it for reading. A step that cannot be submitted fails its requests.
    fn choose_open(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        let Some((plan, mut params)) = self.open.take() else { return Ok(events) };
        let masks = self.sched.masks(&plan);
        if let Some(params) = params.as_mut() {
            for (k, p) in params.iter_mut().enumerate() {
                if !masks.iter().any(|&(m, _)| m as usize == k) {
                    p.flags &= !RowParams::MASKED;
                }
            }
        }
        let choose = match &params {
            Some(p) => Choose::Sample(p, &masks),
            None => Choose::Argmax,
        };
        match self.backend.submit_choice(&self.kv, (Logits::Argmax, choose)) {
            Ok(pending) => self.in_flight.push_back((plan, pending)),
            Err(e) => events.extend(self.sched.fail(&mut self.kv, &plan, &e.into())?),
        }
        Ok(events)
    }

    /// Runs steps until every submitted request has finished, calling `on_event` for each event.
    pub async fn run_to_completion(&mut self, on_event: &mut dyn FnMut(&Event)) -> Result<(), EngineError> {
        while self.has_work() {
            for e in self.step().await? {
                on_event(&e);
            }
        }
        Ok(())
    }

    /// Generates from prompt token ids, calling `on_token` for every token; `on_token` returning
    /// false aborts the generation (finish reason `abort`). This is [`Engine::submit`] and
    /// [`Engine::step`] until the request ends; other requests' events meanwhile are kept for
    /// the next `step`.
    ///
    /// The request starts from the longest prefix of `prompt` whose K/V the prefix cache holds
    /// (earlier turns of a conversation, a shared system prompt) and computes only the rest; when
    /// it ends (finished, stopped or aborted) its K/V go to the cache for later requests.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        let id = self.submit(prompt.to_vec(), request.clone())?;
        loop {
            let mut events = match self.step_once().await {
                Ok(events) => events.into_iter(),
                Err(e) => {
                    // The caller gets the error; the request must not run on without it.
                    let _ = self.abort(id);
                    return Err(e);
                }
            };
            while let Some(event) = events.next() {
                match event {
                    Event::Token { id: of, token, text } if of == id => {
                        if !on_token(&TokenEvent { id: token, text: &text }) {
                            self.backlog.extend(events);
                            return self.abort(id)?.ok_or_else(|| EngineError::InvalidArgument(format!("request {id:?} vanished")));
                        }
                    }
                    Event::Finished { id: of, result } if of == id => {
                        self.backlog.extend(events);
                        return result;
                    }
                    Event::Admitted { id: of, .. } if of == id => {}
                    other => self.backlog.push(other),
                }
            }
        }
    }

    // ---- One sequence outside the scheduler: scoring, benchmarks, profiles ---------------

    /// Allocates a sequence for `tokens`, runs `work` on it and frees it (the K/V go nowhere).
    async fn scratch_sequence<T>(&mut self, work: impl AsyncFnOnce(&mut Self, SeqId) -> Result<T, EngineError>) -> Result<T, EngineError> {
        let seq = self.kv.allocate()?;
        let out = work(self, seq).await;
        self.kv.free(seq)?;
        out
    }

    async fn prefill(&mut self, seq: SeqId, tokens: &[u32], start: u32, first_logit: u32, read: Logits) -> Result<(Vec<u32>, Vec<f32>), EngineError> {
        let out = self.backend.prefill(&mut self.kv, seq, tokens, (start, first_logit), read).await?;
        self.verify()?;
        Ok(out)
    }

    async fn decode(&mut self, seq: SeqId, token: u32, read: Logits) -> Result<(u32, Option<Vec<f32>>), EngineError> {
        let len = self.kv.len(seq)?;
        if len >= self.kv.max_seq_len {
            return Err(EngineError::ContextOverflow { prompt: len as usize + 1, limit: self.kv.max_seq_len as usize });
        }
        let out = self.backend.decode(&mut self.kv, seq, token, read).await?;
        self.verify()?;
        Ok(out)
    }

    /// Computes `tokens` through the prefix cache like a request's prompt (reusing the cached
    /// prefix, computing the rest) and caches them; returns the last token's logits (with
    /// `read` = Full) and the number of tokens that came from the cache.
    async fn prefill_cached(&mut self, tokens: &[u32], read: Logits) -> Result<(Vec<f32>, u32), EngineError> {
        self.check_tokens(tokens)?;
        let (seq, hit) = self.kv.allocate_for_prompt(tokens)?;
        let last = tokens.len() as u32 - 1;
        match self.prefill(seq, &tokens[hit as usize..], hit, last, read).await {
            Ok((_, logits)) => {
                self.kv.finish(seq, tokens)?;
                Ok((logits, hit))
            }
            Err(e) => {
                // K/V written by a failed step are not trusted: nothing goes to the cache.
                self.kv.free(seq)?;
                Err(e)
            }
        }
    }

    /// The logits predicting the token after `prompt`, computed through the prefix cache like a
    /// generation's first step (and caching `prompt` afterwards). Returns the logits and the
    /// number of prompt tokens that came from the cache.
    pub async fn next_token_logits(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, u32), EngineError> {
        self.prefill_cached(prompt, Logits::Full).await
    }

    /// Profiles one prefill of `prompt_tokens` tokens and one steady-state decode step after it
    /// (see [`crate::profile`]), through the engine's own paths: a first prefill on a scratch
    /// sequence (graphs built, pipelines compiled); decode steps of a request run by the engine's
    /// own loop, steps planned ahead as in any generation (see [`Engine::profile_decode`]); then
    /// a second prefill, measured, and a third, timed per kernel. Per-kernel times come from GPU timestamps when the device has
    /// them and `timestamps` is true, else from each kernel run alone on the host clock.
    /// Needs an idle engine and a context of `prompt_tokens + PROFILE_EXTRA_TOKENS`.
    pub async fn profile(&mut self, prompt_tokens: u32, timestamps: bool) -> Result<Profile, EngineError> {
        let n = prompt_tokens;
        if self.has_work() {
            return Err(EngineError::InvalidArgument("requests are running: profile when they have finished".into()));
        }
        if n == 0 || n + PROFILE_EXTRA_TOKENS > self.kv.max_seq_len {
            return Err(EngineError::InvalidArgument(format!(
                "a profile of {n} prompt tokens needs a context of {} tokens and this engine holds {} (prompt tokens must be at least 1)",
                n + PROFILE_EXTRA_TOKENS,
                self.kv.max_seq_len
            )));
        }
        let has_timestamps = self.backend.ctx().is_some_and(|c| c.has_timestamps());
        let method = if timestamps && has_timestamps { TimingMethod::Timestamps } else { TimingMethod::WallClockPerKernel };
        let vocab = self.config().vocab;
        let tokens: Vec<u32> = (0..n).map(|i| (100 + i) % vocab).collect();
        let (prefill_cold, per_kernel) = self.profile_cold_prefill(&tokens, method).await?;
        let decode = self.profile_decode(&tokens, method, per_kernel).await?;
        let prefill = self.profile_prefill(&tokens, method).await?;
        Ok(Profile {
            adapter: self.adapter_name(),
            variant: self.variant_name(),
            method,
            prompt_tokens: n,
            prefill_chunk: self.options.prefill_chunk,
            lookahead: self.options.sched.lookahead,
            prefill_cold,
            prefill,
            decode_warmup_steps: PROFILE_WARMUP_DECODE,
            decode_samples: PROFILE_DECODE_SAMPLES,
            decode,
        })
    }

    /// On a scratch sequence: the cold prefill of `tokens` and, without timestamps, one decode
    /// step after it timed kernel by kernel.
    async fn profile_cold_prefill(&mut self, tokens: &[u32], method: TimingMethod) -> Result<(ColdStep, Option<TimedRun>), EngineError> {
        self.scratch_sequence(async |e: &mut Self, seq| {
            let last = tokens.len() as u32 - 1;
            let pipelines = |e: &Self| e.backend.ctx().map_or(0, |c| c.pipeline_count());
            let (before, mark) = (pipelines(e), e.mark());
            let (ids, _) = e.prefill(seq, tokens, 0, last, Logits::Argmax).await?;
            let (counters, wall) = e.since(mark);
            let cold = ColdStep::new(&counters, wall, (pipelines(e) - before) as u64);
            if method == TimingMethod::Timestamps {
                return Ok((cold, None));
            }
            let pos = e.kv.append(seq, 1)?;
            let rows = Runner::rows_of(&e.kv, seq, &ids[ids.len() - 1..], pos);
            let dispatches = e.backend.time_kernels(&e.kv, &rows).await?;
            Ok((cold, Some(TimedRun { dispatches, span_ms: None })))
        })
        .await
    }

    /// Steady-state decode through the engine's own loop ([`Engine::step`], steps planned ahead
    /// as configured): a greedy request of `tokens` that ignores end-of-generation tokens runs
    /// [`PROFILE_WARMUP_DECODE`] decode steps, then [`PROFILE_DECODE_SAMPLES`] measured ones
    /// (counters and wall time around each `step` call that yields its next token; the one of
    /// median wall time is reported), then with timestamps as many captured (the one of median
    /// GPU time gives the kernels), and is aborted. `per_kernel` gives the kernels otherwise.
    // Long: one loop over the request's steps, whose phases (warm-up, measured, captured) share its state.
    async fn profile_decode(&mut self, tokens: &[u32], method: TimingMethod, per_kernel: Option<TimedRun>) -> Result<StepProfile, EngineError> {
        let (warmup, samples_wanted) = (PROFILE_WARMUP_DECODE as usize, PROFILE_DECODE_SAMPLES as usize);
        let request = GenerateRequest {
            max_tokens: PROFILE_EXTRA_TOKENS,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: true,
            ..Default::default()
        };
        let id = self.submit(tokens.to_vec(), request)?;
        // Tokens the request has produced (the first comes from its prefill).
        let mut produced = 0usize;
        let mut samples: Vec<(Counters, f64, u32)> = Vec::new();
        let mut runs: Vec<TimedRun> = Vec::new();
        let measured = loop {
            let capturing = method == TimingMethod::Timestamps && samples.len() == samples_wanted;
            if samples.len() == samples_wanted && (!capturing || runs.len() == samples_wanted) {
                break Ok(());
            }
            if !self.has_work() {
                break Err(EngineError::InvalidArgument("the profile's request ended before its steps were measured".into()));
            }
            if capturing {
                let armed = samples.iter().map(|s| s.0.dispatches).max().unwrap_or(0) as u32 + PROFILE_CAPTURE_SLACK;
                if let Err(e) = self.gpu_ctx().begin_capture(armed) {
                    break Err(e.into());
                }
            }
            let mark = self.mark();
            let stepped = self.step().await;
            let (counters, wall) = self.since(mark);
            if capturing {
                // Ended whatever the step did, so that the next profile can arm one.
                match self.gpu_ctx().end_capture().await {
                    Ok(captured) => runs.push(TimedRun::from(captured)),
                    Err(e) => break Err(e.into()),
                }
            }
            let events = match stepped {
                Ok(events) => events,
                Err(e) => break Err(e),
            };
            let new = events.iter().filter(|e| matches!(e, Event::Token { id: of, .. } if *of == id)).count();
            if !capturing && produced > warmup && new == 1 {
                samples.push((counters, wall, tokens.len() as u32 + produced as u32));
            }
            produced += new;
        };
        // The request's K/V go to the prefix cache like any request's; nothing else stays behind.
        self.abort(id)?;
        measured?;
        samples.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (counters, wall, context) = samples[samples.len() / 2];
        let times = match per_kernel {
            Some(times) => times,
            None => {
                runs.sort_by(|a, b| a.total_ms().total_cmp(&b.total_ms()));
                runs.swap_remove(runs.len() / 2)
            }
        };
        Ok(StepProfile::new(1, context, (&counters, wall), &times))
    }

    /// A warm prefill of `tokens` measured on one scratch sequence, timed per kernel on another.
    async fn profile_prefill(&mut self, tokens: &[u32], method: TimingMethod) -> Result<StepProfile, EngineError> {
        let (n, last) = (tokens.len() as u32, tokens.len() as u32 - 1);
        let (counters, wall) = self
            .scratch_sequence(async |e: &mut Self, seq| {
                let mark = e.mark();
                e.prefill(seq, tokens, 0, last, Logits::Argmax).await?;
                Ok(e.since(mark))
            })
            .await?;
        let times = self
            .scratch_sequence(async |e: &mut Self, seq| match method {
                TimingMethod::Timestamps => {
                    let ctx = e.gpu_ctx();
                    ctx.begin_capture(counters.dispatches as u32 + PROFILE_CAPTURE_SLACK)?;
                    let stepped = e.prefill(seq, tokens, 0, last, Logits::Argmax).await;
                    let captured = ctx.end_capture().await;
                    stepped?;
                    Ok(TimedRun::from(captured?))
                }
                TimingMethod::WallClockPerKernel => {
                    e.kv.append(seq, n)?;
                    let rows = Runner::rows_of(&e.kv, seq, tokens, 0);
                    Ok(TimedRun { dispatches: e.backend.time_kernels(&e.kv, &rows).await?, span_ms: None })
                }
            })
            .await?;
        Ok(StepProfile::new(n, n, (&counters, wall), &times))
    }

    /// The counters and the clock now, for [`Engine::since`].
    fn mark(&self) -> (Counters, f64) {
        (self.counters(), crate::time::now_ms())
    }

    /// The GPU context's counters (all zero on the CPU backend).
    fn counters(&self) -> Counters {
        self.backend.ctx().map(|c| c.counters()).unwrap_or_default()
    }

    /// The GPU context, for timestamp captures, which [`Engine::profile`] asks for only where
    /// the device has timestamps (so never on the CPU backend).
    fn gpu_ctx(&self) -> Arc<Context> {
        self.backend.ctx().expect("timestamps are a GPU's").clone()
    }

    /// What the context did and the milliseconds that passed since `mark`.
    fn since(&self, (counters, t0): (Counters, f64)) -> (Counters, f64) {
        (self.counters().since(&counters), crate::time::now_ms() - t0)
    }

    /// For benchmarks: generates from `prompt` through the scheduler, like any request, the
    /// first token and then exactly `n` greedy tokens whatever they are (end-of-generation tokens
    /// included; fewer at the context limit). Returns (tokens decoded after the first, their
    /// milliseconds).
    pub async fn generate_ignoring_eos(&mut self, prompt: &[u32], n: u32) -> Result<(u32, f64), EngineError> {
        let (tokens, ms) = self.generate_ignoring_eos_under(prompt, n, None).await?;
        Ok((tokens.len().saturating_sub(1) as u32, ms))
    }

    /// [`Engine::generate_ignoring_eos`] under `constraint` (which may end it early, when its
    /// output is complete). Returns every generated token (the first included) and the
    /// milliseconds of those after the first.
    pub async fn generate_ignoring_eos_under(&mut self, prompt: &[u32], n: u32, constraint: Option<Constraint>) -> Result<(Vec<u32>, f64), EngineError> {
        let request = GenerateRequest { max_tokens: n.saturating_add(1), ignore_eos: true, constraint, ..Default::default() };
        let mut first = None;
        let g = self
            .generate(prompt, &request, &mut |_| {
                first.get_or_insert_with(crate::time::now_ms);
                true
            })
            .await?;
        Ok((g.tokens, first.map_or(0.0, |t0| crate::time::now_ms() - t0)))
    }

    /// Teacher forcing: reads `ids` and, for every position p from `from - 1` to `len - 1`,
    /// returns the top-5 (id, logit) predicting position p + 1.
    pub async fn score(&mut self, ids: &[u32], from: usize, mode: ScoreMode) -> Result<Vec<Vec<(u32, f32)>>, EngineError> {
        let rows = self.score_logits(ids, from, mode).await?;
        Ok(rows.iter().map(|row| top_k(row, 5)).collect())
    }

    /// Teacher forcing with full logits: one row of `vocab` logits per position p from `from - 1`
    /// to `len - 1` (the prediction for position p + 1).
    pub async fn score_logits(&mut self, ids: &[u32], from: usize, mode: ScoreMode) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_tokens(ids)?;
        if from == 0 || from > ids.len() {
            return Err(EngineError::InvalidArgument(format!("from must be in 1..={}, got {from}", ids.len())));
        }
        let vocab = self.config().vocab as usize;
        self.scratch_sequence(async |e: &mut Self, seq| {
            let mut out = Vec::with_capacity(ids.len() - from + 1);
            match mode {
                ScoreMode::Prefill => {
                    let (_, logits) = e.prefill(seq, ids, 0, from as u32 - 1, Logits::Full).await?;
                    out.extend(logits.chunks(vocab).map(|row| row.to_vec()));
                }
                ScoreMode::Decode => {
                    let (_, logits) = e.prefill(seq, &ids[..from], 0, from as u32 - 1, Logits::Full).await?;
                    out.push(logits);
                    for &t in &ids[from..] {
                        let (_, logits) = e.decode(seq, t, Logits::Full).await?;
                        out.push(logits.unwrap_or_default());
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    // ---- KV transfer ---------------------------------------------------------------------

    /// Computes and caches the K/V of `tokens` that the prefix cache lacks (no logits are read).
    pub async fn cache_prefix(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        self.check_tokens(tokens)?;
        if self.kv.peek_prefix(tokens) as usize >= tokens.len() {
            return Ok(());
        }
        self.prefill_cached(tokens, Logits::Argmax).await.map(|_| ())
    }

    /// A snapshot of the K/V of `tokens` (a conversation's history: prompt and reply ids),
    /// computing whatever part is not cached. See [`crate::kv::snapshot`] for the format.
    pub async fn export_snapshot(&mut self, tokens: &[u32]) -> Result<Vec<u8>, EngineError> {
        self.cache_prefix(tokens).await?;
        Ok(self.kv.export_prefix(tokens).await?)
    }

    /// Loads a snapshot into the prefix cache; the next request whose prompt starts with its
    /// tokens reuses them. Returns the tokens. Refused with a typed error, changing nothing, if
    /// it comes from another model, KV dtype, layout, block size or format version, or is damaged.
    pub fn import_snapshot(&mut self, bytes: &[u8]) -> Result<Vec<u32>, EngineError> {
        Ok(self.kv.import(bytes, self.config().vocab)?)
    }
}

fn out_of_memory(message: String) -> EngineError {
    EngineError::Gpu(GpuError::OutOfMemory(message))
}

/// With a memory cap of `cap` bytes: measures what the forward graphs of a generation hold at
/// most (a decode row, a prefill chunk, a full batch step; built against a one-block KV cache and
/// dropped again, their pipelines staying compiled), then sizes the KV pool to what the weights
/// and they leave (the pool asked for, if it fits), or refuses the cap as
/// [`ErrorKind::OutOfMemory`] naming what does not fit.
fn fit_pool(ctx: &Arc<Context>, model: &Model, options: &EngineOptions, cache: &mut CacheConfig, cap: u64) -> Result<(), EngineError> {
    let weights = model.weights.bytes();
    if weights > cap {
        return Err(out_of_memory(format!("the weights take {weights} bytes, over the {cap}-byte memory cap")));
    }
    fit_pool_to(cap, weights, largest_steps(ctx, model, options, cache)?, options, cache)
}

/// Sizes the KV pool of `cache` to what `cap` leaves after `weights` and `graphs` (a step's
/// activations), the pool taking `per_token` bytes a token, or refuses the cap (see [`fit_pool`]).
fn fit_pool_to(cap: u64, weights: u64, (graphs, per_token): (u64, u64), options: &EngineOptions, cache: &mut CacheConfig) -> Result<(), EngineError> {
    if weights > cap {
        return Err(out_of_memory(format!("the weights take {weights} bytes, over the {cap}-byte memory cap")));
    }
    let block = cache.block_size.max(1);
    let room = cap.saturating_sub(weights + graphs);
    let fits = match cache.layout {
        KvLayout::Paged => (room / per_token).min(u32::MAX as u64) as u32 / block * block,
        KvLayout::Contiguous => u32::MAX,
    };
    let asked = match cache.layout {
        KvLayout::Paged if options.pool_tokens != 0 => Some(cache.pool_tokens),
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

/// The device bytes the largest steps of a generation hold (a decode row, a prefill chunk, a
/// full batch step, with the runner's rings), built against a one-block KV cache of `cache`'s
/// shape and dropped again (their pipelines stay compiled); and the KV bytes per token.
fn largest_steps(ctx: &Arc<Context>, model: &Model, options: &EngineOptions, cache: &CacheConfig) -> Result<(u64, u64), EngineError> {
    let block = cache.block_size.max(1);
    let probe_kv = KvCache::new(ctx, &model.config.kv_shape(), CacheConfig { pool_tokens: block, local_pool_tokens: block, prefix_cache: false, ..*cache })?;
    let mut probe = Runner::new(ctx, options.prefill_chunk, probe_kv.max_seqs())?;
    let chunk = options.prefill_chunk.max(options.sched.step_tokens);
    probe.build_largest(ctx, model, &probe_kv, chunk, options.sched.step_tokens, options.sched.max_batch)?;
    Ok((probe.budget_bytes(), probe_kv.bytes_per_token().max(1)))
}

/// The KV cache's configuration for `options`.
fn cache_config(ctx: Option<&Arc<Context>>, config: &ModelConfig, options: &EngineOptions) -> CacheConfig {
    let max_context = match options.max_context {
        0 => config.context_length.min(4096),
        n => n.min(config.context_length.max(1)),
    };
    let block_size = options.block_size.max(1);
    CacheConfig {
        layout: options.kv_layout,
        dtype: options.kv_dtype,
        block_size: options.block_size,
        // Default: room for the longest sequence, capped by what one layer's buffer may bind
        // on this device.
        pool_tokens: if options.pool_tokens == 0 {
            let device_max = ctx.map_or(u64::MAX, |ctx| KvPool::max_blocks(ctx, &config.kv_shape(), block_size) * block_size as u64);
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
