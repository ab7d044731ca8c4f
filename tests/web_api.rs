//! The wasm API (`pagedlm::web::WebEngine`) in headless Chromium, on a tiny synthetic model the
//! test writes itself: loading, streaming through the token callback, aborting from it, the pool
//! stats and prefix hits, and every error kind with its code (no WebGPU adapter, truncated
//! model, bad options, context overflow, a busy engine, a throwing callback, a failed step).
//! Browser only: `wasm-pack test --headless --chrome -- --test web_api`.
#![cfg(target_arch = "wasm32")]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use pagedlm::engine::{BackendChoice, EngineOptions, ErrorKind};
use pagedlm::gguf::GgmlType;
use pagedlm::synth::{tiny_llama_gguf, SynthConfig, SynthTypes};
use pagedlm::web::{ErrorCode, WebEngine, WebError};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn json(text: &str) -> JsValue {
    js_sys::JSON::parse(text).unwrap_or_else(|e| panic!("bad JSON in the test {text}: {e:?}"))
}

fn get(value: &JsValue, path: &str) -> JsValue {
    path.split('.').fold(value.clone(), |v, key| js_sys::Reflect::get(&v, &JsValue::from_str(key)).unwrap_or_else(|_| panic!("no {path} in {v:?}")))
}

fn num(value: &JsValue, path: &str) -> f64 {
    get(value, path).as_f64().unwrap_or_else(|| panic!("{path} is not a number in {value:?}"))
}

fn len(value: &JsValue, path: &str) -> u32 {
    js_sys::Array::from(&get(value, path)).length()
}

fn text(value: &JsValue, path: &str) -> String {
    get(value, path).as_string().unwrap_or_else(|| panic!("{path} is not a string in {value:?}"))
}

fn tiny() -> Vec<u8> {
    tiny_llama_gguf(&SynthConfig::tiny())
}

/// Loads with `options`, on the WebGPU backend unless they name one: these tests are the WebGPU
/// path's (the default, `auto`, takes the CPU backend on SwiftShader; `load_default` keeps it).
async fn load(bytes: Vec<u8>, options: &str) -> Result<WebEngine, WebError> {
    let mut options: serde_json::Value = serde_json::from_str(options).expect("test options are JSON");
    if let Some(map) = options.as_object_mut() {
        map.entry("backend").or_insert("webgpu".into());
    }
    load_default(bytes, &options.to_string()).await
}

/// Loads with `options` as they are.
async fn load_default(bytes: Vec<u8>, options: &str) -> Result<WebEngine, WebError> {
    WebEngine::load(bytes, json(options)).await
}

async fn engine() -> WebEngine {
    load(tiny(), "{}").await.unwrap_or_else(|e| panic!("the tiny model failed to load: {e:?}"))
}

fn expect_code<T>(what: &str, result: Result<T, WebError>, code: ErrorCode) -> String {
    match result {
        Ok(_) => panic!("{what}: succeeded, {} expected", code.as_str()),
        Err(e) => {
            assert_eq!(e.code, code, "{what}: {} ({})", e.code.as_str(), e.message);
            assert!(!e.message.is_empty(), "{what}: an empty message");
            e.message
        }
    }
}

const HELLO: &str = r#"[{"role": "user", "content": "hello there"}]"#;

/// A token callback that counts its calls, records the prompt length it is given, and asks to
/// stop after `stop_after` tokens (never with None).
struct Counter {
    calls: Rc<Cell<u32>>,
    prompt_len: Rc<Cell<u32>>,
    text: Rc<RefCell<String>>,
    closure: Closure<dyn FnMut(String, u32) -> bool>,
}

impl Counter {
    fn new(stop_after: Option<u32>) -> Counter {
        let calls = Rc::new(Cell::new(0));
        let prompt_len = Rc::new(Cell::new(0));
        let text = Rc::new(RefCell::new(String::new()));
        let (c, p, t) = (Rc::clone(&calls), Rc::clone(&prompt_len), Rc::clone(&text));
        let closure = Closure::<dyn FnMut(String, u32) -> bool>::new(move |piece: String, n: u32| {
            c.set(c.get() + 1);
            p.set(n);
            t.borrow_mut().push_str(&piece);
            stop_after.is_none_or(|k| c.get() < k)
        });
        Counter { calls, prompt_len, text, closure }
    }

    fn function(&self) -> js_sys::Function {
        self.closure.as_ref().unchecked_ref::<js_sys::Function>().clone()
    }
}

