//! The JavaScript surface of the engine (wasm-bindgen): load a model from bytes, submit chat
//! requests (or raw-text completions, for base models without a chat template) and step the continuous-batching scheduler (or run one `chat` with a token
//! callback), report the KV pool. Thin on purpose: every decision lives in [`Engine`]; this
//! module only converts values and errors at the boundary. The Web Worker's step loop, abort
//! signals and the model download live in JS (`js/worker.js`).
//!
//! Nothing here panics: bad options, a busy engine, or a throwing callback all come back to JS
//! as a rejected promise with an `Error` whose `code` names the kind of failure
//! (`WEBGPU_UNAVAILABLE`, `MODEL_FORMAT`, ...) and whose message says what to fix. The code
//! comes from the engine error's [`ErrorKind`]; this module sees the engine only through
//! `crate::engine`, never the layers below it.
// Long: the whole wasm boundary is this file (tests/layers.rs: only web.rs touches the wasm crates), each export a thin call.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::engine::{
    estimate, AdapterClass, BackendChoice, ChatFormatKind, Constraint, Context, DeviceBudget, DeviceLimits, Engine, EngineError, EngineOptions, EngineStats,
    ErrorKind, Event, GenerateRequest, Generation, KvDtype, KvLayout, LoadEvent, Message, Prediction, Profile, ProfileSummary, RequestId, SchedStats,
    Speculative, TokenEvent, Tools,
};
use crate::gguf::{Gguf, Prefix, ReadAhead, ReadAt};

/// What kind of failure an error is; JS sees it as `error.code` ([`ErrorCode::as_str`]). A
/// failure of the engine carries its [`ErrorKind`], whose code is the kind's own
/// ([`ErrorKind::code`]); only the failures this layer adds have codes of their own here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// A failure of the engine, or a refusal of this layer's that has the same meaning (a bad
    /// option is [`ErrorKind::InvalidArgument`]).
    Kind(ErrorKind),
    /// A generation is running on this engine.
    Busy,
    /// The token callback threw.
    Callback,
}

impl ErrorCode {
    /// The codes only this layer gives (every [`ErrorKind`]'s comes as [`ErrorCode::Kind`]).
    pub const WEB_ONLY: &'static [ErrorCode] = &[ErrorCode::Busy, ErrorCode::Callback];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Kind(kind) => kind.code(),
            ErrorCode::Busy => "BUSY",
            ErrorCode::Callback => "CALLBACK_ERROR",
        }
    }

    /// Every code this layer can give JS: each kind's, then its own.
    pub fn all() -> impl Iterator<Item = ErrorCode> {
        ErrorKind::ALL.iter().map(|&kind| ErrorCode::Kind(kind)).chain(ErrorCode::WEB_ONLY.iter().copied())
    }
}

/// An error on its way to JS: a JS `Error` with `name = "PagedlmError"` and `code`.
#[derive(Debug)]
pub struct WebError {
    pub code: ErrorCode,
    pub message: String,
}

impl WebError {
    fn new(code: impl Into<ErrorCode>, message: impl Into<String>) -> WebError {
        WebError { code: code.into(), message: message.into() }
    }

    /// A bad option or argument from JS.
    fn invalid(message: impl Into<String>) -> WebError {
        WebError::new(ErrorKind::InvalidArgument, message)
    }
}

impl From<ErrorKind> for ErrorCode {
    fn from(kind: ErrorKind) -> ErrorCode {
        ErrorCode::Kind(kind)
    }
}

impl From<EngineError> for WebError {
    fn from(e: EngineError) -> WebError {
        WebError::new(e.kind(), e.to_string())
    }
}

impl From<WebError> for JsValue {
    fn from(e: WebError) -> JsValue {
        let error = js_sys::Error::new(&e.message);
        error.set_name("PagedlmError");
        // Setting a property on a fresh, unfrozen Error cannot fail.
        let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &JsValue::from_str(e.code.as_str()));
        error.into()
    }
}

/// Options of `WebEngine.load`; every field is optional.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LoadOptions {
    /// Longest sequence (prompt + reply) the engine holds; absent = the engine's default.
    max_context: Option<u32>,
    /// Prompt rows per prefill pass.
    prefill_chunk: Option<u32>,
    /// `"f32"` (default) or `"int8"`.
    kv_dtype: Option<KvDtype>,
    /// `"paged"` (default) or `"contiguous"`.
    kv_layout: Option<KvLayout>,
    /// Tokens per KV block (paged).
    block_size: Option<u32>,
    /// Token slots in the KV pool (paged); absent = room for the longest sequence.
    pool_tokens: Option<u32>,
    /// Reuse the KV of earlier turns and shared prompt prefixes (default true).
    prefix_cache: Option<bool>,
    /// Most requests decoding together in one step (continuous batching).
    max_batch: Option<u32>,
    /// Most token rows (decode + prefill) per step.
    step_tokens: Option<u32>,
    /// Run as on a device whose largest storage binding (and buffer) is this many MiB.
    max_binding_mib: Option<u32>,
    /// `"adapter"` (default) or `"phone"`: WebGPU's default limits, 128 MiB buffers.
    device_limits: Option<String>,
    /// Cap on the GPU bytes the engine holds (weights, KV pool, activations).
    max_memory_bytes: Option<f64>,
    /// Tune the kernels as for `"cpu"`, `"integrated"` or `"discrete"` adapters; absent = the adapter's own.
    adapter_class: Option<String>,
    /// Use the adapter's optional features (subgroups, shader-f16) where offered (default true).
    optional_features: Option<bool>,
    /// `"auto"` (default: WebGPU on a real GPU, else the CPU backend), `"webgpu"` or `"cpu"`.
    backend: Option<String>,
    /// `"auto"` (draft tokens by prompt lookup and from a request's `prediction`, verified in one
    /// step) or `"off"` (the default): a request's own `speculative` wins.
    speculative: Option<String>,
    /// Most draft tokens per sequence and step (default 15; prompt lookup drafts at most 7).
    max_draft: Option<u32>,
    /// `estimateMemory` only (loads ignore it): what the device allows, `{maxBufferSize?,
    /// maxStorageBufferBindingSize?, memoryBytes?}`.
    limits: Option<DeviceBudget>,
}

