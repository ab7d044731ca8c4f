// The chat page: loads the wasm engine, streams the model download, then chats on the page's
// main thread. User and model text always go through textContent, never HTML.
import init, { WebEngine } from "/pkg/pagedlm.js";

const MODEL_URL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const params = new URLSearchParams(location.search);

const $ = (id) => document.getElementById(id);
const ui = {
  progress: $("model-progress"), progressLabel: $("progress-label"), progressDetail: $("progress-detail"),
  progressBar: $("progress-bar"), progressFill: $("progress-fill"),
  errorPanel: $("error-panel"), errorTitle: $("error-title"), errorMessage: $("error-message"), errorHint: $("error-hint"),
  messages: $("messages"), empty: $("empty"), composer: $("composer"), input: $("chat-input"),
  send: $("send-button"), stop: $("stop-button"), newConversation: $("new-conversation"), adapter: $("adapter"),
  kvStats: $("kv-stats"), kvMap: $("kv-map"), kvCaption: $("kv-caption"), kvLayout: $("kv-layout"), kvReserved: $("kv-reserved"),
  kvUsed: $("kv-used"), kvBlocks: $("kv-blocks"), kvHit: $("kv-hit"), weights: $("weights"),
  maxTokens: $("max-tokens"), temperature: $("temperature"), topP: $("top-p"),
};

// Sampling defaults; URL parameters (?max_tokens=12&temperature=0) override them, which tests use.
ui.maxTokens.value = params.get("max_tokens") ?? "256";
ui.temperature.value = params.get("temperature") ?? "0.7";
ui.topP.value = params.get("top_p") ?? "0.9";

const state = {
  engine: null,
  info: null,
  /** The conversation sent to the model each turn: [{role, content}]. */
  history: [],
  /** Tokens the conversation occupies in the KV cache after its last reply. */
  kvTokens: 0,
  busy: false,
  stopRequested: false,
  /** Resolves when the running reply ends. */
  running: null,
};

const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;

function setProgress(label, fraction, detail = "") {
  ui.progressLabel.textContent = label;
  ui.progressDetail.textContent = detail;
  if (fraction == null) {
    ui.progress.classList.add("indeterminate");
    ui.progressBar.removeAttribute("aria-valuenow");
  } else {
    ui.progress.classList.remove("indeterminate");
    const pct = Math.max(0, Math.min(100, fraction * 100));
    ui.progressFill.style.width = `${pct}%`;
    ui.progressBar.setAttribute("aria-valuenow", pct.toFixed(0));
  }
}

function showError(title, message, hint = "") {
  ui.errorTitle.textContent = title;
  ui.errorMessage.textContent = message;
  ui.errorHint.textContent = hint;
  ui.errorPanel.hidden = false;
  // The error panel says it all; a stalled progress bar next to it would only repeat it.
  ui.progress.hidden = true;
  ui.input.placeholder = "The model is not available.";
}

const errorText = (e) => (e && e.message) || String(e);

async function checkWebGpu() {
  const hint = "Use a browser with WebGPU enabled (a recent Chrome, Edge or Safari; in Chromium without a GPU, start it with --enable-unsafe-webgpu).";
  if (!("gpu" in navigator) || !navigator.gpu) {
    throw Object.assign(new Error("This browser does not expose WebGPU (navigator.gpu is missing)."), { title: "WebGPU is not available", hint });
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    throw Object.assign(new Error(`Requesting a WebGPU adapter failed: ${errorText(e)}`), { title: "WebGPU is not available", hint });
  }
  if (!adapter) {
    throw Object.assign(new Error("WebGPU found no adapter on this machine."), { title: "WebGPU is not available", hint });
  }
}

/** Downloads the model with progress; returns its bytes. */
async function download(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new Error(`Downloading ${url} failed: HTTP ${response.status} ${response.statusText}. Run \`npm run fetch-model\` to place the model.`);
  }
  const total = Number(response.headers.get("content-length")) || 0;
  const reader = response.body.getReader();
  let bytes = total ? new Uint8Array(total) : null;
  const chunks = [];
  let received = 0;
  let lastPaint = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (bytes && received + value.length <= total) bytes.set(value, received);
    else chunks.push(value);
    received += value.length;
    const now = performance.now();
    if (now - lastPaint > 50) {
      lastPaint = now;
      setProgress("Downloading the model", total ? received / total : null,
        total ? `${mb(received)} / ${mb(total)} · ${Math.floor((received / total) * 100)}%` : mb(received));
    }
  }
  if (!bytes || chunks.length || received !== total) {
    // No or wrong content-length: assemble what actually arrived.
    const all = new Uint8Array(received);
    let off = 0;
    if (bytes) { all.set(bytes.subarray(0, Math.min(total, received)), 0); off = Math.min(total, received); }
    for (const c of chunks) { all.set(c, off); off += c.length; }
    bytes = all;
  }
  setProgress("Downloading the model", 1, `${mb(received)} / ${mb(received)} · 100%`);
  return bytes;
}