#[wasm_bindgen_test]
async fn loads_on_the_paged_layout_and_reports_the_pool() {
    let engine = engine().await;
    let info = engine.info().expect("info");
    assert_eq!(text(&info, "kv_layout"), "paged");
    assert_eq!(text(&info, "kv_dtype"), "f32");
    assert_eq!(num(&info, "model.n_layers"), SynthConfig::tiny().n_layers as f64);
    assert_eq!(text(&info, "model.fingerprint").len(), 16, "the 64-bit fingerprint arrives as hex");
    let stats = engine.stats().expect("stats");
    let total = num(&stats, "pool.blocks_total");
    assert!(total > 0.0);
    assert_eq!(len(&stats, "block_states") as f64, total, "one state per block");
    assert_eq!(num(&stats, "pool.blocks_used"), 0.0);
    assert_eq!(num(&stats, "pool.blocks_free"), total);

    let custom = load(tiny(), r#"{"blockSize": 8, "poolTokens": 256, "prefixCache": false}"#).await.expect("custom options");
    let stats = custom.stats().expect("stats");
    assert_eq!(num(&stats, "pool.block_size"), 8.0);
    assert_eq!(num(&stats, "pool.blocks_total"), 32.0, "256 pool tokens in blocks of 8");
    assert_eq!(get(&stats, "prefix.enabled").as_bool(), Some(false));
}

#[wasm_bindgen_test]
async fn streams_every_token_and_reuses_the_prefix_on_a_repeat() {
    let engine = engine().await;
    let counter = Counter::new(None);
    let out =
        engine.chat(json(HELLO), json(r#"{"max_tokens": 6, "temperature": 0}"#), counter.function()).await.unwrap_or_else(|e| panic!("chat failed: {e:?}"));
    let tokens = len(&out, "tokens");
    assert!((1..=6).contains(&tokens), "{tokens} tokens for max_tokens 6");
    assert_eq!(counter.calls.get(), tokens, "one callback per generated token");
    assert_eq!(counter.prompt_len.get(), len(&out, "prompt_tokens"), "the callback learns the prompt's length");
    if text(&out, "finish_reason") == "length" {
        assert_eq!(*counter.text.borrow(), text(&out, "text"), "the streamed pieces spell the reply");
    }
    assert_eq!(num(&out, "prefix_hit_tokens"), 0.0, "nothing cached before the first request");
    let stats = engine.stats().expect("stats");
    assert_eq!(num(&stats, "pool.blocks_used"), 0.0, "a finished request holds no block");
    assert!(num(&stats, "pool.blocks_cached") >= 1.0, "its full blocks stay cached");

    let again = engine.chat(json(HELLO), json(r#"{"max_tokens": 6, "temperature": 0}"#), Counter::new(None).function()).await.expect("chat");
    let prompt = len(&again, "prompt_tokens") as f64;
    assert!(num(&again, "prefix_hit_tokens") >= prompt - 16.0, "the same prompt hits the cache ({} of {prompt})", num(&again, "prefix_hit_tokens"));
    assert_eq!(text(&again, "text"), text(&out, "text"), "greedy: a prefix hit changes nothing in the reply");

    engine.reset_cache().expect("reset");
    let stats = engine.stats().expect("stats");
    assert_eq!(num(&stats, "pool.blocks_cached"), 0.0, "resetCache drops the cached blocks");
    assert_eq!(num(&stats, "pool.blocks_free"), num(&stats, "pool.blocks_total"));
}

#[wasm_bindgen_test]
async fn a_callback_returning_false_aborts_and_frees_the_blocks() {
    let engine = engine().await;
    let counter = Counter::new(Some(2));
    let out = engine.chat(json(HELLO), json(r#"{"max_tokens": 40, "temperature": 0}"#), counter.function()).await.expect("chat");
    assert_eq!(text(&out, "finish_reason"), "abort");
    assert_eq!(len(&out, "tokens"), 2, "generation ends at the token the callback refused");
    assert_eq!(num(&engine.stats().expect("stats"), "pool.blocks_used"), 0.0);
}

#[wasm_bindgen_test]
async fn a_throwing_callback_is_a_callback_error() {
    let engine = engine().await;
    let thrower = js_sys::Function::new_with_args("text, n", "throw new Error('boom from the page')");
    let message = expect_code("throwing callback", engine.chat(json(HELLO), json(r#"{"max_tokens": 4}"#), thrower).await, ErrorCode::Callback);
    assert!(message.contains("boom from the page"), "{message}");
    assert_eq!(num(&engine.stats().expect("stats"), "pool.blocks_used"), 0.0);
}

#[wasm_bindgen_test]
async fn a_second_call_while_generating_is_busy() {
    let engine = Rc::new(engine().await);
    let (tx, rx) = futures_channel::oneshot::channel();
    let first = Rc::clone(&engine);
    wasm_bindgen_futures::spawn_local(async move {
        let result = first.chat(json(HELLO), json(r#"{"max_tokens": 4, "temperature": 0}"#), Counter::new(None).function()).await;
        let _ = tx.send(result.map(|_| ()).map_err(|e| e.message));
    });
    // Let the first chat start and reach its first GPU wait.
    let tick = js_sys::Promise::new(&mut |resolve, _| {
        let window = web_sys::window().expect("a window");
        window.set_timeout_with_callback(&resolve).expect("setTimeout");
    });
    JsFuture::from(tick).await.expect("timer");
    expect_code("chat while chatting", engine.chat(json(HELLO), JsValue::UNDEFINED, Counter::new(None).function()).await, ErrorCode::Busy);
    expect_code("stats while chatting", engine.stats(), ErrorCode::Busy);
    assert!(engine.info().is_ok(), "info works during a generation");
    rx.await.expect("the first chat ended").unwrap_or_else(|e| panic!("the first chat failed: {e}"));
    assert!(engine.stats().is_ok(), "the engine is free again");
}

#[wasm_bindgen_test]
async fn a_truncated_or_foreign_file_is_model_format() {
    let bytes = tiny();
    let half = bytes[..bytes.len() / 2].to_vec();
    let message = expect_code("truncated model", load(half, "{}").await, ErrorCode::Kind(ErrorKind::ModelFormat));
    assert!(message.contains("GGUF") || message.contains("model"), "{message}");
    expect_code("not a GGUF", load(b"<html>404 not found</html>".to_vec(), "{}").await, ErrorCode::Kind(ErrorKind::ModelFormat));
    expect_code("empty file", load(Vec::new(), "{}").await, ErrorCode::Kind(ErrorKind::ModelFormat));
    // A well-formed GGUF with heads of 6 dimensions, which pagedlm has no kernels for.
    let odd_heads = tiny_llama_gguf(&SynthConfig { hidden: 96, n_heads: 16, n_kv_heads: 8, ..SynthConfig::tiny() });
    let message = expect_code("an unsupported head size", load(odd_heads, "{}").await, ErrorCode::Kind(ErrorKind::ModelFormat));
    assert!(message.contains("head dimension"), "{message}");
}

#[wasm_bindgen_test]
async fn a_file_of_other_weight_types_runs_and_info_names_them() {
    // K-quant matrices (hidden and FFN whole 256-value blocks) with a Q6_K embedding.
    let types = SynthTypes { embedding: GgmlType::Q6_K, linear: GgmlType::Q4_K };
    let bytes = tiny_llama_gguf(&SynthConfig { hidden: 256, ffn: 512, types, ..SynthConfig::tiny() });
    let engine = load(bytes, "{}").await.unwrap_or_else(|e| panic!("the Q4_K model failed to load: {e:?}"));
    let info = engine.info().expect("info");
    let layers = SynthConfig::tiny().n_layers as f64;
    assert_eq!(num(&info, "model.weight_types.Q4_K"), 7.0 * layers, "q, k, v, output, gate, up, down per layer");
    assert_eq!(num(&info, "model.weight_types.Q6_K"), 1.0, "the embedding");
    let out = engine.chat(json(HELLO), json(r#"{"max_tokens": 4, "temperature": 0}"#), Counter::new(None).function()).await.expect("chat");
    assert!(len(&out, "tokens") >= 1, "a reply from the Q4_K model");
    // A type pagedlm does not compute with is MODEL_FORMAT, naming the tensor and the type.
    let mut iq = tiny();
    let g = pagedlm::gguf::Gguf::parse(&iq).unwrap();
    let t = g.tensor("blk.0.ffn_down.weight").unwrap();
    // The type id field follows the name, the dimension count and the dims in the tensor info.
    let mut needle = (t.name.len() as u64).to_le_bytes().to_vec();
    needle.extend(t.name.as_bytes());
    needle.extend((t.dims.len() as u32).to_le_bytes());
    t.dims.iter().for_each(|d| needle.extend(d.to_le_bytes()));
    let at = iq.windows(needle.len()).position(|w| w == needle.as_slice()).expect("the tensor info") + needle.len();
    // IQ4_NL (id 20) has Q4_0's block size, so the file stays well-formed.
    assert_eq!(t.ggml_type, GgmlType::Q4_1);
    drop(g);
    iq[at..at + 4].copy_from_slice(&20u32.to_le_bytes());
    let message = expect_code("an IQ4_NL tensor", load(iq, "{}").await, ErrorCode::Kind(ErrorKind::ModelFormat));
    assert!(message.contains("blk.0.ffn_down.weight") && message.contains("IQ4_NL"), "{message}");
}

#[wasm_bindgen_test]
async fn without_webgpu_loading_is_webgpu_unavailable() {
    let hide = js_sys::Function::new_no_args("Object.defineProperty(navigator, 'gpu', { value: undefined, configurable: true })");
    let restore = js_sys::Function::new_no_args("delete navigator.gpu");
    hide.call0(&JsValue::NULL).expect("hide navigator.gpu");
    let result = load(tiny(), "{}").await;
    restore.call0(&JsValue::NULL).expect("restore navigator.gpu");
    let message = expect_code("no navigator.gpu", result, ErrorCode::Kind(ErrorKind::NoDevice));
    assert!(message.contains("WebGPU"), "the message names what is missing: {message}");
    // The default, auto, runs there on the CPU backend and says why.
    hide.call0(&JsValue::NULL).expect("hide navigator.gpu");
    let result = load_default(tiny(), "{}").await;
    restore.call0(&JsValue::NULL).expect("restore navigator.gpu");
    let info = result.unwrap_or_else(|e| panic!("auto without WebGPU: {e:?}")).info().expect("info");
    assert_eq!(text(&info, "backend"), "cpu");
    assert!(text(&info, "backend_reason").starts_with("auto: no usable WebGPU adapter"), "{}", text(&info, "backend_reason"));
}

/// The default backend is auto: on a CPU emulation (SwiftShader) the CPU backend, on a real GPU
/// WebGPU; `info` says which and why.
#[wasm_bindgen_test]
async fn the_default_backend_is_auto() {
    let webgpu = engine().await.info().expect("info");
    let default = load_default(tiny(), "{}").await.expect("loads").info().expect("info");
    let emulated = get(&webgpu, "is_cpu").as_bool().expect("is_cpu");
    assert_eq!(text(&default, "backend"), if emulated { "cpu" } else { "webgpu" });
    let reason = text(&default, "backend_reason");
    assert!(reason.starts_with(if emulated { "auto: the WebGPU adapter is a CPU emulation" } else { "auto: a GPU adapter" }), "{reason}");
}

#[wasm_bindgen_test]
async fn bad_options_and_messages_are_invalid_arguments() {
    expect_code("unknown kv dtype", load(tiny(), r#"{"kvDtype": "f16"}"#).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    expect_code("misspelled option", load(tiny(), r#"{"maxContxt": 64}"#).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    expect_code("block size 0", load(tiny(), r#"{"blockSize": 0}"#).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    let engine = engine().await;
    let counter = Counter::new(None);
    expect_code("messages not a list", engine.chat(json(r#""hi""#), JsValue::UNDEFINED, counter.function()).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    expect_code(
        "max_tokens negative",
        engine.chat(json(HELLO), json(r#"{"max_tokens": -1}"#), counter.function()).await,
        ErrorCode::Kind(ErrorKind::InvalidArgument),
    );
    expect_code(
        "temperature below 0",
        engine.chat(json(HELLO), json(r#"{"temperature": -1}"#), counter.function()).await,
        ErrorCode::Kind(ErrorKind::InvalidArgument),
    );
    assert_eq!(counter.calls.get(), 0, "nothing was generated");
}

#[wasm_bindgen_test]
async fn a_prompt_longer_than_the_context_is_context_overflow() {
    let engine = load(tiny(), r#"{"maxContext": 32}"#).await.expect("load");
    let long = format!(r#"[{{"role": "user", "content": "{}"}}]"#, "a".repeat(64));
    expect_code(
        "64-token prompt in 32",
        engine.chat(json(&long), JsValue::UNDEFINED, Counter::new(None).function()).await,
        ErrorCode::Kind(ErrorKind::ContextOverflow),
    );
    assert_eq!(num(&engine.stats().expect("stats"), "pool.blocks_used"), 0.0);
}

#[wasm_bindgen_test]
async fn int8_kv_loads_or_says_it_is_unsupported() {
    match load(tiny(), r#"{"kvDtype": "int8"}"#).await {
        Ok(engine) => assert_eq!(text(&engine.info().expect("info"), "kv_dtype"), "int8"),
        Err(e) => assert_eq!(e.code, ErrorCode::Kind(ErrorKind::Unsupported), "{}", e.message),
    }
}

/// Every code this layer gives JS is its own and one the package's `ErrorCode` type
/// (js/index.d.ts) lists; the library's `error::tests` check that type against every kind's code
/// and the package's JS.
#[wasm_bindgen_test]
fn every_code_is_distinct_and_listed_in_the_package_type() {
    let d_ts = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/index.d.ts"));
    let union = &d_ts[d_ts.find("export type ErrorCode =").expect("js/index.d.ts has no ErrorCode type")..];
    let union = &union[..union.find("\n\n").unwrap_or(union.len())];
    let mut seen = std::collections::HashSet::new();
    for code in ErrorCode::all() {
        let text = code.as_str();
        assert!(seen.insert(text), "{code:?}: {text} is another code's too");
        assert!(union.contains(&format!("| \"{text}\"")), "{code:?}: js/index.d.ts's ErrorCode lacks {text}");
    }
    assert_eq!(seen.len(), ErrorKind::ALL.len() + ErrorCode::WEB_ONLY.len());
}

/// The backend the Worker probes WebGPU for when `createEngine` names none is the one
/// `WebEngine.load` takes then: the library's default for users.
#[wasm_bindgen_test]
fn the_default_backend_is_the_one_users_get() {
    let backend = pagedlm::web::default_backend().expect("defaultBackend");
    let name = backend.as_string().unwrap_or_else(|| panic!("defaultBackend() gave {backend:?}"));
    assert_eq!(name, "auto");
    assert_eq!(BackendChoice::parse(&name), Some(EngineOptions::for_users().backend));
}

/// The defaults js/index.d.ts documents for `createEngine`'s options are the ones `load` takes
/// ([`EngineOptions::for_users`]).
#[wasm_bindgen_test]
fn the_documented_engine_defaults_are_the_library_ones() {
    let d_ts = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/index.d.ts"));
    let options = &d_ts[d_ts.find("export interface EngineOptions {").expect("js/index.d.ts has no EngineOptions")..];
    let o = EngineOptions::for_users();
    let name = |value: serde_json::Value| value.as_str().map(String::from).unwrap_or_else(|| panic!("{value} is not a name"));
    let documented = [
        ("kvDtype", format!("\"{}\" (default)", name(serde_json::json!(o.kv_dtype)))),
        ("kvLayout", format!("\"{}\" (default)", name(serde_json::json!(o.kv_layout)))),
        ("blockSize", format!("(default {})", o.block_size)),
        ("prefillChunk", format!("(default {})", o.prefill_chunk)),
        ("prefixCache", format!("(default {})", o.prefix_cache)),
        ("maxBatch", format!("(default {})", o.sched.max_batch)),
        ("stepTokens", format!("(default {})", o.sched.step_tokens)),
        ("optionalFeatures", format!("(default {})", o.optional_features)),
        ("backend", format!("(default \"{}\")", name(serde_json::json!(o.backend)))),
        ("speculative", format!("(default \"{}\")", name(serde_json::json!(o.sched.speculative)))),
    ];
    for (option, said) in documented {
        let at = options.find(&format!("\n  {option}?:")).unwrap_or_else(|| panic!("EngineOptions has no {option}"));
        let doc = &options[options[..at].rfind("/**").expect("a doc comment")..at];
        assert!(doc.contains(&said), "js/index.d.ts documents {option} as {doc:?}, the library's default is {said}");
    }
}

#[wasm_bindgen_test]
fn errors_reach_js_as_errors_with_a_code() {
    let value = JsValue::from(WebError { code: ErrorCode::Kind(ErrorKind::ModelFormat), message: "the file ends early".into() });
    assert!(value.is_instance_of::<js_sys::Error>());
    assert_eq!(text(&value, "code"), "MODEL_FORMAT");
    assert_eq!(text(&value, "name"), "PagedlmError");
    assert_eq!(text(&value, "message"), "the file ends early");
}

/// Drives submitted requests to the end; returns each one's streamed text and final result.
/// Checks that every request is admitted once, before its first token, with the prefix hit its
/// result reports.
async fn run_steps(engine: &WebEngine) -> Vec<(f64, String, JsValue)> {
    let mut streamed: Vec<(f64, String)> = Vec::new();
    let mut admitted: Vec<(f64, JsValue)> = Vec::new();
    let mut done = Vec::new();
    while engine.has_work().expect("hasWork") {
        let events = engine.step().await.unwrap_or_else(|e| panic!("step failed: {e:?}"));
        for event in js_sys::Array::from(&events).iter() {
            let id = num(&event, "id");
            let kind = text(&event, "type");
            if kind != "admitted" {
                assert!(admitted.iter().any(|(i, _)| *i == id), "request {id}: {kind} before its admitted event");
            }
            match kind.as_str() {
                "admitted" => {
                    assert!(!admitted.iter().any(|(i, _)| *i == id), "request {id} admitted twice");
                    assert!(num(&event, "prompt_tokens") > 0.0, "{event:?}");
                    admitted.push((id, event));
                }
                "token" => match streamed.iter_mut().find(|(i, _)| *i == id) {
                    Some((_, t)) => t.push_str(&text(&event, "text")),
                    None => streamed.push((id, text(&event, "text"))),
                },
                "finished" => {
                    let t = streamed.iter().find(|(i, _)| *i == id).map(|(_, t)| t.clone()).unwrap_or_default();
                    let (_, admission) = admitted.iter().find(|(i, _)| *i == id).expect("checked above");
                    let result = get(&event, "result");
                    assert_eq!(num(admission, "prefix_hit_tokens"), num(&result, "prefix_hit_tokens"), "request {id}: the hit at admission is the result's");
                    assert_eq!(num(admission, "prompt_tokens"), len(&result, "prompt_tokens") as f64, "request {id}: prompt_tokens");
                    done.push((id, t, result));
                }
                other => panic!("request {id} ended with {other}: {event:?}"),
            }
        }
    }
    done
}

#[wasm_bindgen_test]
async fn submitted_requests_run_together_and_match_their_solo_runs() {
    let engine = engine().await;
    let asks = [r#"[{"role": "user", "content": "hello there"}]"#, r#"[{"role": "user", "content": "what a day"}]"#];
    let options = json(r#"{"max_tokens": 5, "temperature": 0}"#);
    let mut solo = Vec::new();
    for messages in asks {
        solo.push(engine.chat(json(messages), options.clone(), Counter::new(None).function()).await.expect("chat"));
    }
    engine.reset_cache().expect("reset");
    // `chat` runs through the scheduler too: the solo runs above count as finished requests.
    let finished_before = num(&engine.stats().expect("stats"), "sched.finished");
    let ids: Vec<f64> = asks.iter().map(|m| num(&engine.submit(json(m), options.clone()).expect("submit"), "id")).collect();
    assert_ne!(ids[0], ids[1]);
    let stats = engine.stats().expect("stats");
    assert_eq!(num(&stats, "sched.waiting"), 2.0, "both wait for the first step");
    let done = run_steps(&engine).await;
    assert_eq!(done.len(), 2);
    for (i, id) in ids.iter().enumerate() {
        let (_, streamed, result) = done.iter().find(|(d, _, _)| d == id).expect("every request finishes");
        assert_eq!(
            js_sys::JSON::stringify(&get(result, "tokens")).ok(),
            js_sys::JSON::stringify(&get(&solo[i], "tokens")).ok(),
            "request {i} batched gives the tokens it gives alone"
        );
        if text(result, "finish_reason") == "length" {
            assert_eq!(streamed, &text(result, "text"), "its token events spell its text");
        }
    }
    let stats = engine.stats().expect("stats");
    assert_eq!(num(&stats, "pool.blocks_used"), 0.0);
    assert_eq!(num(&stats, "sched.finished") - finished_before, 2.0);
}

#[wasm_bindgen_test]
async fn abort_ends_a_submitted_request_and_releases_its_blocks() {
    let engine = engine().await;
    let id = num(&engine.submit(json(HELLO), json(r#"{"max_tokens": 40, "temperature": 0}"#)).expect("submit"), "id");
    engine.step().await.expect("step");
    engine.step().await.expect("step");
    assert!(num(&engine.stats().expect("stats"), "pool.blocks_used") > 0.0, "the running request holds blocks");
    let partial = engine.abort(id).expect("abort");
    assert_eq!(text(&partial, "finish_reason"), "abort");
    assert_eq!(num(&engine.stats().expect("stats"), "pool.blocks_used"), 0.0, "its blocks are released at once");
    assert!(!engine.has_work().expect("hasWork"));
    assert!(engine.abort(id).expect("abort again").is_null(), "a finished request aborts to null");
    expect_code("a fractional id", engine.abort(1.5), ErrorCode::Kind(ErrorKind::InvalidArgument));
    let long = format!(r#"[{{"role": "user", "content": "{}"}}]"#, "a".repeat(600));
    expect_code("an overlong prompt fails at submit", engine.submit(json(&long), JsValue::UNDEFINED), ErrorCode::Kind(ErrorKind::ContextOverflow));
}

#[wasm_bindgen_test]
async fn a_snapshot_moves_a_conversation_to_another_engine_and_bad_bytes_are_refused() {
    let options = r#"{"max_tokens": 5, "temperature": 0}"#;
    let source = engine().await;
    let first = source.chat(json(HELLO), json(options), Counter::new(None).function()).await.expect("chat");
    let reply = text(&first, "text");
    let history = js_sys::Array::from(&json(HELLO));
    history.push(&json(&format!(
        r#"{{"role": "assistant", "content": {}}}"#,
        js_sys::JSON::stringify(&JsValue::from_str(&reply)).expect("quote").as_string().expect("a string")
    )));
    let ids = source.history_tokens(history.clone().into()).expect("historyTokens");
    assert!(ids.len() > len(&first, "prompt_tokens") as usize, "the history holds the prompt and the reply");
    let snapshot = source.export_snapshot(ids.clone()).await.expect("exportSnapshot");

    let follow_up = history.clone();
    follow_up.push(&json(r#"{"role": "user", "content": "and then?"}"#));
    let target = engine().await;
    assert_eq!(target.import_snapshot(snapshot.clone()).expect("importSnapshot"), ids, "the import returns the snapshot's tokens");
    let moved = target.chat(follow_up.clone().into(), json(options), Counter::new(None).function()).await.expect("chat after import");
    let hit = num(&moved, "prefix_hit_tokens") as usize;
    assert!(hit + 1 >= ids.len(), "the follow-up reuses the imported history ({hit} of {} tokens)", ids.len());
    let local = source.chat(follow_up.into(), json(options), Counter::new(None).function()).await.expect("chat on the source");
    assert_eq!(
        js_sys::JSON::stringify(&get(&moved, "tokens")).ok(),
        js_sys::JSON::stringify(&get(&local, "tokens")).ok(),
        "greedy: the imported K/V give the reply the source engine gives"
    );

    let fresh = engine().await;
    let mut flipped = snapshot.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    expect_code("a flipped byte", fresh.import_snapshot(flipped), ErrorCode::Kind(ErrorKind::SnapshotCorrupt));
    expect_code("a truncated snapshot", fresh.import_snapshot(snapshot[..snapshot.len() - 9].to_vec()), ErrorCode::Kind(ErrorKind::SnapshotCorrupt));
    expect_code("not a snapshot", fresh.import_snapshot(b"hello".to_vec()), ErrorCode::Kind(ErrorKind::SnapshotCorrupt));
    let int8 = load(tiny(), r#"{"kvDtype": "int8"}"#).await.expect("an int8 engine");
    expect_code("an f32 snapshot in an int8 pool", int8.import_snapshot(snapshot), ErrorCode::Kind(ErrorKind::SnapshotMismatch));
    for refused in [&fresh, &int8] {
        let stats = refused.stats().expect("stats");
        assert_eq!(num(&stats, "pool.blocks_free"), num(&stats, "pool.blocks_total"), "a refused snapshot changes nothing");
    }
}

#[wasm_bindgen_test]
async fn every_request_is_admitted_before_its_first_token_with_its_prefix_hit() {
    let engine = engine().await;
    let options = json(r#"{"max_tokens": 4, "temperature": 0}"#);
    let first = engine.chat(json(HELLO), options.clone(), Counter::new(None).function()).await.expect("chat");
    let prompt = len(&first, "prompt_tokens") as f64;
    let repeat = num(&engine.submit(json(HELLO), options.clone()).expect("submit"), "id");
    let other = num(&engine.submit(json(r#"[{"role": "user", "content": "what a day"}]"#), options).expect("submit"), "id");
    let mut admitted: Vec<(f64, f64)> = Vec::new();
    let mut tokens_before_admission = Vec::new();
    let mut finished = 0;
    while engine.has_work().expect("hasWork") {
        let events = engine.step().await.unwrap_or_else(|e| panic!("step failed: {e:?}"));
        for event in js_sys::Array::from(&events).iter() {
            let id = num(&event, "id");
            match text(&event, "type").as_str() {
                "admitted" => admitted.push((id, num(&event, "prefix_hit_tokens"))),
                "token" if !admitted.iter().any(|(i, _)| *i == id) => tokens_before_admission.push(id),
                "finished" => finished += 1,
                _ => {}
            }
        }
    }
    assert_eq!(finished, 2);
    assert!(tokens_before_admission.is_empty(), "tokens before admission: {tokens_before_admission:?}");
    let mut ids: Vec<f64> = admitted.iter().map(|(i, _)| *i).collect();
    ids.sort_by(f64::total_cmp);
    assert_eq!(ids, [repeat, other], "one admitted event per request");
    let hit = admitted.iter().find(|(i, _)| *i == repeat).map(|(_, h)| *h).expect("admitted");
    assert!(hit >= prompt - 16.0 && hit > 0.0, "the repeated prompt is admitted with its cached prefix ({hit} of {prompt})");
}

/// Makes every `GPUBuffer.mapAsync` reject, as a lost device does, until the guard is dropped.
struct FailingReadbacks;

impl FailingReadbacks {
    fn install() -> FailingReadbacks {
        js_sys::Function::new_no_args(
            "GPUBuffer.prototype.__pagedlmMapAsync = GPUBuffer.prototype.mapAsync; \
             GPUBuffer.prototype.mapAsync = function () { return Promise.reject(new DOMException('the test lost the device', 'OperationError')); };",
        )
        .call0(&JsValue::NULL)
        .expect("patch GPUBuffer.mapAsync");
        FailingReadbacks
    }
}

impl Drop for FailingReadbacks {
    fn drop(&mut self) {
        let _ = js_sys::Function::new_no_args(
            "GPUBuffer.prototype.mapAsync = GPUBuffer.prototype.__pagedlmMapAsync; delete GPUBuffer.prototype.__pagedlmMapAsync;",
        )
        .call0(&JsValue::NULL);
    }
}

#[wasm_bindgen_test]
async fn a_failed_forward_step_ends_its_requests_with_gpu_error() {
    let engine = engine().await;
    let id = num(&engine.submit(json(HELLO), json(r#"{"max_tokens": 4, "temperature": 0}"#)).expect("submit"), "id");
    let failing = FailingReadbacks::install();
    let events = engine.step().await;
    drop(failing);
    let events = events.unwrap_or_else(|e| panic!("the step itself failed instead of its requests: {e:?}"));
    let failed = js_sys::Array::from(&events).iter().find(|e| text(e, "type") == "failed").unwrap_or_else(|| panic!("no failed event in {events:?}"));
    assert_eq!(num(&failed, "id"), id);
    assert_eq!(text(&failed, "code"), "GPU_ERROR", "{}", text(&failed, "message"));
    assert!(!engine.has_work().expect("hasWork"), "the failed request is over");
    assert_eq!(num(&engine.stats().expect("stats"), "pool.blocks_used"), 0.0, "its blocks are released");
}

/// Where the value of metadata `key` starts in a GGUF file: after the key's length, its bytes
/// and the value's type id.
fn meta_value_at(bytes: &[u8], key: &str) -> usize {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend(key.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle.as_slice()).unwrap_or_else(|| panic!("no {key} in the file"));
    at + needle.len() + 4
}

/// The tiny model as a base model: its `tokenizer.chat_template` key renamed (same length, so
/// the file stays well-formed), so the file has no chat template.
fn tiny_base() -> Vec<u8> {
    let mut bytes = tiny();
    let key = "tokenizer.chat_template";
    let at = meta_value_at(&bytes, key) - 4 - key.len();
    bytes[at..at + key.len()].copy_from_slice(b"tokenizer.xxxx_template");
    bytes
}

#[wasm_bindgen_test]
async fn info_names_the_architecture_window_chat_format_and_kv_bytes_per_token() {
    let cfg = SynthConfig::tiny();
    let info = engine().await.info().expect("info");
    assert_eq!(text(&info, "model.architecture"), text(&info, "model.arch"));
    assert_eq!(text(&info, "model.architecture"), "llama", "the synthetic file's general.architecture");
    assert!(get(&info, "model.sliding_window").is_null(), "a llama has no local layers");
    assert_eq!(text(&info, "model.chat_template"), "chatml", "the synthetic file carries SmolLM2's ChatML template");
    // f32 K and V, every layer and KV head.
    let per_token = cfg.n_layers * cfg.n_kv_heads * cfg.head_dim() * 2 * 4;
    assert_eq!(num(&info, "kv.bytes_per_token"), per_token as f64);
    let int8 = load(tiny(), r#"{"kvDtype": "int8"}"#).await;
    if let Ok(int8) = int8 {
        assert!(num(&int8.info().expect("info"), "kv.bytes_per_token") < per_token as f64 / 2.0, "int8 K/V take under half of f32's");
    }
    let base = load(tiny_base(), "{}").await.expect("the base model loads").info().expect("info");
    assert!(get(&base, "model.chat_template").is_null(), "no chat template: completion mode");
}

#[wasm_bindgen_test]
async fn a_base_model_completes_raw_text_and_refuses_chat() {
    let engine = load(tiny_base(), "{}").await.expect("the base model loads");
    let options = json(r#"{"max_tokens": 5, "temperature": 0}"#);
    for refused in
        [engine.submit(json(HELLO), options.clone()).map(|_| ()), engine.chat(json(HELLO), options.clone(), Counter::new(None).function()).await.map(|_| ())]
    {
        let message = expect_code("chat on a base model", refused, ErrorCode::Kind(ErrorKind::InvalidArgument));
        assert!(message.contains("completion mode") && message.contains("chat template"), "{message}");
    }
    let prompt = "Once upon a time, in a land far away";
    let first = engine.submit_prompt(prompt.into(), options.clone()).expect("submitPrompt");
    // The synthetic vocabulary has no merges and the file no BOS: one token per byte, as written.
    assert_eq!(num(&first, "prompt_tokens"), prompt.len() as f64, "the raw text, no template, no BOS");
    let done = run_steps(&engine).await;
    assert_eq!(done.len(), 1);
    let (id, streamed, result) = &done[0];
    assert_eq!(*id, num(&first, "id"));
    assert!((1..=5).contains(&len(result, "tokens")), "{result:?}");
    if text(result, "finish_reason") == "length" {
        assert_eq!(streamed, &text(result, "text"), "the token events spell the completion");
    }
    // The same prompt again: its full blocks come from the prefix cache, the completion is the same.
    engine.submit_prompt(prompt.into(), options.clone()).expect("submitPrompt");
    let again = run_steps(&engine).await;
    assert_eq!(text(&again[0].2, "text"), text(result, "text"), "greedy: the same completion");
    assert!(num(&again[0].2, "prefix_hit_tokens") > 0.0, "{:?}", again[0].2);
    expect_code("an empty prompt", engine.submit_prompt(String::new(), options.clone()), ErrorCode::Kind(ErrorKind::InvalidArgument));
    expect_code("a bad option", engine.submit_prompt(prompt.into(), json(r#"{"max_token": 3}"#)), ErrorCode::Kind(ErrorKind::InvalidArgument));

    // A file that asks for BOS gets it before the text.
    let mut bos = tiny_base();
    let at = meta_value_at(&bos, "tokenizer.ggml.add_bos_token");
    assert_eq!(bos[at], 0, "the synthetic file says false");
    bos[at] = 1;
    let engine = load(bos, "{}").await.expect("loads");
    let submitted = engine.submit_prompt(prompt.into(), options).expect("submitPrompt");
    assert_eq!(num(&submitted, "prompt_tokens"), prompt.len() as f64 + 1.0, "BOS, then the text");
    let done = run_steps(&engine).await;
    let bos_id = 1.0; // tokenizer.ggml.bos_token_id of the synthetic file
    assert_eq!(js_sys::Array::from(&get(&done[0].2, "prompt_tokens")).get(0).as_f64(), Some(bos_id));
}

#[wasm_bindgen_test]
async fn profile_reports_the_decode_step_and_refuses_bad_calls() {
    let engine = load(tiny(), r#"{"maxContext": 64, "prefillChunk": 8}"#).await.expect("loads");
    let p = engine.profile(20, JsValue::UNDEFINED).await.expect("profile");
    let method = text(&p, "method");
    assert!(method == "timestamps" || method == "wall_clock_per_kernel", "{method}");
    let kernels = js_sys::Array::from(&get(&p, "decode.kernels"));
    let listed: f64 = kernels.iter().map(|k| num(&k, "dispatches")).sum();
    assert_eq!(listed, num(&p, "decode.dispatches"), "the kernels cover every dispatch");
    assert_eq!(num(&p, "dispatches_per_decode_step"), listed);
    assert_eq!(num(&p, "blocking_readbacks_per_token"), 0.0, "tokens read while the next step runs");
    assert_eq!(num(&p, "decode.bytes_read_back_per_token"), 4.0, "one greedy row: its 4-byte argmax");
    assert_eq!(num(&p, "prefill.readbacks"), 3.0, "20 tokens in passes of 8");
    let host = engine.profile(20, json(r#"{"timestamps": false}"#)).await.expect("profile on the host clock");
    assert_eq!(text(&host, "method"), "wall_clock_per_kernel");
    assert_eq!(num(&host, "decode.dispatches"), listed);

    expect_code("an unknown option", engine.profile(20, json(r#"{"timestamp": false}"#)).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    expect_code("longer than the context", engine.profile(60, JsValue::UNDEFINED).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    engine.submit_prompt("hi".into(), json(r#"{"max_tokens": 2}"#)).expect("submitPrompt");
    expect_code("while a request waits", engine.profile(20, JsValue::UNDEFINED).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
    run_steps(&engine).await;
    engine.profile(20, JsValue::UNDEFINED).await.expect("profile once idle again");
}

#[wasm_bindgen_test]
async fn response_format_and_grammar_constrain_chat_and_bad_ones_are_invalid_arguments() {
    let engine = engine().await;
    let schema = r#"{"max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
        "schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"], "additionalProperties": false}}}}"#;
    let out = engine.chat(json(HELLO), json(schema), Counter::new(None).function()).await.unwrap_or_else(|e| panic!("chat failed: {e:?}"));
    let reply = js_sys::JSON::parse(&text(&out, "text")).unwrap_or_else(|e| panic!("{:?} does not parse: {e:?}", text(&out, "text")));
    let n = num(&reply, "n");
    assert!((1.0..=9.0).contains(&n) && js_sys::Object::keys(reply.unchecked_ref::<js_sys::Object>()).length() == 1, "{:?}", text(&out, "text"));
    assert_eq!(text(&out, "finish_reason"), "stop");
    let out = engine.chat(json(HELLO), json(r#"{"grammar": "start: \"ok\" | \"no\""}"#), Counter::new(None).function()).await.expect("chat");
    assert!(["ok", "no"].contains(&text(&out, "text").as_str()), "{:?}", text(&out, "text"));
    let cut = r#"{"max_tokens": 2, "response_format": {"type": "json_object"}}"#;
    let out = engine.chat(json(HELLO), json(cut), Counter::new(None).function()).await.expect("chat");
    assert_eq!(text(&out, "finish_reason"), "length");
    assert!(text(&out, "warning").contains("not match"), "a warning that the output is incomplete");

    let counter = Counter::new(None);
    let bad = [
        (r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}"#, "objekt"),
        (r#"{"response_format": {"type": "yaml"}}"#, "yaml"),
        (r#"{"grammar": "start: ("}"#, "invalid constraint"),
        (r#"{"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}"#, "exclude"),
    ];
    for (options, needle) in bad {
        let message = expect_code(options, engine.chat(json(HELLO), json(options), counter.function()).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
        assert!(message.contains(needle), "{options}: {message}");
    }
    assert_eq!(counter.calls.get(), 0, "nothing was generated");
}

#[wasm_bindgen_test]
async fn tools_answer_with_calls_that_a_tool_turn_continues_and_bad_tools_are_invalid_arguments() {
    // Room for the tools' system turn in the tiny model's byte-level tokens.
    let engine = load(tiny_llama_gguf(&SynthConfig { context: 1536, ..SynthConfig::tiny() }), r#"{"maxContext": 1536}"#).await.expect("load");
    let tools = r#"[{"type": "function", "function": {"name": "lamp", "description": "Turns the lamp on or off", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}}]"#;
    let options = format!(r#"{{"max_tokens": 120, "tools": {tools}, "tool_choice": {{"type": "function", "function": {{"name": "lamp"}}}}}}"#);
    let out = engine.chat(json(HELLO), json(&options), Counter::new(None).function()).await.unwrap_or_else(|e| panic!("chat failed: {e:?}"));
    assert_eq!(text(&out, "finish_reason"), "tool_calls", "{:?}", text(&out, "text"));
    assert_eq!(text(&out, "tool_calls.0.function.name"), "lamp");
    let args = js_sys::JSON::parse(&text(&out, "tool_calls.0.function.arguments")).expect("arguments parse");
    assert!(get(&args, "on").as_bool().is_some(), "{args:?}");
    // The call and a tool result, written back, continue the conversation.
    let id = text(&out, "tool_calls.0.id");
    let calls = js_sys::JSON::stringify(&get(&out, "tool_calls")).unwrap().as_string().unwrap();
    let history = format!(
        r#"[{{"role": "user", "content": "hello there"}}, {{"role": "assistant", "content": null, "tool_calls": {calls}}}, {{"role": "tool", "tool_call_id": "{id}", "content": "done"}}]"#
    );
    let auto = format!(r#"{{"max_tokens": 4, "tools": {tools}}}"#);
    let counter = Counter::new(None);
    let out = engine.chat(json(&history), json(&auto), counter.function()).await.unwrap_or_else(|e| panic!("the tool turn failed: {e:?}"));
    assert!(num(&out, "tokens.length") > 0.0 && counter.calls.get() > 0, "nothing after the tool result");

    let counter = Counter::new(None);
    let bad = [
        (format!(r#"{{"tools": {tools}, "tool_choice": "sometimes"}}"#), "sometimes"),
        (r#"{"tool_choice": "required"}"#.to_string(), "needs tools"),
        (format!(r#"{{"tools": {tools}, "response_format": {{"type": "json_object"}}}}"#), "tools"),
        (r#"{"tools": [{"type": "custom", "custom": {"name": "x"}}]}"#.to_string(), "function"),
    ];
    for (options, needle) in &bad {
        let message = expect_code(options, engine.chat(json(HELLO), json(options), counter.function()).await, ErrorCode::Kind(ErrorKind::InvalidArgument));
        assert!(message.contains(needle), "{options}: {message}");
    }
    let message = expect_code("tools in completion mode", engine.submit_prompt("x".into(), json(&auto)), ErrorCode::Kind(ErrorKind::InvalidArgument));
    assert!(message.contains("chat"), "{message}");
    assert_eq!(counter.calls.get(), 0, "nothing was generated");
}