impl LoadOptions {
    /// The engine's options: [`EngineOptions::for_users`], the defaults the CLI starts from too,
    /// with what JS set.
    fn engine_options(self) -> Result<EngineOptions, WebError> {
        let mut o = EngineOptions::for_users();
        o.max_context = self.max_context.unwrap_or(o.max_context);
        o.prefill_chunk = self.prefill_chunk.unwrap_or(o.prefill_chunk);
        o.kv_dtype = self.kv_dtype.unwrap_or(o.kv_dtype);
        o.kv_layout = self.kv_layout.unwrap_or(o.kv_layout);
        o.block_size = self.block_size.unwrap_or(o.block_size);
        o.pool_tokens = self.pool_tokens.unwrap_or(o.pool_tokens);
        o.prefix_cache = self.prefix_cache.unwrap_or(o.prefix_cache);
        o.sched.max_batch = self.max_batch.unwrap_or(o.sched.max_batch);
        o.sched.step_tokens = self.step_tokens.unwrap_or(o.sched.step_tokens);
        o.max_binding_bytes = self.max_binding_mib.map(|mib| u64::from(mib) << 20).or(o.max_binding_bytes);
        if let Some(name) = self.adapter_class.as_deref() {
            o.adapter_class = Some(
                AdapterClass::parse(name)
                    .ok_or_else(|| WebError::invalid(format!("adapterClass must be \"cpu\", \"integrated\" or \"discrete\", not {name:?}")))?,
            );
        }
        o.optional_features = self.optional_features.unwrap_or(o.optional_features);
        if let Some(name) = self.backend.as_deref() {
            o.backend =
                BackendChoice::parse(name).ok_or_else(|| WebError::invalid(format!("backend must be \"auto\", \"webgpu\" or \"cpu\", not {name:?}")))?;
        }
        if let Some(name) = self.speculative.as_deref() {
            o.sched.speculative = speculative(name)?;
        }
        o.sched.max_draft = self.max_draft.unwrap_or(o.sched.max_draft);
        if let Some(bytes) = self.max_memory_bytes {
            if !(bytes.is_finite() && bytes >= 1.0 && bytes <= 2f64.powi(53)) {
                return Err(WebError::invalid(format!("maxMemoryBytes must be a positive number of bytes, not {bytes}")));
            }
            o.max_memory_bytes = Some(bytes as u64);
        }
        if let Some(name) = self.device_limits.as_deref() {
            o.device_limits =
                DeviceLimits::parse(name).ok_or_else(|| WebError::invalid(format!("deviceLimits must be \"adapter\" or \"phone\", not {name:?}")))?;
        }
        Ok(o)
    }
}

/// `"auto"` or `"off"`, for `speculative`.
fn speculative(name: &str) -> Result<Speculative, WebError> {
    Speculative::parse(name).ok_or_else(|| WebError::invalid(format!("speculative must be \"auto\" or \"off\", not {name:?}")))
}

/// `stop` as OpenAI accepts it: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The [`ChatOptions`] a completion-mode request (`submitPrompt`) does not take.
const CHAT_ONLY_OPTIONS: &[&str] = &["tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"];

/// Options of `WebEngine.chat`, OpenAI-style snake_case names; every field is optional.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ChatOptions {
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_k: Option<u32>,
    top_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    /// OpenAI's `{type: "text" | "json_object" | "json_schema", json_schema?: {name, schema, strict}}`.
    response_format: Option<serde_json::Value>,
    /// A grammar in llguidance's Lark syntax the output must match.
    grammar: Option<String>,
    /// OpenAI's `[{type: "function", function: {name, description, parameters}}]`.
    tools: Option<serde_json::Value>,
    /// `"auto" | "none" | "required" | {type: "function", function: {name}}`.
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<bool>,
    /// Extra variables for the model's chat template (`{enable_thinking: false}` for Qwen3).
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `"auto"` or `"off"`: whether this request drafts (the engine's `speculative` otherwise).
    speculative: Option<String>,
    /// OpenAI's predicted outputs: `{type: "content", content: string}`.
    prediction: Option<serde_json::Value>,
}