async function boot() {
  try {
    setProgress("Checking WebGPU", null);
    await checkWebGpu();
    setProgress("Loading the runtime", null);
    await init();
    setProgress("Downloading the model", 0);
    const bytes = await download(MODEL_URL);
    setProgress("Uploading weights to the GPU", null, mb(bytes.length));
    const t0 = performance.now();
    const options = {};
    if (params.get("max_context")) options.maxContext = Number(params.get("max_context"));
    state.engine = await WebEngine.load(bytes, options);
    state.info = state.engine.info();
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    setProgress("Model ready", 1, `${mb(bytes.length)} downloaded · on the GPU in ${secs} s`);
    ui.progress.classList.add("done");
    ui.progress.dataset.done = "true";
    // Browsers often hide the adapter's name; say at least what kind of device runs the model.
    const name = state.info.adapter.split(" (")[0].trim();
    ui.adapter.textContent = `${name || "WebGPU"} · ${state.info.is_cpu ? "software GPU" : "GPU"}`;
    ui.adapter.title = `WebGPU adapter: ${state.info.adapter}`;
    buildKvMap();
    ui.input.disabled = false;
    ui.input.placeholder = "Ask something…";
    ui.newConversation.disabled = false;
    updateKv();
    updateButtons();
    ui.input.focus();
  } catch (e) {
    console.error(e);
    showError(e.title || "The model failed to load", errorText(e), e.hint || "");
  }
}

function updateButtons() {
  const ready = !!state.engine;
  ui.send.disabled = !ready || state.busy || ui.input.value.trim() === "";
  ui.stop.disabled = !state.busy;
  ui.composer.classList.toggle("busy", state.busy);
}

const KV_CELLS = 64;

/** The KV map: the one contiguous reservation drawn as cells of max_context / 64 token slots each. */
function buildKvMap() {
  ui.kvMap.replaceChildren();
  for (let i = 0; i < KV_CELLS; i++) {
    const cell = document.createElement("span");
    cell.className = "kv-cell";
    ui.kvMap.append(cell);
  }
  ui.kvCaption.textContent = `1 block · ${state.info.max_context} slots · a cell = ${state.info.max_context / KV_CELLS}`;
}

/** kv-stats for the contiguous cache: one reservation, held while a conversation has tokens in it
 * or a reply runs; every turn prefills the whole history again, so the prefix hit is always 0. */
function updateKv() {
  const info = state.info;
  if (!info) return;
  const used = state.kvTokens > 0 || state.busy ? 1 : 0;
  Object.assign(ui.kvStats.dataset, { blocksTotal: "1", blocksUsed: String(used), blocksCached: "0", lastPrefixHit: "0" });
  ui.kvLayout.textContent = info.kv_layout;
  ui.kvReserved.textContent = `${info.max_context} tokens · ${mb(info.memory.kv_bytes)}`;
  ui.kvUsed.textContent = state.busy ? "generating…" : `${state.kvTokens} tokens`;
  ui.kvBlocks.textContent = `${used} / 1`;
  ui.kvHit.textContent = "0 tokens";
  ui.weights.textContent = mb(info.memory.weights_bytes);
  const filled = Math.ceil((Math.min(state.kvTokens, info.max_context) / info.max_context) * KV_CELLS);
  ui.kvMap.querySelectorAll(".kv-cell").forEach((c, i) => c.classList.toggle("used", i < filled));
}

function scrollToEnd(force = false) {
  const el = ui.messages;
  const nearBottom = el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  if (force || nearBottom) el.scrollTop = el.scrollHeight;
}

function addMessage(role, text) {
  ui.empty.hidden = true;
  const wrap = document.createElement("article");
  wrap.className = `message ${role}`;
  wrap.dataset.testid = role === "user" ? "message-user" : "message-assistant";
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  wrap.append(body);
  ui.messages.append(wrap);
  scrollToEnd(true);
  return wrap;
}

