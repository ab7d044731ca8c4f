//! The JavaScript surface of the engine (wasm-bindgen): load a model from bytes, chat with a
//! token stream, report what the engine holds. Thin on purpose: every decision lives in
//! [`Engine`]; this module only converts values and errors at the boundary.
//!
//! Nothing here panics: bad options, a busy engine, or a throwing callback all come back to JS
//! as a rejected promise with an `Error` whose message says what to fix.

use std::cell::RefCell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

use crate::engine::{Engine, EngineOptions, GenerateRequest, KvLayout, TokenEvent};
use crate::model::ModelConfig;
use crate::sampler::SamplingParams;
use crate::tokenizer::ChatMessage;

/// Options of `WebEngine.load`; every field is optional.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LoadOptions {
    /// Longest sequence (prompt + reply) the engine holds; 0 or absent = the engine's default.
    max_context: Option<u32>,
    /// Prompt rows per prefill pass.
    prefill_chunk: Option<u32>,
}

/// `stop` as OpenAI accepts it: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

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
}

impl ChatOptions {
    fn request(self) -> GenerateRequest {
        let base = GenerateRequest::default();
        let d = SamplingParams::default();
        GenerateRequest {
            ignore_eos: false,
            max_tokens: self.max_tokens.unwrap_or(base.max_tokens),
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(d.temperature),
                top_k: self.top_k.unwrap_or(d.top_k),
                top_p: self.top_p.unwrap_or(d.top_p),
                repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
                repetition_window: d.repetition_window,
                seed: self.seed.unwrap_or(d.seed),
            },
            stop: match self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s],
                Some(Stop::Many(v)) => v,
            },
        }
    }
}

#[derive(Serialize)]
struct Memory {
    weights_bytes: u64,
    kv_bytes: u64,
}

/// What `info()` reports. Taken once at load: with the contiguous KV cache nothing in it changes
/// afterwards, and a snapshot lets the page ask while a generation holds the engine.
#[derive(Serialize)]
struct Info {
    adapter: String,
    /// True on a software GPU (SwiftShader, lavapipe).
    is_cpu: bool,
    kv_layout: &'static str,
    max_context: u32,
    model: ModelConfig,
    memory: Memory,
}

impl Info {
    fn of(engine: &Engine) -> Info {
        let (weights_bytes, kv_bytes) = engine.memory();
        Info {
            adapter: engine.context().adapter_name(),
            is_cpu: engine.context().is_cpu(),
            kv_layout: "contiguous",
            max_context: engine.max_context(),
            model: engine.config().clone(),
            memory: Memory { weights_bytes, kv_bytes },
        }
    }
}

/// Parses an optional JS options object: `undefined` and `null` mean "all defaults".
fn options<T: for<'de> Deserialize<'de> + Default>(value: JsValue, what: &str) -> Result<T, JsError> {
    if value.is_undefined() || value.is_null() {
        return Ok(T::default());
    }
    serde_wasm_bindgen::from_value(value).map_err(|e| conversion_error(&format!("invalid {what}"), e))
}

/// serde-wasm-bindgen's errors print as a JS `Error` ("Error: invalid type ..."); keep the message.
fn conversion_error(context: &str, e: serde_wasm_bindgen::Error) -> JsError {
    let text = e.to_string();
    JsError::new(&format!("{context}: {}", text.strip_prefix("Error: ").unwrap_or(&text)))
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, JsError> {
    value
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| conversion_error("cannot convert the result to JS", e))
}

/// A JS exception as text for an error message.
fn describe(value: &JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    value.as_string().unwrap_or_else(|| format!("{value:?}"))
}

/// A loaded model on the page's WebGPU device.
///
/// The engine sits behind a `RefCell` so that a second `chat` while one is running gets a clear
/// error instead of wasm-bindgen's aliasing trap.
#[wasm_bindgen]
pub struct WebEngine {
    inner: Rc<RefCell<Engine>>,
    info: Info,
}

#[wasm_bindgen]
impl WebEngine {
    /// Creates a WebGPU context and loads a GGUF model.
    /// `bytes`: the whole GGUF file. `options`: `{maxContext?, prefillChunk?}` or undefined.
    pub async fn load(bytes: Vec<u8>, options: JsValue) -> Result<WebEngine, JsError> {
        let opts: LoadOptions = self::options(options, "load options")?;
        // The page's KV panel draws one contiguous reservation until it learns the paged pool.
        let mut engine_options = EngineOptions { kv_layout: KvLayout::Contiguous, ..EngineOptions::default() };
        if let Some(n) = opts.max_context {
            engine_options.max_context = n;
        }
        if let Some(n) = opts.prefill_chunk {
            engine_options.prefill_chunk = n;
        }
        let engine = Engine::load(&bytes, engine_options).await.map_err(|e| JsError::new(&e.to_string()))?;
        let info = Info::of(&engine);
        Ok(WebEngine { inner: Rc::new(RefCell::new(engine)), info })
    }

    /// Runs the chat template over `messages` (`[{role, content}]`) and generates the reply.
    /// `options`: `{max_tokens?, temperature?, top_k?, top_p?, repetition_penalty?, seed?, stop?}`.
    /// `on_token(text)` is called per token with the text it completed (may be ""); returning
    /// `false` stops the reply (finish_reason "abort"); a throw stops it and rejects with that error.
    /// Resolves to `{text, tokens, prompt_tokens, finish_reason, prefill_ms, decode_ms}`.
    // The borrow is held across the awaits on purpose: it is what makes a second `chat` fail
    // cleanly (`try_borrow_mut`) while this one runs. Nothing else borrows the engine.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn chat(
        &self,
        messages: JsValue,
        options: JsValue,
        on_token: js_sys::Function,
    ) -> Result<JsValue, JsError> {
        let messages: Vec<ChatMessage> = serde_wasm_bindgen::from_value(messages)
            .map_err(|e| conversion_error("invalid messages (want [{role, content}])", e))?;
        let request = self::options::<ChatOptions>(options, "chat options")?.request();
        let inner = Rc::clone(&self.inner);
        let mut engine = inner
            .try_borrow_mut()
            .map_err(|_| JsError::new("a generation is already running: wait for it or stop it first"))?;
        let prompt = engine.chat_prompt(&messages).map_err(|e| JsError::new(&e.to_string()))?;
        let mut thrown: Option<String> = None;
        let mut callback = |event: &TokenEvent<'_>| match on_token.call1(&JsValue::NULL, &JsValue::from_str(event.text)) {
            Ok(verdict) => verdict.as_bool() != Some(false),
            Err(e) => {
                thrown = Some(describe(&e));
                false
            }
        };
        let generation =
            engine.generate(&prompt, &request, &mut callback).await.map_err(|e| JsError::new(&e.to_string()))?;
        if let Some(msg) = thrown {
            return Err(JsError::new(&format!("the on_token callback threw: {msg}")));
        }
        to_js(&generation)
    }

    /// What the engine holds: `{adapter, is_cpu, kv_layout, max_context, model, memory: {weights_bytes, kv_bytes}}`.
    /// Works while a generation runs.
    pub fn info(&self) -> Result<JsValue, JsError> {
        to_js(&self.info)
    }
}