impl ChatOptions {
    /// The request: [`GenerateRequest::default`], the defaults the CLI starts from too, with
    /// what JS set.
    fn request(self) -> Result<GenerateRequest, WebError> {
        let mut request = GenerateRequest::default();
        request.constraint = match (&self.response_format, self.grammar) {
            (Some(_), Some(_)) => return Err(WebError::invalid("response_format and grammar exclude each other: give one")),
            (Some(format), None) => Constraint::from_response_format(format).map_err(EngineError::from)?,
            (None, grammar) => grammar.map(Constraint::Lark),
        };
        request.tools = Tools::from_options(self.tools.as_ref(), self.tool_choice.as_ref(), self.parallel_tool_calls).map_err(EngineError::from)?;
        request.chat_template_kwargs = self.chat_template_kwargs.unwrap_or_default();
        request.max_tokens = self.max_tokens.unwrap_or(request.max_tokens);
        request.speculative = self.speculative.as_deref().map(speculative).transpose()?;
        if let Some(p) = &self.prediction {
            request.prediction = Prediction::from_openai(p).map_err(WebError::invalid)?;
        }
        let sampling = &mut request.sampling;
        sampling.temperature = self.temperature.unwrap_or(sampling.temperature);
        sampling.top_k = self.top_k.unwrap_or(sampling.top_k);
        sampling.top_p = self.top_p.unwrap_or(sampling.top_p);
        sampling.repetition_penalty = self.repetition_penalty.unwrap_or(sampling.repetition_penalty);
        sampling.seed = self.seed.unwrap_or(sampling.seed);
        match self.stop {
            None => {}
            Some(Stop::One(s)) => request.stop = vec![s],
            Some(Stop::Many(v)) => request.stop = v,
        }
        Ok(request)
    }
}

#[derive(Serialize)]
struct Memory {
    weights_bytes: u64,
    kv_bytes: u64,
}

/// The model's shape as JS sees it: [`crate::engine::ModelConfig`] with its 64-bit fingerprint as hex, since a
/// JS number holds integers only up to 2^53.
#[derive(Serialize)]
struct ModelInfo {
    #[serde(flatten)]
    config: ModelConfigView,
    fingerprint: String,
    /// `general.architecture`: "llama" or "gemma3" (the same as `arch`).
    architecture: String,
    /// Tokens a local (sliding-window) layer attends to; null when every layer is global.
    sliding_window: Option<u32>,
    /// The family of the chat template the prompt of `chat`/`submit` is rendered with (the file's
    /// own Jinja template, whatever the family): "chatml", "gemma", "jinja" for another family
    /// (Llama 3, Phi, DeepSeek), or null for a base model (no chat template), which only
    /// completes raw text (`submitPrompt`).
    chat_template: Option<&'static str>,
    /// Tensors of each weight type in the file: `{"F32": 61, "Q4_1": 210, "Q8_0": 1}`.
    weight_types: BTreeMap<String, u32>,
}

#[derive(Serialize)]
struct ModelConfigView {
    arch: String,
    name: String,
    n_layers: u32,
    hidden: u32,
    ffn: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    vocab: u32,
    context_length: u32,
    rope_base: f32,
    rms_eps: f32,
}

impl ModelInfo {
    fn of(engine: &Engine, chat_template: Option<&'static str>) -> ModelInfo {
        let c = engine.config();
        ModelInfo {
            config: ModelConfigView {
                arch: c.arch.clone(),
                name: c.name.clone(),
                n_layers: c.n_layers,
                hidden: c.hidden,
                ffn: c.ffn,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                vocab: c.vocab,
                context_length: c.context_length,
                rope_base: c.rope_base,
                rms_eps: c.rms_eps,
            },
            fingerprint: format!("{:016x}", c.fingerprint),
            architecture: c.arch.clone(),
            sliding_window: c.sliding_window,
            chat_template,
            weight_types: engine.weight_types().clone(),
        }
    }
}

/// What `info()` reports; fixed at load, so the page may ask while a generation holds the engine.
#[derive(Serialize)]
struct Info {
    adapter: String,
    /// True on a software GPU (SwiftShader, lavapipe).
    is_cpu: bool,
    /// The kernel variants in use (`Context::variant_name`; `"cpu"` on the CPU backend).
    variant: String,
    /// `"webgpu"` or `"cpu"`: which backend runs the model.
    backend: &'static str,
    /// Why that backend (`"asked for"`, or what `backend: "auto"` found).
    backend_reason: String,
    kv_layout: KvLayout,
    kv_dtype: &'static str,
    block_size: u32,
    max_context: u32,
    model: ModelInfo,
    memory: Memory,
    kv: KvInfo,
}

/// The KV cache's cost: bytes of K and V one token takes, summed over all layers.
#[derive(Serialize)]
struct KvInfo {
    bytes_per_token: u64,
}

impl Info {
    fn of(engine: &Engine, chat_template: Option<&'static str>) -> Info {
        let memory = engine.memory();
        let kv = engine.kv_cache();
        Info {
            adapter: engine.adapter_name(),
            is_cpu: engine.is_cpu(),
            variant: engine.variant_name(),
            backend: engine.backend().0,
            backend_reason: engine.backend().1.to_string(),
            kv_layout: kv.layout,
            kv_dtype: kv.dtype().name(),
            block_size: kv.block_size(),
            max_context: engine.max_context(),
            model: ModelInfo::of(engine, chat_template),
            memory: Memory { weights_bytes: memory.weights_bytes, kv_bytes: memory.kv_bytes },
            kv: KvInfo { bytes_per_token: kv.bytes_per_token() },
        }
    }
}

/// What `submit` returns.
#[derive(Serialize)]
struct Submitted {
    id: RequestId,
    prompt_tokens: u32,
}

