//! Shared test helpers: a GPU context that fails loudly without an adapter, a test macro that
//! runs the same async test natively (lavapipe, through pollster) and in headless Chromium
//! (SwiftShader, through wasm-bindgen-test), and tolerance checks.
#![allow(dead_code)]

use std::sync::Arc;

use pagedlm::engine::{Engine, EngineError, EngineOptions};
use pagedlm::gpu::{AdapterClass, Context, ContextOptions};

/// The GPU context for a test, shared with the other tests of its binary that ask for the same
/// options ([`Context::shared`]): each kernel compiles once per binary, not once per test. A
/// missing adapter is a failure that says why, never a skip.
pub async fn gpu() -> Arc<Context> {
    gpu_with(ContextOptions::default()).await
}

/// [`gpu`] with options (a forced adapter class, optional features off).
pub async fn gpu_with(options: ContextOptions) -> Arc<Context> {
    Context::shared(options).await.unwrap_or_else(|e| no_adapter(e))
}

/// A context whose counters only this test moves, for tests that read them: natively a context
/// of its own (the tests of a binary run on parallel threads, and a shared context counts for all
/// of them); in the browser, where tests run one at a time, the shared one.
pub async fn counting_gpu_with(options: ContextOptions) -> Arc<Context> {
    #[cfg(not(target_arch = "wasm32"))]
    return fresh_gpu_with(options).await;
    #[cfg(target_arch = "wasm32")]
    return gpu_with(options).await;
}

/// A new device, which has compiled nothing yet (for a test that watches the first compiles).
pub async fn fresh_gpu_with(options: ContextOptions) -> Arc<Context> {
    Arc::new(Context::new(options).await.unwrap_or_else(|e| no_adapter(e)))
}

fn no_adapter(e: pagedlm::gpu::GpuError) -> ! {
    panic!("this test needs a WebGPU/Vulkan adapter and found none: {e}")
}

/// [`Engine::load`] on a [`counting_gpu_with`] context.
pub async fn load_counting(bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
    Engine::load_with_context(counting_gpu_with(options.context_options()).await, bytes, options)
}

/// [`Engine::load`] on a [`fresh_gpu_with`] context.
pub async fn load_fresh(bytes: &[u8], options: EngineOptions) -> Result<Engine, EngineError> {
    Engine::load_with_context(fresh_gpu_with(options.context_options()).await, bytes, options)
}

/// One context per kernel variant family a real adapter would get, all on this machine's adapter:
/// each adapter class with the optional features the adapter has (subgroups, shader-f16) and, where
/// it has any, each class without them too. A variant test runs its kernels on every one of them,
/// so the real-GPU variants are checked on the software GPUs.
pub async fn variant_contexts() -> Vec<Arc<Context>> {
    let mut out = Vec::new();
    for (class, optional_features) in variants().await {
        out.push(gpu_with(ContextOptions { class: Some(class), optional_features, ..Default::default() }).await);
    }
    out
}

/// The (adapter class, optional features) of each of [`variant_contexts`], for tests that load
/// engines (`EngineOptions::{adapter_class, optional_features}`).
pub async fn variants() -> Vec<(AdapterClass, bool)> {
    let probe = gpu().await;
    let has_optional = probe.has_subgroups(1) || probe.has_f16();
    let mut out = Vec::new();
    for class in [AdapterClass::Cpu, AdapterClass::Integrated, AdapterClass::Discrete] {
        out.push((class, true));
        if has_optional {
            out.push((class, false));
        }
    }
    out
}

/// Defines an async test that runs in both runtimes.
#[macro_export]
macro_rules! gpu_test {
    (async fn $name:ident() $body:block) => {
        #[cfg(not(target_arch = "wasm32"))]
        #[test]
        fn $name() {
            pollster::block_on(async $body)
        }
        #[cfg(target_arch = "wasm32")]
        #[wasm_bindgen_test::wasm_bindgen_test]
        async fn $name() $body
    };
}