function chatOptions() {
  const num = (el, fallback) => (Number.isFinite(parseFloat(el.value)) ? parseFloat(el.value) : fallback);
  return {
    max_tokens: Math.max(1, Math.round(num(ui.maxTokens, 256))),
    temperature: Math.max(0, num(ui.temperature, 0.7)),
    top_p: Math.min(1, Math.max(0.05, num(ui.topP, 0.9))),
    repetition_penalty: 1.1,
    seed: Math.floor(Math.random() * 2 ** 31),
  };
}

async function send() {
  const text = ui.input.value.trim();
  if (!text || state.busy || !state.engine) return;
  ui.input.value = "";
  autosize();
  addMessage("user", text);
  state.history.push({ role: "user", content: text });
  const bubble = addMessage("assistant", "");
  const body = bubble.querySelector(".body");
  bubble.classList.add("streaming");
  state.busy = true;
  state.stopRequested = false;
  updateButtons();
  updateKv();

  let finish;
  state.running = new Promise((r) => (finish = r));
  const t0 = performance.now();
  let streamed = "";
  try {
    const result = await state.engine.chat(state.history, chatOptions(), (piece) => {
      if (state.stopRequested) return false;
      streamed += piece;
      body.textContent = streamed;
      scrollToEnd();
      return true;
    });
    body.textContent = result.text;
    if (result.text) state.history.push({ role: "assistant", content: result.text });
    state.kvTokens = result.prompt_tokens.length + result.tokens.length;
    Object.assign(bubble.dataset, {
      promptTokens: String(result.prompt_tokens.length),
      tokens: String(result.tokens.length),
      finishReason: result.finish_reason,
    });
    bubble.append(stats(result, performance.now() - t0));
    if (result.finish_reason === "abort") bubble.classList.add("stopped");
  } catch (e) {
    console.error(e);
    // The turn failed: drop it from the history so the next turn starts from a consistent state.
    state.history.pop();
    bubble.classList.add("failed");
    body.textContent = streamed;
    const err = document.createElement("div");
    err.className = "message-error";
    err.textContent = errorText(e);
    bubble.append(err);
  } finally {
    bubble.classList.remove("streaming");
    bubble.dataset.done = "true";
    state.busy = false;
    updateButtons();
    updateKv();
    scrollToEnd();
    finish();
    if (!ui.input.disabled) ui.input.focus();
  }
}

function stats(result, wallMs) {
  const n = result.tokens.length;
  // The first token comes out of prefill; decode_ms covers the n - 1 after it.
  const tokS = result.decode_ms > 0 && n > 1 ? `${((n - 1) / (result.decode_ms / 1000)).toFixed(1)} tok/s` : null;
  const why = { stop: "finished", length: "token limit", abort: "stopped" }[result.finish_reason] || result.finish_reason;
  const el = document.createElement("div");
  el.className = "stats";
  const plural = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;
  const parts = [
    plural(result.prompt_tokens.length, "prompt token"),
    `prefill ${result.prefill_ms.toFixed(0)} ms`,
    plural(n, "token"),
    tokS,
    why,
  ];
  for (const p of parts.filter(Boolean)) {
    const span = document.createElement("span");
    span.textContent = p;
    el.append(span);
  }
  el.title = `total ${(wallMs / 1000).toFixed(2)} s; decode ${result.decode_ms.toFixed(0)} ms`;
  return el;
}

async function newConversation() {
  if (state.busy) {
    state.stopRequested = true;
    await state.running;
  }
  state.history = [];
  state.kvTokens = 0;
  for (const el of [...ui.messages.querySelectorAll(".message")]) el.remove();
  ui.empty.hidden = false;
  updateKv();
  updateButtons();
  ui.input.focus();
}

function autosize() {
  ui.input.style.height = "auto";
  ui.input.style.height = `${Math.min(ui.input.scrollHeight, 200)}px`;
}

ui.composer.addEventListener("submit", (e) => { e.preventDefault(); send(); });
ui.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
});
ui.input.addEventListener("input", () => { autosize(); updateButtons(); });
ui.stop.addEventListener("click", () => { state.stopRequested = true; ui.stop.disabled = true; });
ui.newConversation.addEventListener("click", newConversation);

boot();