/// One scheduler event as JS sees it: `{type: "admitted", id, prompt_tokens, prefix_hit_tokens}`
/// (once per request, before its first token), `{type: "token", id, text, reasoning?}`
/// (`reasoning`: what the token adds to a reasoning reply's reasoning block, when anything),
/// `{type: "finished", id, result}` or `{type: "failed", id, code, message}`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum StepEvent {
    Admitted {
        id: RequestId,
        prompt_tokens: u32,
        prefix_hit_tokens: u32,
    },
    Token {
        id: RequestId,
        text: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        reasoning: String,
    },
    Finished {
        id: RequestId,
        result: Generation,
    },
    Failed {
        id: RequestId,
        code: &'static str,
        message: String,
    },
}

impl From<Event> for StepEvent {
    fn from(event: Event) -> StepEvent {
        match event {
            Event::Admitted { id, prompt_tokens, prefix_hit_tokens } => StepEvent::Admitted { id, prompt_tokens, prefix_hit_tokens },
            Event::Token { id, text, reasoning, .. } => StepEvent::Token { id, text, reasoning },
            Event::Finished { id, result: Ok(result) } => StepEvent::Finished { id, result },
            Event::Finished { id, result: Err(e) } => {
                let e = WebError::from(e);
                StepEvent::Failed { id, code: e.code.as_str(), message: e.message }
            }
        }
    }
}

/// `stats()`: the engine's pool and prefix cache, plus the scheduler's running set.
#[derive(Serialize)]
struct Stats {
    #[serde(flatten)]
    engine: EngineStats,
    sched: SchedStats,
    /// The wasm module's linear memory now (it only grows): the engine's CPU-side heap.
    wasm_bytes: f64,
}

/// A file of a model, read through JS ([`WebEngine::load_from`]).
struct JsFile<'f> {
    index: u32,
    size: u64,
    read: &'f js_sys::Function,
}

impl ReadAt for JsFile<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let args = (JsValue::from(self.index), JsValue::from(offset as f64), JsValue::from(buf.len() as f64));
        let got = self.read.call3(&JsValue::NULL, &args.0, &args.1, &args.2).map_err(|e| format!("the read of bytes {offset}.. threw: {}", describe(&e)))?;
        let bytes = got.dyn_into::<js_sys::Uint8Array>().map_err(|_| "the read callback did not return a Uint8Array".to_string())?;
        if bytes.length() as usize != buf.len() {
            return Err(format!("asked for {} bytes at {offset}, the read gave {} (has the file changed or been cut?)", buf.len(), bytes.length()));
        }
        bytes.copy_to(buf);
        Ok(())
    }
}

/// The files of `sizes`, each read through `read` (small reads from a window read ahead).
fn js_files<'f>(sizes: &[f64], read: &'f js_sys::Function) -> Result<Vec<ReadAhead<JsFile<'f>>>, WebError> {
    if sizes.is_empty() {
        return Err(WebError::invalid("sizes must name at least one file"));
    }
    (0u32..)
        .zip(sizes)
        .map(|(index, &size)| match size.is_finite() && size >= 0.0 && size <= 2f64.powi(53) && size.fract() == 0.0 {
            true => Ok(ReadAhead::new(JsFile { index, size: size as u64, read })),
            false => Err(WebError::invalid(format!("file {index}'s size must be a whole number of bytes, not {size}"))),
        })
        .collect()
}

/// A load's progress as JS sees it.
fn load_event(event: LoadEvent) -> JsValue {
    #[derive(Serialize)]
    struct Phase {
        phase: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        loaded: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
    }
    let phase = match event {
        LoadEvent::Tokenizer => Phase { phase: "tokenizer", loaded: None, total: None },
        LoadEvent::Upload { loaded, total } => Phase { phase: "upload", loaded: Some(loaded as f64), total: Some(total as f64) },
        LoadEvent::Pipelines => Phase { phase: "pipelines", loaded: None, total: None },
    };
    to_js(&phase).unwrap_or(JsValue::UNDEFINED)
}

/// `estimateMemory` when a prefix ends before its header does.
#[derive(Serialize)]
struct NeedMore {
    complete: bool,
    need: Vec<f64>,
}

/// `estimateMemory`'s estimate.
#[derive(Serialize)]
struct Estimated {
    complete: bool,
    #[serde(flatten)]
    estimate: crate::engine::MemoryEstimate,
}

/// The byte length of this module's linear memory.
fn wasm_bytes() -> f64 {
    wasm_bindgen::memory()
        .dyn_into::<js_sys::WebAssembly::Memory>()
        .map_or(0.0, |m| m.buffer().dyn_into::<js_sys::ArrayBuffer>().map_or(0.0, |b| b.byte_length() as f64))
}

/// Options of `WebEngine.profile`; every field is optional.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ProfileOptions {
    /// Per-kernel times from GPU timestamps where the device has them (default true); false
    /// times each kernel alone on the host clock.
    timestamps: Option<bool>,
}

/// What `profile` returns: the engine's `Profile` with its summary fields beside it, the same
/// object `pagedlm profile` prints.
#[derive(Serialize)]
struct ProfileView<'a> {
    #[serde(flatten)]
    profile: &'a Profile,
    #[serde(flatten)]
    summary: ProfileSummary,
}

/// A request id from JS: a non-negative integer below 2^53.
fn request_id(id: f64) -> Result<RequestId, WebError> {
    if id.is_finite() && id >= 0.0 && id.fract() == 0.0 && id < 9_007_199_254_740_992.0 {
        Ok(RequestId(id as u64))
    } else {
        Err(WebError::invalid(format!("{id} is not a request id")))
    }
}