/// Asserts |a - b| <= abs_tol + rel_tol * |b| element-wise, reporting the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs_tol: f32, rel_tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length {} != {}", got.len(), want.len());
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let excess = err - (abs_tol + rel_tol * w.abs());
        if !(g.is_finite()) || excess > worst.1 {
            worst = (i, if g.is_finite() { excess } else { f32::INFINITY });
        }
    }
    if worst.1 > 0.0 {
        let i = worst.0;
        panic!("{what}: element {i} is {} but the reference is {} (tolerance {abs_tol} + {rel_tol}·|ref|)", got[i], want[i]);
    }
}

/// The real model's bytes. Natively from `PAGEDLM_MODEL` or `models/` in the crate; in the
/// browser fetched from `PAGEDLM_MODEL_URL` (set at build time by scripts/test.sh, which serves
/// models/ on a local port). A missing model fails the test with what to do.
#[cfg(not(target_arch = "wasm32"))]
pub async fn real_model_bytes() -> Vec<u8> {
    let path = std::env::var("PAGEDLM_MODEL").unwrap_or_else(|_| format!("{}/models/SmolLM2-135M-Instruct.Q4_1.gguf", env!("CARGO_MANIFEST_DIR")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("the real model is needed at {path} ({e}): run `npm run fetch-model`"))
}

#[cfg(target_arch = "wasm32")]
pub async fn real_model_bytes() -> Vec<u8> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    let url = option_env!("PAGEDLM_MODEL_URL").expect(
        "PAGEDLM_MODEL_URL was not set when the browser tests were built: run them through `npm test` (scripts/test.sh), \
         which serves models/ locally",
    );
    let window = web_sys::window().expect("the browser tests run in a window");
    let resp = JsFuture::from(window.fetch_with_str(url))
        .await
        .unwrap_or_else(|e| panic!("fetching the model from {url} failed: {e:?} (is scripts/serve.mjs running?)"));
    let resp: web_sys::Response = resp.dyn_into().expect("fetch returns a Response");
    assert!(resp.ok(), "fetching the model from {url}: HTTP {}", resp.status());
    let buf = JsFuture::from(resp.array_buffer().expect("array_buffer")).await.expect("reading the model body");
    js_sys::Uint8Array::new(&buf).to_vec()
}

/// Prints a line of a test's figures: to stdout natively, to the browser console in Chromium.
pub fn report(line: &str) {
    #[cfg(not(target_arch = "wasm32"))]
    println!("{line}");
    #[cfg(target_arch = "wasm32")]
    wasm_bindgen_test::console_log!("{line}");
}

/// Lets the page's event loop run (in wasm a zero-delay timeout; natively nothing). The CPU
/// backend computes on the test page's main thread without waiting on anything, and WebDriver,
/// which polls the page for the test's output, ends the run when the page answers nothing for
/// 30 s ("Timed out receiving message from renderer"): a browser test on the CPU backend yields
/// between its pieces of work, each well under that on a loaded machine.
pub async fn yield_to_page() {
    #[cfg(target_arch = "wasm32")]
    pagedlm::time::sleep_ms(0).await;
}

/// Milliseconds since an arbitrary origin, in both runtimes.
pub fn now_ms() -> f64 {
    pagedlm::time::now_ms()
}

/// The default tiny synthetic llama GGUF ([`pagedlm::synth::SynthConfig::tiny`]) with its
/// weights drawn from `seed`.
pub fn tiny_model(seed: u64) -> Vec<u8> {
    use pagedlm::synth::{tiny_llama_gguf, SynthConfig};
    tiny_llama_gguf(&SynthConfig { seed, ..SynthConfig::tiny() })
}

/// The configuration of [`tiny_model`]`(seed)`, read back from its GGUF.
pub fn tiny_config(seed: u64) -> pagedlm::model::ModelConfig {
    let bytes = tiny_model(seed);
    pagedlm::model::ModelConfig::from_gguf(&pagedlm::gguf::Gguf::parse(&bytes).unwrap()).unwrap()
}