/// The chat format the tokenizer renders, as `info().model.chat_template` names it: null for a
/// base model (no template).
fn chat_template(engine: &Engine) -> Option<&'static str> {
    match engine.tokenizer().chat_format() {
        ChatFormatKind::ChatMl => Some("chatml"),
        ChatFormatKind::Gemma => Some("gemma"),
        ChatFormatKind::Other => Some("jinja"),
        ChatFormatKind::None => None,
    }
}

/// OpenAI-style messages: `[{role, content, tool_calls?, tool_call_id?}]`.
fn parse_messages(messages: JsValue) -> Result<Vec<Message>, WebError> {
    serde_wasm_bindgen::from_value(messages).map_err(|e| conversion_error("invalid messages (want [{role, content}])", e))
}

/// The option names an options struct accepts, exactly as serde reads them from JS (after
/// `rename_all`): serde's derive hands them to `Deserializer::deserialize_struct`, and this
/// deserializer only records them. Checked against the names the page may pass, because
/// serde-wasm-bindgen reads only the fields a struct declares: a misspelled option would
/// otherwise be dropped without a word. Also what `optionNames()` reports to the JS tests.
fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct FieldNames<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for FieldNames<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(self, _name: &'static str, fields: &'static [&'static str], _: V) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("only the field names were wanted"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut names: &'static [&'static str] = &[];
    // Always an error: the deserializer stops once it has the names.
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// The option names `WebEngine.load`, `WebEngine.chat`/`submit` and `submitPrompt` accept:
/// `{load: [...], chat: [...], completion: [...]}`. For the package's tests, which check them
/// against `js/index.d.ts` and `js/index.js`.
#[wasm_bindgen(js_name = optionNames)]
pub fn option_names() -> Result<JsValue, WebError> {
    #[derive(Serialize)]
    struct OptionNames {
        load: &'static [&'static str],
        chat: &'static [&'static str],
        completion: Vec<&'static str>,
    }
    let request = field_names::<ChatOptions>();
    // Tools are for chat: a raw-text prompt cannot offer them (`submitPrompt` refuses them).
    let completion = request.iter().copied().filter(|n| !CHAT_ONLY_OPTIONS.contains(n)).collect();
    to_js(&OptionNames { load: field_names::<LoadOptions>(), chat: request, completion })
}

/// The backend `WebEngine.load` takes when its options name none (`"auto"`:
/// [`EngineOptions::for_users`]), for the Worker, which probes WebGPU for it before loading.
#[wasm_bindgen(js_name = defaultBackend)]
pub fn default_backend() -> Result<JsValue, WebError> {
    to_js(&EngineOptions::for_users().backend)
}

/// Parses an optional JS options object: `undefined` and `null` mean "all defaults".
fn options<T: for<'de> Deserialize<'de> + Default>(value: JsValue, what: &str) -> Result<T, WebError> {
    if value.is_undefined() || value.is_null() {
        return Ok(T::default());
    }
    if let Some(object) = value.dyn_ref::<js_sys::Object>() {
        let known = field_names::<T>();
        for key in js_sys::Object::keys(object).iter().filter_map(|k| k.as_string()) {
            if !known.contains(&key.as_str()) {
                return Err(WebError::invalid(format!("invalid {what}: unknown option `{key}` (known: {})", known.join(", "))));
            }
        }
    }
    serde_wasm_bindgen::from_value(value).map_err(|e| conversion_error(&format!("invalid {what}"), e))
}

/// serde-wasm-bindgen's errors print as a JS `Error` ("Error: invalid type ..."); keep the message.
fn conversion_error(context: &str, e: serde_wasm_bindgen::Error) -> WebError {
    let text = e.to_string();
    WebError::invalid(format!("{context}: {}", text.strip_prefix("Error: ").unwrap_or(&text)))
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, WebError> {
    value.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).map_err(|e| {
        let text = e.to_string();
        WebError::new(ErrorKind::Internal, format!("cannot convert the result to JS: {text}"))
    })
}

/// A JS exception as text for an error message.
fn describe(value: &JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    value.as_string().unwrap_or_else(|| format!("{value:?}"))
}

fn busy() -> WebError {
    WebError::new(ErrorCode::Busy, "a generation is running on this engine: wait for it or stop it first")
}

/// A loaded model on a WebGPU device (the page's or a Worker's).
///
/// The engine sits behind a `RefCell` so that a call while a `chat` or a `step` runs gets a
/// `BUSY` error instead of wasm-bindgen's aliasing trap. Concurrent requests go through
/// `submit` + `step`, which batch them; the caller applies new requests and aborts between steps.
#[wasm_bindgen]
pub struct WebEngine {
    inner: Rc<RefCell<Engine>>,
    info: Info,
    /// The engine's GPU context, reachable while a step holds the engine.
    /// The GPU context; `None` on the CPU backend.
    ctx: Option<Arc<Context>>,
}

impl WebEngine {
    /// Queues `prompt` for [`WebEngine::step`].
    fn submit_tokens(engine: &mut Engine, prompt: Vec<u32>, request: GenerateRequest) -> Result<JsValue, WebError> {
        let prompt_tokens = prompt.len() as u32;
        let id = engine.submit(prompt, request)?;
        to_js(&Submitted { id, prompt_tokens })
    }
}

#[wasm_bindgen]
impl WebEngine {
    /// Creates a WebGPU context and loads a GGUF model.
    /// `bytes`: the whole GGUF file. `options`: `{maxContext?, prefillChunk?, kvDtype?, kvLayout?,
    /// blockSize?, poolTokens?, prefixCache?, maxBatch?, stepTokens?, maxBindingMib?}` or undefined.
    pub async fn load(bytes: Vec<u8>, options: JsValue) -> Result<WebEngine, WebError> {
        let opts: LoadOptions = self::options(options, "load options")?;
        let engine = Engine::load(&bytes, opts.engine_options()?).await?;
        let info = Info::of(&engine, chat_template(&engine));
        let ctx = engine.context().cloned();
        Ok(WebEngine { inner: Rc::new(RefCell::new(engine)), info, ctx })
    }

    /// Loads a GGUF model read by ranges, never whole in wasm memory: `sizes` the byte length of
    /// each file (one, or each part of a split model in order), `read(file, offset, length)` a
    /// synchronous function returning a `Uint8Array` of exactly `length` bytes (a `Blob` read
    /// with `FileReaderSync`, an OPFS file, an `ArrayBuffer`'s view; a throw fails the load with
    /// `MODEL_READ`). `progress(event)` hears `{phase: "tokenizer"}`, `{phase: "upload", loaded,
    /// total}` (tensor bytes placed) and `{phase: "pipelines"}`. `options` as for `load`.
    #[wasm_bindgen(js_name = loadFrom)]
    pub async fn load_from(sizes: Vec<f64>, read: js_sys::Function, options: JsValue, progress: js_sys::Function) -> Result<WebEngine, WebError> {
        let opts: LoadOptions = self::options(options, "load options")?;
        let files = js_files(&sizes, &read)?;
        let sources: Vec<&dyn ReadAt> = files.iter().map(|f| f as &dyn ReadAt).collect();
        let mut report = |event: LoadEvent| {
            // A progress callback that throws only loses its progress.
            let _ = progress.call1(&JsValue::NULL, &load_event(event));
        };
        let engine = Engine::load_from(&sources, opts.engine_options()?, &mut report).await?;
        let info = Info::of(&engine, chat_template(&engine));
        let ctx = engine.context().cloned();
        Ok(WebEngine { inner: Rc::new(RefCell::new(engine)), info, ctx })
    }

    /// What a model will take in memory, from the first bytes of each of its files (`prefixes`:
    /// `Uint8Array`s; `sizes`: the files' lengths): `{complete: false, need: [bytes of each file
    /// to pass]}` when a prefix ends before its file's header does, else `{complete: true, fits,
    /// fits_backend, backend, weights_bytes: {webgpu, cpu}, kv_bytes_per_token: {f32, int8},
    /// kv_tokens, kv_bytes, activations_bytes, total_bytes, largest_buffer_bytes,
    /// kv_layer_bytes, limits, wasm32_bytes, reasons}`. `options`: the load options, plus
    /// `limits: {maxBufferSize?, maxStorageBufferBindingSize?, memoryBytes?}` (the adapter's,
    /// and a memory budget; `maxMemoryBytes` counts as one too).
    #[wasm_bindgen(js_name = estimateMemory)]
    pub fn estimate_memory(prefixes: Vec<js_sys::Uint8Array>, sizes: Vec<f64>, options: JsValue) -> Result<JsValue, WebError> {
        let mut opts: LoadOptions = self::options(options, "estimate options")?;
        if prefixes.len() != sizes.len() || sizes.is_empty() {
            return Err(WebError::invalid(format!("{} prefixes for {} file sizes: give one of each per file", prefixes.len(), sizes.len())));
        }
        let mut budget = opts.limits.take().unwrap_or_default();
        let options = opts.engine_options()?;
        budget.memory_bytes = budget.memory_bytes.into_iter().chain(options.max_memory_bytes).min();
        let bytes: Vec<Vec<u8>> = prefixes.iter().map(|p| p.to_vec()).collect();
        let parts: Vec<Prefix<'_>> = bytes.iter().zip(&sizes).map(|(b, &size)| Prefix { bytes: b, size: size as u64 }).collect();
        let need: Vec<Option<u64>> = parts.iter().map(|p| Gguf::header_need(p)).collect::<Result<_, _>>().map_err(EngineError::from)?;
        if need.iter().any(Option::is_some) {
            let need: Vec<f64> = need.iter().zip(&parts).map(|(n, p)| n.unwrap_or(p.bytes.len() as u64) as f64).collect();
            return to_js(&NeedMore { complete: false, need });
        }
        let sources: Vec<&dyn ReadAt> = parts.iter().map(|p| p as &dyn ReadAt).collect();
        let gguf = Gguf::open(&sources).map_err(EngineError::from)?;
        let estimate = estimate(&gguf, &options, budget)?;
        to_js(&Estimated { complete: true, estimate })
    }

    /// Runs the chat template over `messages` (`[{role, content}]`) and generates the reply.
    /// `options`: `{max_tokens?, temperature?, top_k?, top_p?, repetition_penalty?, seed?, stop?}`.
    /// `on_token(text, prompt_tokens, reasoning)` is called per token with the text it completed
    /// (may be ""), the prompt's length in tokens and the reasoning it completed (a reasoning
    /// model's think block; "" otherwise); returning `false` stops the reply (finish_reason
    /// "abort"); a throw stops it and rejects with `CALLBACK_ERROR`.
    /// Resolves to the engine's `Generation`: `{prompt_tokens, tokens, text, finish_reason,
    /// prefill_ms, decode_ms, ...}`.
    // The borrow is held across the awaits on purpose: it is what makes a second `chat` fail
    // cleanly (`try_borrow_mut`) while this one runs.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn chat(&self, messages: JsValue, options: JsValue, on_token: js_sys::Function) -> Result<JsValue, WebError> {
        let messages = parse_messages(messages)?;
        let mut request = self::options::<ChatOptions>(options, "chat options")?.request()?;
        let inner = Rc::clone(&self.inner);
        let mut engine = inner.try_borrow_mut().map_err(|_| busy())?;
        let prompt = engine.prepare_chat(&messages, &mut request)?;
        let prompt_len = JsValue::from(prompt.len() as u32);
        let mut thrown: Option<String> = None;
        let mut callback =
            |event: &TokenEvent<'_>| match on_token.call3(&JsValue::NULL, &JsValue::from_str(event.text), &prompt_len, &JsValue::from_str(event.reasoning)) {
                Ok(verdict) => verdict.as_bool() != Some(false),
                Err(e) => {
                    thrown = Some(describe(&e));
                    false
                }
            };
        let generation = engine.generate(&prompt, &request, &mut callback).await?;
        if let Some(msg) = thrown {
            return Err(WebError::new(ErrorCode::Callback, format!("the on_token callback threw: {msg}")));
        }
        to_js(&generation)
    }

    /// Queues a chat request for [`WebEngine::step`] (continuous batching: every queued request
    /// runs in the same steps). `options` as for `chat`. Returns `{id, prompt_tokens}`; a bad
    /// option, a prompt over the context or bad sampling parameters fail here.
    /// A model without a chat template refuses it with `INVALID_ARGUMENT` (use `submitPrompt`).
    pub fn submit(&self, messages: JsValue, options: JsValue) -> Result<JsValue, WebError> {
        let messages = parse_messages(messages)?;
        let mut request = self::options::<ChatOptions>(options, "chat options")?.request()?;
        let mut engine = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let prompt = engine.prepare_chat(&messages, &mut request)?;
        Self::submit_tokens(&mut engine, prompt, request)
    }

    /// Queues a raw-text completion for [`WebEngine::step`] (completion mode: no chat
    /// template; special tokens written in `prompt` become their ids, BOS comes first when the
    /// model asks for it). `options` and the result as for `submit`; the events name it by id
    /// like any request.
    #[wasm_bindgen(js_name = submitPrompt)]
    pub fn submit_prompt(&self, prompt: String, options: JsValue) -> Result<JsValue, WebError> {
        let request = self::options::<ChatOptions>(options, "chat options")?.request()?;
        if request.tools.is_some() {
            return Err(WebError::invalid("tools are for chat requests (a raw-text prompt cannot offer them)"));
        }
        if !request.chat_template_kwargs.is_empty() {
            return Err(WebError::invalid("chat_template_kwargs are for chat requests (a raw-text prompt has no chat template)"));
        }
        let mut engine = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let ids = engine.text_prompt(&prompt)?;
        Self::submit_tokens(&mut engine, ids, request)
    }

    /// Runs one scheduling step over every submitted request: admits waiting ones, computes one
    /// token for each running one (plus a chunk of prefill). Resolves to the events of the step:
    /// `[{type: "admitted", id, prompt_tokens, prefix_hit_tokens} | {type: "token", id, text} |
    /// {type: "finished", id, result} | {type: "failed", id, code, message}]`; `result` is the
    /// request's `Generation`. A request's `admitted` comes before its first `token`.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn step(&self) -> Result<JsValue, WebError> {
        let inner = Rc::clone(&self.inner);
        let mut engine = inner.try_borrow_mut().map_err(|_| busy())?;
        let events: Vec<StepEvent> = engine.step().await?.into_iter().map(StepEvent::from).collect();
        to_js(&events)
    }

    /// Whether the engine's GPU device was lost: every request then ends with `DEVICE_LOST`,
    /// and only a new engine (on the same model bytes) runs again. Answers during a step too.
    #[wasm_bindgen(js_name = isLost)]
    pub fn is_lost(&self) -> bool {
        self.ctx.as_ref().is_some_and(|c| c.is_lost())
    }

    /// Destroys the engine's GPU device as a driver reset would lose it, to test how a page
    /// recovers (what `WEBGL_lose_context.loseContext()` is to WebGL): the running and queued
    /// requests end with `DEVICE_LOST` at the next step. Works during a step too. Nothing on
    /// the CPU backend, which has no device to lose.
    #[wasm_bindgen(js_name = simulateDeviceLoss)]
    pub fn simulate_device_loss(&self) {
        if let Some(ctx) = &self.ctx {
            ctx.device.destroy();
        }
    }

    /// Whether a submitted request has not finished yet.
    #[wasm_bindgen(js_name = hasWork)]
    pub fn has_work(&self) -> Result<bool, WebError> {
        Ok(self.inner.try_borrow().map_err(|_| busy())?.has_work())
    }

    /// Ends a submitted request now (its K/V go to the prefix cache, its blocks are released).
    /// Returns its `Generation` so far (finish_reason "abort"), or null when it had finished.
    pub fn abort(&self, id: f64) -> Result<JsValue, WebError> {
        let id = request_id(id)?;
        let mut engine = self.inner.try_borrow_mut().map_err(|_| busy())?;
        match engine.abort(id)? {
            Some(generation) => to_js(&generation),
            None => Ok(JsValue::NULL),
        }
    }

    /// The KV pool and prefix cache now (the engine's `EngineStats`): `{pool: {kv_dtype,
    /// block_size, blocks_total, blocks_used, blocks_free, blocks_cached, bytes_total,
    /// bytes_per_token, live_tokens, internal_fragmentation}, prefix: {enabled, requests,
    /// prompt_tokens, hit_tokens, hit_rate, evictions, ...}, block_states: [u8: 0 free, 1 held
    /// by a running sequence, 2 cached only], refcounts: [u32], sequences: [{id, len, blocks}],
    /// sched: {running, waiting, steps, preemptions, finished, aborted, failed, sequences:
    /// [{request, seq, len, prefilling, blocks}]}}`.
    /// `BUSY` during a `chat` or a `step` (the Worker answers from its last snapshot then).
    pub fn stats(&self) -> Result<JsValue, WebError> {
        let engine = self.inner.try_borrow().map_err(|_| busy())?;
        to_js(&Stats { engine: engine.stats(), sched: engine.sched_stats(), wasm_bytes: wasm_bytes() })
    }

    /// Drops every cached prefix (their blocks return to the free list) and restarts the hit counters.
    #[wasm_bindgen(js_name = resetCache)]
    pub fn reset_cache(&self) -> Result<(), WebError> {
        let mut engine = self.inner.try_borrow_mut().map_err(|_| busy())?;
        Ok(engine.reset_cache()?)
    }

    /// The token ids of a conversation's history as the next turn's prompt will start: the chat
    /// template over `messages` (`[{role, content}]`, typically ending with the assistant's
    /// reply) without the assistant generation prompt. What `exportSnapshot` wants to keep a
    /// conversation: a later prompt of these messages plus a new user turn begins with exactly
    /// these ids.
    #[wasm_bindgen(js_name = historyTokens)]
    pub fn history_tokens(&self, messages: JsValue) -> Result<Vec<u32>, WebError> {
        let messages = parse_messages(messages)?;
        let engine = self.inner.try_borrow().map_err(|_| busy())?;
        Ok(engine.openai_history_tokens(&messages, &serde_json::Map::new())?)
    }

    /// A KV snapshot of `tokens` (`Uint32Array`, e.g. from `historyTokens`): their ids and K/V
    /// blocks with the model's and cache format's fingerprint and a checksum, as a `Uint8Array`.
    /// Computes whatever part of `tokens` the prefix cache lacks first (no logits are read).
    /// `BUSY` while a `chat` or a `step` runs: call it between steps.
    #[allow(clippy::await_holding_refcell_ref)]
    #[wasm_bindgen(js_name = exportSnapshot)]
    pub async fn export_snapshot(&self, tokens: Vec<u32>) -> Result<Vec<u8>, WebError> {
        let inner = Rc::clone(&self.inner);
        let mut engine = inner.try_borrow_mut().map_err(|_| busy())?;
        Ok(engine.export_snapshot(&tokens).await?)
    }

    /// Loads a snapshot from `exportSnapshot` (this engine or another with the same model and KV
    /// format) into the prefix cache: the next request whose prompt starts with its tokens reuses
    /// their K/V. Returns the tokens (`Uint32Array`). A snapshot from another model, KV dtype,
    /// layout, block size or format version is refused with `SNAPSHOT_MISMATCH`, damaged bytes
    /// with `SNAPSHOT_CORRUPT`; a refusal changes nothing.
    #[wasm_bindgen(js_name = importSnapshot)]
    pub fn import_snapshot(&self, bytes: Vec<u8>) -> Result<Vec<u32>, WebError> {
        let mut engine = self.inner.try_borrow_mut().map_err(|_| busy())?;
        Ok(engine.import_snapshot(&bytes)?)
    }

    /// Profiles one prefill of `promptTokens` tokens and one steady-state decode step after it
    /// (the engine's `Profile`, as `pagedlm profile` prints it): `{adapter, method
    /// ("timestamps" | "wall_clock_per_kernel"), prompt_tokens, prefill_chunk, prefill_cold,
    /// prefill, decode: {tokens, context, dispatches, submits, readbacks, bytes_read_back,
    /// bytes_read_back_per_token, buffers_created, buffer_bytes_created, bind_groups_created,
    /// host_ms, wall_ms, gpu_ms, kernels: [{name, dispatches, ms}]}, decode_warmup_steps,
    /// decode_samples, dispatches_per_decode_step, host_ms_per_decode_step,
    /// gpu_ms_per_decode_step, wall_ms_per_decode_step, blocking_readbacks_per_token}`.
    /// `options`: `{timestamps?}`. Needs an idle engine (`INVALID_ARGUMENT` while requests run,
    /// `BUSY` during a step) and a context of `promptTokens` + 14 tokens.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn profile(&self, prompt_tokens: u32, options: JsValue) -> Result<JsValue, WebError> {
        let options: ProfileOptions = self::options(options, "profile options")?;
        let inner = Rc::clone(&self.inner);
        let mut engine = inner.try_borrow_mut().map_err(|_| busy())?;
        let profile = engine.profile(prompt_tokens, options.timestamps.unwrap_or(true)).await?;
        to_js(&ProfileView { profile: &profile, summary: profile.summary() })
    }

    /// What the engine holds: `{adapter, is_cpu, kv_layout, kv_dtype, block_size, max_context,
    /// model: {arch, architecture, sliding_window, chat_template, name, n_layers, ...},
    /// memory: {weights_bytes, kv_bytes}, kv: {bytes_per_token}}`. Works while a generation runs.
    pub fn info(&self) -> Result<JsValue, WebError> {
        to_js(&self.info)
    }
}