/// One prompt of a llama.cpp reference file (`llamacpp_public.json`): its prompt plus llama.cpp's
/// greedy completion, teacher-forced from `from` on.
pub struct LlamaCppItem {
    pub id: String,
    /// prompt_ids then completion_ids.
    pub ids: Vec<u32>,
    /// The prompt's length: the first position scored.
    pub from: usize,
    /// llama.cpp: (token, logit, margin to the runner-up) per greedy step.
    pub steps: Vec<(u32, f32, f32)>,
}

/// Every result of a llama.cpp reference file (the JSON text).
pub fn llamacpp_items(json: &str) -> Vec<LlamaCppItem> {
    let l: serde_json::Value = serde_json::from_str(json).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let step = |s: &serde_json::Value| (s[0].as_u64().unwrap() as u32, s[1].as_f64().unwrap() as f32, s[2].as_f64().unwrap() as f32);
    l["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let prompt = ids(&r["prompt_ids"]);
            LlamaCppItem {
                id: r["id"].as_str().unwrap().to_string(),
                from: prompt.len(),
                ids: [prompt, ids(&r["completion_ids"])].concat(),
                steps: r["greedy_steps"]["steps"].as_array().unwrap().iter().map(step).collect(),
            }
        })
        .collect()
}

/// Gemma 3 270M Q4_K_M's bytes, from `PAGEDLM_GEMMA_MODEL` or `models/` in the crate; missing,
/// the test fails with the command that fetches it.
#[cfg(not(target_arch = "wasm32"))]
pub fn gemma_model_bytes() -> Vec<u8> {
    let path = std::env::var("PAGEDLM_GEMMA_MODEL").unwrap_or_else(|_| format!("{}/models/gemma-3-270m-q4_k_m.gguf", env!("CARGO_MANIFEST_DIR")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("Gemma 3 270M is needed at {path} ({e}): run `npm run fetch-model -- gemma3-270m`"))
}

/// The engine with int8 activations against the f64 recompute, prefill and decode: int8 rounding
/// moves logits by more than LOGIT_TOL, so the yardstick is how far it moves the recompute itself
/// (the recompute with its matmul inputs quantized as the GPU quantizes them, `Activations::Int8`).
/// The engine's own rounding is another draw of the same noise (one f32-sized difference in an
/// activation rounds it to the other int8 value, and that carries through the layers), so it may
/// be a few times further; a wrong scale, block or buffer moves the logits by their whole spread
/// (~2). `what` names the model.
pub async fn assert_int8_within_rounding(what: &str, bytes: &[u8], ids: &[u32], opts: pagedlm::engine::EngineOptions) {
    use pagedlm::engine::{Engine, EngineOptions, ScoreMode};
    use pagedlm::gguf::Gguf;
    use pagedlm::model::reference::{forward_cpu_with, Activations};
    use pagedlm::model::ModelConfig;
    // |GPU f32 − CPU f64| of the exact path (tests/tiny_model.rs).
    const LOGIT_TOL: f32 = 2e-3;
    let max_diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let gguf = Gguf::parse(bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let exact = forward_cpu_with(&gguf, &cfg, ids, 0, Activations::F32).unwrap();
    let rounded = forward_cpu_with(&gguf, &cfg, ids, 0, Activations::Int8).unwrap();
    let effect = exact.iter().zip(&rounded).map(|(a, b)| max_diff(a, b)).fold(0.0, f32::max);
    assert!(effect > LOGIT_TOL, "{what}: int8 rounding moves the recompute by only {effect}: the test would not see it");
    let tol = 3.0 * effect + LOGIT_TOL;
    // Asked for explicitly (whatever the default), checked on every adapter.
    let mut engine = Engine::load(bytes, EngineOptions { int8_activations: Some(true), ..opts }).await.unwrap();
    for (mode, from) in [(ScoreMode::Prefill, 1), (ScoreMode::Decode, ids.len() / 2)] {
        let rows = engine.score_logits(ids, from, mode).await.unwrap();
        let worst = rows.iter().enumerate().map(|(i, row)| max_diff(row, &exact[from - 1 + i])).fold(0.0, f32::max);
        assert!(worst <= tol, "{what} {mode:?}: int8 logits differ from the recompute by {worst}, int8 rounding alone by {effect}");
    }
}

/// Steps `engine` until every submitted request has finished and returns each one's generation,
/// checking that its streamed tokens are its result's (and, with `check_integrity`, the KV cache
/// after every step). A failed request fails the test.
pub async fn finish_streamed(
    engine: &mut pagedlm::engine::Engine,
    check_integrity: bool,
) -> std::collections::HashMap<pagedlm::engine::RequestId, pagedlm::engine::Generation> {
    use pagedlm::engine::Event;
    let (mut streamed, mut done) = (std::collections::HashMap::new(), std::collections::HashMap::new());
    while engine.has_work() {
        for e in engine.step().await.unwrap() {
            match e {
                Event::Token { id, token, .. } => streamed.entry(id).or_insert_with(Vec::new).push(token),
                Event::Finished { id, result } => {
                    let g = result.unwrap_or_else(|e| panic!("request {id:?} failed: {e}"));
                    assert_eq!(streamed.remove(&id).unwrap_or_default(), g.tokens, "streamed tokens differ from the result");
                    done.insert(id, g);
                }
                Event::Admitted { .. } => {}
            }
        }
        if check_integrity {
            engine.kv_cache().check_integrity().unwrap();
        }
    }
    done
}

/// A copy of the GGUF `bytes` with its `tokenizer.chat_template` replaced by `chat_template`.
pub fn with_chat_template(bytes: &[u8], chat_template: &str) -> Vec<u8> {
    pagedlm::synth::with_chat_template(bytes, chat_template).unwrap()
}

/// A real chat template of tests/data/templates/ (native tests: read from disk).
#[cfg(not(target_arch = "wasm32"))]
pub fn chat_template(name: &str) -> String {
    let path = format!("{}/tests/data/templates/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A copy of the GGUF `bytes` with each tensor `pick` gives a type for re-encoded to it (through
/// f32), and with `output.weight` added as the embedding re-encoded to `output` when given.
pub fn retyped(bytes: &[u8], pick: &dyn Fn(&str) -> Option<pagedlm::gguf::GgmlType>, output: Option<pagedlm::gguf::GgmlType>) -> Vec<u8> {
    let g = pagedlm::gguf::Gguf::parse(bytes).unwrap();
    let mut w = pagedlm::synth::GgufWriter::new();
    for (k, v) in &g.metadata {
        if k != "general.alignment" {
            w.add_meta(k.clone(), v.clone()).unwrap();
        }
    }
    let values = |t: &pagedlm::gguf::TensorInfo| {
        let mut out = vec![0f32; t.dims.iter().product::<u64>() as usize];
        pagedlm::quant::dequantize(t.ggml_type, g.tensor_data(t), &mut out).unwrap();
        out
    };
    for t in &g.tensors {
        match pick(&t.name).filter(|_| t.dims.len() == 2) {
            Some(ty) => w.add_tensor(t.name.clone(), &t.dims, ty, pagedlm::quant::quantize(ty, &values(t)).unwrap()).unwrap(),
            None => w.add_tensor(t.name.clone(), &t.dims, t.ggml_type, g.tensor_data(t).to_vec()).unwrap(),
        }
    }
    if let Some(ty) = output {
        let embd = g.tensor("token_embd.weight").unwrap();
        w.add_tensor("output.weight", &embd.dims, ty, pagedlm::quant::quantize(ty, &values(embd)).unwrap()).unwrap();
    }
    w.to_bytes()
}
