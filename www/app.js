// The chat page on the pagedlm package: the engine runs in its Web Worker, this page only draws.
// Several conversations, streamed replies with a stop button, and a live map of the KV pool.
// A model picker switches models; a base model (no chat template) runs in text-completion mode:
// the same text box, the completion streamed after the prompt.
// User and model text always go through textContent, never HTML.
import { createEngine, estimateMemory, listCachedModels } from "/js/index.js";
import { loadConversations, saveConversation } from "./store.js";

/** The models the picker offers (the first is the default), with the command that fetches each. */
const MODELS = [
  { id: "smollm2-135m", label: "SmolLM2-135M-Instruct", url: "/models/SmolLM2-135M-Instruct.Q4_1.gguf", fetch: "npm run fetch-model" },
  { id: "gemma3-270m", label: "Gemma 3 270M (base)", url: "/models/gemma-3-270m-q4_k_m.gguf", fetch: "npm run fetch-model -- gemma3-270m" },
];
const params = new URLSearchParams(location.search);

const $ = (id) => document.getElementById(id);
const ui = {
  progress: $("model-progress"), progressLabel: $("progress-label"), progressDetail: $("progress-detail"),
  progressBar: $("progress-bar"), progressFill: $("progress-fill"), estimate: $("model-estimate"),
  errorPanel: $("error-panel"), errorTitle: $("error-title"), errorMessage: $("error-message"), errorHint: $("error-hint"),
  messages: $("messages"), empty: $("empty"), composer: $("composer"), input: $("chat-input"),
  send: $("send-button"), stop: $("stop-button"), newConversation: $("new-conversation"), adapter: $("adapter"),
  picker: $("model-picker"),
  modelName: $("model-name"), modelFile: $("model-file"), dropOverlay: $("drop-overlay"),
  conversations: $("conversations"), storeNotice: $("store-notice"), systemPrompt: $("system-prompt"),
  maxTokens: $("max-tokens"), temperature: $("temperature"), topP: $("top-p"), kvDtype: $("kv-dtype"),
  jsonOutput: $("json-output"), jsonSchema: $("json-schema"), tools: $("tools"), toolChoice: $("tool-choice"),
  kvStats: $("kv-stats"), kvMap: $("kv-map"), kvSummary: $("kv-summary"), kvBlocks: $("kv-blocks"), kvLive: $("kv-live"),
  kvRate: $("kv-rate"), kvEvictions: $("kv-evictions"), resetCache: $("reset-cache"),
  turnHit: $("turn-hit"), turnTtft: $("turn-ttft"), turnSpeed: $("turn-speed"), turnDrafts: $("turn-drafts"),
  gaugeF32: $("gauge-f32"), gaugeInt8: $("gauge-int8"), gaugeF32Value: $("gauge-f32-value"), gaugeInt8Value: $("gauge-int8-value"),
  gaugeNote: $("gauge-note"),
};

// Sampling defaults; URL parameters (?max_tokens=12&temperature=0) override them, which tests use.
ui.maxTokens.value = params.get("max_tokens") ?? "256";
ui.temperature.value = params.get("temperature") ?? "0.7";
ui.topP.value = params.get("top_p") ?? "0.9";
ui.kvDtype.value = params.get("kv_dtype") === "int8" ? "int8" : "f32";
if (params.has("system")) ui.systemPrompt.value = params.get("system");
ui.jsonSchema.disabled = !ui.jsonOutput.checked;
ui.jsonOutput.addEventListener("change", () => { ui.jsonSchema.disabled = !ui.jsonOutput.checked; });

/** Conversation colors, in order of creation; the map draws each conversation's blocks in its own. */
const PALETTE = ["#6366f1", "#0ea5a4", "#f97316", "#db2777", "#0284c7", "#65a30d", "#9333ea", "#dc2626"];

const state = {
  engine: null,
  info: null,
  /** "chat", or "completion" for a model without a chat template. */
  mode: "chat",
  /** The last pool snapshot (EngineStats). */
  stats: null,
  conversations: [],
  active: null,
  nextId: 1,
  /** physical block -> Set of conversation ids whose last block table holds it. */
  claims: new Map(),
  lastTurn: null,
  refreshTimer: 0,
  /** The loaded model's label (the picker's, or the file's name). */
  label: "",
  /** GPU device losses this page has recovered from (shown as the progress panel's data-device-losses). */
  deviceLosses: 0,
};

const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;
const plural = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;
const errorText = (e) => (e && e.message) || String(e);

/** Marks a reply bubble failed and shows the error (and its code) under it. */
function markFailed(bubble, e) {
  bubble.classList.add("failed");
  const err = document.createElement("div");
  err.className = "message-error";
  err.textContent = `${errorText(e)}${e.code ? ` (${e.code})` : ""}`;
  bubble.append(err);
}

// ---- Loading -------------------------------------------------------------------------------------

function setProgress(label, fraction, detail = "") {
  ui.progress.hidden = false;
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

const ERROR_TITLES = {
  WEBGPU_UNAVAILABLE: ["WebGPU is not available", "Use a browser with WebGPU enabled: a recent Chrome, Edge or Safari. In Chromium without a GPU, start it with --enable-unsafe-webgpu."],
  MODEL_FORMAT: ["This file is not a model pagedlm can run", "pagedlm runs GGUF files of the llama (SmolLM2, Llama 3.x), qwen2, qwen3, phi3, gemma2, gemma3 and smollm3 architectures."],
  MODEL_DOWNLOAD: ["The model could not be downloaded", "Run `npm run fetch-model` to place the model next to the page, then reload."],
  MODEL_MISSING: ["This model is not on the server", ""],
  UNSUPPORTED: ["Not available yet", "Choose f32 as the KV precision in the settings."],
};

function showError(e) {
  const [title, fallbackHint] = ERROR_TITLES[e?.code] ?? ["The model failed to load", ""];
  const hint = e?.hint ?? fallbackHint;
  ui.errorTitle.textContent = title;
  ui.errorMessage.textContent = errorText(e);
  ui.errorHint.textContent = hint;
  ui.errorPanel.dataset.code = e?.code ?? "";
  ui.errorPanel.hidden = false;
  // The error panel says it all; a stalled progress bar next to it would only repeat it.
  ui.progress.hidden = true;
  ui.input.placeholder = "The model is not available.";
}

function onProgress(p) {
  const total = p.total ? ` / ${mb(p.total)}` : "";
  const pct = p.fraction != null ? ` · ${Math.floor(p.fraction * 100)}%` : "";
  const part = p.parts > 1 ? ` (part ${p.part} of ${p.parts})` : "";
  const resumed = p.resumed_from ? ` · resumed at ${mb(p.resumed_from)}` : "";
  switch (p.phase) {
    case "download": return setProgress(p.note ? `Downloading the model${part}: ${p.note}` : `Downloading the model${part}`, p.fraction, `${mb(p.loaded)}${total}${pct}${resumed}`);
    case "stored": return setProgress(`Stored in the browser for next time${part}`, 1, mb(p.loaded));
    case "cache": return setProgress("Found the model in the browser's storage", 1, mb(p.total));
    case "load": return setProgress("Starting the engine", null, mb(p.total));
    case "upload": return setProgress(params.get("backend") === "cpu" ? "Reading the weights" : "Reading the weights and uploading them to the GPU", p.fraction, `${mb(p.loaded)}${total}${pct}`);
    case "tokenizer": return setProgress("Building the tokenizer", null);
    case "pipelines": return setProgress("Compiling the GPU kernels", null);
    default: return undefined;
  }
}

const gb = (bytes) => `${(bytes / 1e9).toFixed(bytes < 1e8 ? 3 : 1)} GB`;

/**
 * Shows what loading `model` would take against what this device offers (`estimateMemory`,
 * from the file's header) under the progress bar; resolves to the estimate, or null when none
 * could be made (the load then goes ahead and says for itself what is wrong).
 */
async function showEstimate(model) {
  ui.estimate.hidden = true;
  delete ui.estimate.dataset.fits;
  const options = engineOptions();
  delete options.onProgress;
  let e;
  try {
    e = await estimateMemory(model, options);
  } catch (err) {
    console.warn("pagedlm: no memory estimate:", err);
    return null;
  }
  // "auto" takes whichever backend fits, WebGPU first.
  const backend = e.backend === "cpu" || (e.backend === "auto" && !e.fits_backend?.webgpu && e.fits_backend?.cpu) ? "cpu" : "webgpu";
  const kv = e.kv_bytes?.[ui.kvDtype.value] ?? 0;
  const offers = [];
  if (e.limits?.memoryBytes) offers.push(`${gb(e.limits.memoryBytes)} of memory`);
  if (backend === "webgpu" && e.limits?.maxBufferSize) offers.push(`GPU buffers up to ${gb(e.limits.maxBufferSize)}`);
  if (backend === "cpu") offers.push("up to 4 GB of wasm memory");
  const needs = `needs ${gb(e.total_bytes[backend])} (weights ${gb(e.weights_bytes[backend])} + KV ${gb(kv)}) on the ${backend === "cpu" ? "CPU" : "GPU"} backend`;
  ui.estimate.textContent = e.fits
    ? `This model ${needs}; this device offers ${offers.join(", ") || "what it needs"}.`
    : `This model does not fit: it ${needs}; this device offers ${offers.join(", ") || "less"}. ${e.reasons.join(" ")}`;
  ui.estimate.dataset.fits = String(!!e.fits);
  ui.estimate.hidden = false;
  ui.progress.hidden = false;
  return e;
}

function engineOptions() {
  const options = { onProgress, kvDtype: ui.kvDtype.value };
  for (const [param, key] of [["max_context", "maxContext"], ["pool_tokens", "poolTokens"], ["block_size", "blockSize"]]) {
    if (params.get(param)) options[key] = Number(params.get(param));
  }
  if (params.get("prefix_cache") === "0") options.prefixCache = false;
  // ?max_memory_bytes=N: the memory budget the estimate (and the engine) holds the model to.
  if (params.get("max_memory_bytes")) options.maxMemoryBytes = Number(params.get("max_memory_bytes"));
  // ?backend=cpu|auto|webgpu: which backend runs the model (the package's default, auto, otherwise).
  if (["cpu", "auto", "webgpu"].includes(params.get("backend"))) options.backend = params.get("backend");
  // ?speculative=auto|off: speculative decoding (the package's default, auto, otherwise).
  if (["auto", "off"].includes(params.get("speculative"))) options.speculative = params.get("speculative");
  return options;
}

/** The file's weight types, most tensors first: "Q4_1 ×210, F32 ×61, Q8_0 ×1". */
function weightTypesText(types) {
  return Object.entries(types ?? {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .map(([type, count]) => `${type} ×${count}`).join(", ");
}

/** The page while a model loads (or loads again): the progress panel, no input, no pool map. */
function startLoading(label) {
  ui.progress.classList.remove("done");
  delete ui.progress.dataset.done;
  setProgress(label, null);
  ui.input.disabled = true;
  ui.newConversation.disabled = true;
  ui.resetCache.disabled = true;
  clearKv();
  updateButtons();
}

async function loadModel(model, label) {
  ui.errorPanel.hidden = true;
  startLoading("Reading the model's header");
  const t0 = performance.now();
  const estimate = await showEstimate(model);
  if (estimate && !estimate.fits) {
    // Nothing is downloaded or loaded: the estimate under the bar says why.
    ui.progress.hidden = false;
    setProgress("Not loaded: this model does not fit on this device", 0);
    return;
  }
  setProgress("Starting the engine", null);
  try {
    const engine = await createEngine(model, engineOptions());
    state.engine = engine;
    state.label = label;
    engine.addEventListener("devicelost", () => recover(engine));
    await engineReady(engine, t0);
  } catch (e) {
    console.error(e);
    showError(e);
  }
}

/** Shows a loaded (or restarted) engine: its figures, the model's line, the KV map; enables input. */
async function engineReady(engine, t0, recovered = false) {
  state.info = engine.info;
  state.stats = await engine.stats();
  const secs = ((performance.now() - t0) / 1000).toFixed(1);
  const from = { network: "downloaded", cache: "from the browser's storage", file: "from the file", buffer: "from memory" }[engine.load.source];
  const again = recovered ? " · the GPU device was lost and the model loaded again" : "";
  setProgress("Model ready", 1, `${mb(engine.load.bytes)} ${from} · ready in ${secs} s${again}`);
  ui.progress.classList.add("done");
  ui.progress.dataset.done = "true";
  ui.progress.dataset.source = engine.load.source;
  const m = state.info.model;
  const slidingWindow = m.sliding_window ? ` · window ${m.sliding_window}` : "";
  // The file's own name (general.name) is text from anywhere: textContent only, never HTML.
  const named = m.name && m.name !== state.label ? `${m.name} (${state.label})` : state.label;
  ui.modelName.textContent = `${named} · ${weightTypesText(m.weight_types)} · KV ${state.info.kv_dtype} · blocks of ${state.info.block_size} · ${m.architecture}${slidingWindow}`;
  ui.modelName.title = "The model's name in its file (and where it came from), the tensors of each weight type in the file, the KV cache's format, then the architecture and its sliding window";
  setMode(m.chat_template ? "chat" : "completion");
  // Which backend runs the model; browsers often hide the adapter's name, so say at least what
  // kind of device runs it.
  const name = state.info.adapter.split(" (")[0].trim();
  if (state.info.backend === "cpu") {
    ui.adapter.textContent = `CPU backend (wasm${state.info.variant.includes("simd128") ? " SIMD" : ""})`;
    ui.adapter.title = `The model runs on CPU kernels in WebAssembly: ${state.info.backend_reason}`;
  } else {
    ui.adapter.textContent = `${name || "WebGPU"} · ${state.info.is_cpu ? "software GPU" : "GPU"}`;
    ui.adapter.title = `WebGPU adapter: ${state.info.adapter} (${state.info.backend_reason})`;
  }
  ui.adapter.dataset.backend = state.info.backend;
  ui.input.disabled = false;
  ui.newConversation.disabled = false;
  ui.resetCache.disabled = false;
  state.claims.clear();
  // Saved snapshots go into this engine's prefix cache when their conversation continues.
  for (const c of state.conversations) c.needsImport = !!c.snapshot;
  buildKvMap();
  renderKv();
  updateButtons();
  ui.input.focus();
}

/**
 * The engine's GPU device was lost (a driver reset, memory reclaimed): its replies ended with
 * DEVICE_LOST (each turn failed, so the saved conversations are as they were before it). Loads
 * the model again on a new device from the same bytes; the conversations continue, their saved
 * snapshots imported again at their next turn.
 */
async function recover(engine) {
  if (state.engine !== engine) return;
  state.deviceLosses += 1;
  ui.progress.dataset.deviceLosses = String(state.deviceLosses);
  startLoading("The GPU device was lost: loading the model again");
  const t0 = performance.now();
  try {
    // Replies still streaming end with DEVICE_LOST first; restart() waits for them.
    await engine.restart({ onProgress });
    if (state.engine === engine) await engineReady(engine, t0, true);
  } catch (e) {
    if (state.engine !== engine) return;
    console.error(e);
    showError(e);
  }
}

/** Stops every reply and frees the engine, before another model loads. */
async function disposeEngine() {
  if (!state.engine) return;
  const old = state.engine;
  state.engine = null;
  for (const c of state.conversations) c.controller?.abort();
  await old.dispose();
}

async function openFile(file) {
  if (!file) return;
  await disposeEngine();
  pickerShows("file", file.name);
  await loadModel(file, file.name.replace(/\.gguf$/i, ""));
}

/** Whether `url` is on the server or whole in the browser's storage (a 404 means not fetched). */
async function modelPresent(url) {
  try {
    const href = new URL(url, location.href).href;
    if ((await listCachedModels()).some((m) => m.url === href && m.complete)) return true;
  } catch { /* no storage here: ask the server */ }
  try {
    return (await fetch(url, { method: "HEAD" })).status !== 404;
  } catch {
    // The download itself will say what is wrong.
    return true;
  }
}

/** Loads a model of the picker (`MODELS`), or says how to fetch it when the server lacks it. */
async function chooseModel(entry) {
  await disposeEngine();
  pickerShows(entry.id);
  if (!(await modelPresent(entry.url))) {
    clearKv();
    ui.input.disabled = true;
    updateButtons();
    showError(Object.assign(new Error(`${entry.label} is not on this server: ${entry.url.replace(/^\//, "")} was not found.`),
      { code: "MODEL_MISSING", hint: `Run \`${entry.fetch}\` in the pagedlm folder, then choose it again.` }));
    return;
  }
  await loadModel(entry.url, entry.label);
}

/** Selects picker option `id`, adding it first for a model from elsewhere (a file, ?model=URL). */
function pickerShows(id, label = id) {
  if (![...ui.picker.options].some((o) => o.value === id)) ui.picker.append(new Option(label, id));
  ui.picker.value = id;
}

/** Chat, or text completion for a model without a chat template; the page follows. */
function setMode(mode) {
  state.mode = mode;
  ui.picker.dataset.mode = mode;
  document.body.dataset.mode = mode;
  const completion = mode === "completion";
  ui.input.placeholder = completion ? "Write the start of a text; the model continues it…" : "Ask something…";
  ui.input.setAttribute("aria-label", completion ? "Prompt" : "Message");
  ui.send.title = completion ? "Complete the text (Enter)" : "Send (Enter)";
  ui.send.firstChild.textContent = completion ? "Complete" : "Send";
  ui.systemPrompt.disabled = completion || !!state.active?.started;
}

// ---- Conversations -------------------------------------------------------------------------------

function newConversation(saved = null) {
  const id = saved ? saved.id : state.nextId++;
  const conv = {
    id,
    color: PALETTE[(id - 1) % PALETTE.length],
    title: "New conversation",
    system: null,
    started: false,
    history: [],
    view: document.createElement("div"),
    item: document.createElement("li"),
    busy: false,
    controller: null,
    stream: null,
    blocks: [],
    turns: 0,
    /** The KV snapshot of `history` (engine.exportConversation), saved with it; null if none. */
    snapshot: null,
    /** Whether `snapshot` still has to go into the current engine's prefix cache. */
    needsImport: false,
  };
  if (saved) {
    Object.assign(conv, { title: saved.title, system: saved.system ?? null, started: true, history: saved.history,
      turns: saved.turns ?? 0, snapshot: saved.snapshot ?? null, needsImport: !!saved.snapshot });
    conv.item.dataset.restored = "true";
  }
  conv.view.className = "thread";
  // The conversation's color marks its messages, its sidebar entry and its blocks in the map.
  conv.view.style.setProperty("--user", conv.color);
  conv.item.className = "conversation";
  conv.item.dataset.testid = "conversation";
  conv.item.dataset.conversation = String(id);
  conv.item.style.setProperty("--c", conv.color);
  conv.item.tabIndex = 0;
  conv.item.innerHTML = `<i class="dot"></i><span class="conv-text"><span class="conv-title"></span><span class="conv-meta"></span></span>`;
  conv.item.addEventListener("click", () => activate(conv));
  conv.item.addEventListener("keydown", (e) => { if (e.key === "Enter") activate(conv); });
  state.conversations.push(conv);
  ui.conversations.prepend(conv.item);
  if (saved) {
    for (const m of conv.history) {
      if (m.role === "tool") {
        addMessage(conv, "user", m.content).classList.add("tool-result");
      } else if (m.role === "user" || m.role === "assistant") {
        const bubble = addMessage(conv, m.role, m.content ?? "");
        if (m.tool_calls) showToolCalls(bubble.querySelector(".body"), m.tool_calls);
        bubble.dataset.done = "true";
      }
    }
  }
  renderConversationItem(conv);
  if (!saved) activate(conv);
  return conv;
}

/** What the engine sees of `conv`: its system prompt, then its turns. */
function messagesOf(conv) {
  return conv.system ? [{ role: "system", content: conv.system }, ...conv.history] : [...conv.history];
}

/**
 * Saves `conv` with a snapshot of its history's K/V, so that after a reload its next turn reuses
 * them instead of recomputing the whole history. Without a snapshot the history is still saved.
 */
async function persist(conv, engine) {
  conv.needsImport = false;
  if (conv.history.length > 0) {
    try {
      conv.snapshot = await engine.exportConversation(messagesOf(conv));
    } catch (e) {
      // The snapshot saved before this turn (if any) still holds the history up to it: a prefix
      // of the new one, so it is kept.
      if (e.code !== "DISPOSED" && e.code !== "DEVICE_LOST") console.warn("pagedlm: no new KV snapshot for this conversation:", e);
    }
  }
  await saveConversation({ id: conv.id, title: conv.title, system: conv.system, history: conv.history, turns: conv.turns, snapshot: conv.snapshot });
}

/** Puts a restored conversation's snapshot into the engine's prefix cache before its next turn. */
async function importSnapshot(conv, engine) {
  if (!conv.needsImport || !conv.snapshot) return;
  conv.needsImport = false;
  try {
    await engine.importConversation(conv.snapshot);
  } catch (e) {
    // Another model or KV format (f32 vs int8), or damaged bytes: the turn recomputes the history.
    if (e.code === "SNAPSHOT_MISMATCH" || e.code === "SNAPSHOT_CORRUPT") {
      conv.snapshot = null;
      await saveConversation({ id: conv.id, title: conv.title, system: conv.system, history: conv.history, turns: conv.turns, snapshot: null });
    } else if (e.code !== "KV_POOL_FULL" && e.code !== "DISPOSED" && e.code !== "DEVICE_LOST") {
      console.warn("pagedlm: the saved KV snapshot was not loaded:", e);
    }
  }
}

/** Brings back the conversations saved before the last reload; a new, empty one stays active. */
async function restoreConversations() {
  const { records, dropped } = await loadConversations();
  for (const record of records) {
    newConversation(record);
    state.nextId = Math.max(state.nextId, record.id + 1);
  }
  if (dropped > 0) {
    ui.storeNotice.textContent = `${plural(dropped, "saved conversation")} ${dropped === 1 ? "was" : "were"} damaged and removed; the others are back.`;
    ui.storeNotice.dataset.dropped = String(dropped);
    ui.storeNotice.hidden = false;
  }
  // The blank conversation is the newest: on top of the list.
  ui.conversations.prepend(state.active.item);
}

function activate(conv) {
  state.active = conv;
  for (const c of state.conversations) c.item.classList.toggle("active", c === conv);
  // Only the active thread is in the document, so message locators see one conversation.
  for (const el of [...ui.messages.querySelectorAll(".thread")]) el.remove();
  ui.messages.append(conv.view);
  ui.empty.hidden = conv.history.length > 0 || conv.busy;
  ui.systemPrompt.disabled = conv.started || state.mode === "completion";
  ui.systemPrompt.value = conv.started ? (conv.system ?? "") : ui.systemPrompt.dataset.draft ?? ui.systemPrompt.value;
  updateButtons();
  scrollToEnd(true);
  renderKv();
  if (!ui.input.disabled) ui.input.focus();
}

function renderConversationItem(conv) {
  conv.item.querySelector(".conv-title").textContent = conv.title;
  let meta;
  if (conv.busy) meta = waiting(conv) ? "waiting for its turn…" : "generating…";
  else if (conv.turns === 0) meta = "empty";
  else meta = `${plural(conv.turns, "turn")} · ${plural(blocksOf(conv).length, "block")}`;
  conv.item.querySelector(".conv-meta").textContent = meta;
  conv.item.classList.toggle("busy", conv.busy);
}

/** Whether `conv`'s request waits while another conversation's runs (the scheduler is full). */
function waiting(conv) {
  if (conv.stream?.progress().state !== "queued") return false;
  return state.conversations.some((c) => c !== conv && c.stream?.progress().state === "running");
}

/** The blocks the map attributes to `conv` now. */
function blocksOf(conv) {
  const out = [];
  for (const [block, owners] of state.claims) if (owners.has(conv.id)) out.push(block);
  return out;
}

function scrollToEnd(force = false) {
  const el = ui.messages;
  const nearBottom = el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  if (force || nearBottom) el.scrollTop = el.scrollHeight;
}

function addMessage(conv, role, text) {
  if (conv === state.active) ui.empty.hidden = true;
  const wrap = document.createElement("article");
  wrap.className = `message ${role}`;
  wrap.dataset.testid = role === "user" ? "message-user" : "message-assistant";
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  wrap.append(body);
  conv.view.append(wrap);
  if (conv === state.active) scrollToEnd(true);
  return wrap;
}

/** Tool calls shown as such: one block per call, its function's name and its arguments. */
function showToolCalls(body, calls) {
  body.textContent = "";
  for (const call of calls) {
    const el = document.createElement("div");
    el.className = "tool-call";
    el.dataset.testid = "tool-call";
    el.dataset.name = call.function.name;
    const name = document.createElement("span");
    name.className = "tool-name";
    name.textContent = call.function.name;
    let args = call.function.arguments;
    try {
      args = JSON.stringify(JSON.parse(args));
    } catch { /* shown as written */ }
    el.append("call ", name, `(${args})`);
    body.append(el);
  }
}

/** A settings box that must hold JSON: its value, or an INVALID_ARGUMENT error naming it. */
function jsonSetting(el, what) {
  try {
    return JSON.parse(el.value);
  } catch (e) {
    throw Object.assign(new Error(`${what} is not valid JSON: ${e.message}`), { code: "INVALID_ARGUMENT" });
  }
}

/** The JSON output and tools settings, as request options (`chat`: tools too). */
function structuredOptions(chat) {
  const options = {};
  if (ui.jsonOutput.checked) {
    options.response_format = ui.jsonSchema.value.trim()
      ? { type: "json_schema", json_schema: { name: "page", schema: jsonSetting(ui.jsonSchema, "The JSON Schema"), strict: true } }
      : { type: "json_object" };
  }
  if (chat && ui.tools.value.trim()) {
    options.tools = jsonSetting(ui.tools, "The tools");
    options.tool_choice = ui.toolChoice.value;
  }
  return options;
}

function requestOptions(chat = true) {
  const num = (el, fallback) => (Number.isFinite(parseFloat(el.value)) ? parseFloat(el.value) : fallback);
  return {
    max_tokens: Math.max(1, Math.round(num(ui.maxTokens, 256))),
    temperature: Math.max(0, num(ui.temperature, 0.7)),
    top_p: Math.min(1, Math.max(0.05, num(ui.topP, 0.9))),
    repetition_penalty: 1.1,
    seed: Math.floor(Math.random() * 2 ** 31),
    ...structuredOptions(chat),
  };
}

async function send() {
  if (state.mode === "completion") return complete();
  const conv = state.active;
  const text = ui.input.value.trim();
  if (!text || !conv || conv.busy || !state.engine || state.engine.lost) return;
  ui.input.value = "";
  autosize();
  if (!conv.started) {
    conv.started = true;
    conv.system = ui.systemPrompt.value.trim() || null;
    conv.title = text.length > 48 ? `${text.slice(0, 47)}…` : text;
    ui.systemPrompt.disabled = true;
  }
  // After a reply of tool calls (the history's last message), the message is the tools' result
  // (one per call).
  const userBubble = addMessage(conv, "user", text);
  const calls = conv.history.at(-1)?.tool_calls ?? null;
  if (calls) userBubble.classList.add("tool-result");
  const turn = calls ? calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: text })) : [{ role: "user", content: text }];
  conv.history.push(...turn);
  const bubble = addMessage(conv, "assistant", "");
  const body = bubble.querySelector(".body");
  bubble.classList.add("streaming");
  conv.bubble = bubble;
  conv.busy = true;
  conv.controller = new AbortController();
  updateButtons();
  renderConversationItem(conv);
  startRefresh();

  const engine = state.engine;
  const messages = messagesOf(conv);
  const t0 = performance.now();
  let streamed = "";
  let details = null;
  let outcome = "done";
  try {
    await importSnapshot(conv, engine);
    conv.stream = await engine.chat.completions.create({ messages, stream: true, signal: conv.controller.signal, ...requestOptions() });
    for await (const chunk of conv.stream) {
      const piece = chunk.choices[0]?.delta?.content;
      if (piece) {
        streamed += piece;
        body.textContent = streamed;
        if (conv === state.active) scrollToEnd();
      }
      requestRefresh();
      if (chunk.pagedlm) details = chunk.pagedlm;
    }
    const completion = await conv.stream.finalCompletion();
    details = completion.pagedlm;
    const reply = completion.choices[0].message;
    if (reply.tool_calls) {
      showToolCalls(body, reply.tool_calls);
      conv.history.push({ role: "assistant", content: null, tool_calls: reply.tool_calls });
    } else {
      body.textContent = reply.content;
      conv.history.push({ role: "assistant", content: reply.content });
    }
    finishTurn(conv, bubble, completion.usage, details, performance.now() - t0);
  } catch (e) {
    if (e.code === "ABORTED" || e.code === "DISPOSED") {
      outcome = "stopped";
      bubble.classList.add("stopped");
      // The partial reply stays in the conversation: the next turn continues after it.
      const partial = e.partial;
      if (partial) {
        body.textContent = partial.content;
        if (partial.content) conv.history.push({ role: "assistant", content: partial.content });
        finishTurn(conv, bubble, partial.usage, partial.pagedlm, performance.now() - t0);
      } else {
        bubble.dataset.finishReason = "abort";
        bubble.dataset.tokens = "0";
      }
    } else {
      outcome = "failed";
      // A setting or input the engine refuses is the user's to mend (shown under the reply),
      // not a fault of the page.
      // A lost device is recovered from by itself (recover): nothing for the console either.
      if (e.code !== "INVALID_ARGUMENT" && e.code !== "DEVICE_LOST") console.error(e);
      // The turn failed: drop it so the next turn starts from a consistent history.
      conv.history.splice(conv.history.length - turn.length);
      body.textContent = streamed;
      markFailed(bubble, e);
    }
  } finally {
    bubble.classList.remove("streaming", "queued");
    bubble.dataset.outcome = outcome;
    conv.busy = false;
    conv.stream = null;
    conv.controller = null;
    if (outcome !== "failed") await persist(conv, engine);
    // The pool as the engine left it, drawn before the turn counts as done.
    await refreshStats();
    bubble.dataset.done = "true";
    renderConversationItem(conv);
    updateButtons();
    if (conv === state.active) scrollToEnd();
    if (!ui.input.disabled && conv === state.active) ui.input.focus();
  }
}

/**
 * Completion mode: the prompt as written (not trimmed: a trailing space or newline matters to a
 * base model), then its continuation streamed after it in one `message-assistant` block. Each
 * completion stands alone: no history, no snapshot.
 */
async function complete() {
  const conv = state.active;
  const prompt = ui.input.value;
  if (!prompt.trim() || !conv || conv.busy || !state.engine || state.engine.lost) return;
  ui.input.value = "";
  autosize();
  if (!conv.started) {
    conv.started = true;
    conv.title = prompt.length > 48 ? `${prompt.slice(0, 47)}…` : prompt;
  }
  const bubble = addMessage(conv, "assistant", "");
  const body = bubble.querySelector(".body");
  const promptEl = document.createElement("span");
  promptEl.className = "prompt";
  promptEl.textContent = prompt;
  const out = document.createElement("span");
  out.className = "completion";
  body.append(promptEl, out);
  bubble.classList.add("streaming", "completion");
  conv.bubble = bubble;
  conv.busy = true;
  conv.controller = new AbortController();
  updateButtons();
  renderConversationItem(conv);
  startRefresh();
  const t0 = performance.now();
  let outcome = "done";
  try {
    conv.stream = await state.engine.completions.create({ prompt, stream: true, signal: conv.controller.signal, ...requestOptions(false) });
    for await (const chunk of conv.stream) {
      const piece = chunk.choices[0]?.text;
      if (piece) {
        out.textContent += piece;
        if (conv === state.active) scrollToEnd();
      }
      requestRefresh();
    }
    const completion = await conv.stream.finalCompletion();
    out.textContent = completion.choices[0].text;
    finishTurn(conv, bubble, completion.usage, completion.pagedlm, performance.now() - t0);
  } catch (e) {
    if (e.code === "ABORTED" || e.code === "DISPOSED") {
      outcome = "stopped";
      bubble.classList.add("stopped");
      if (e.partial) {
        out.textContent = e.partial.content;
        finishTurn(conv, bubble, e.partial.usage, e.partial.pagedlm, performance.now() - t0);
      } else {
        Object.assign(bubble.dataset, { finishReason: "abort", tokens: "0" });
      }
    } else {
      outcome = "failed";
      if (e.code !== "DEVICE_LOST") console.error(e);
      markFailed(bubble, e);
    }
  } finally {
    bubble.classList.remove("streaming", "queued");
    bubble.dataset.outcome = outcome;
    conv.busy = false;
    conv.stream = null;
    conv.controller = null;
    await refreshStats();
    bubble.dataset.done = "true";
    renderConversationItem(conv);
    updateButtons();
    if (!ui.input.disabled && conv === state.active) ui.input.focus();
  }
}

/** Records a finished (or stopped) turn: its figures under the reply, its blocks in the map. */
function finishTurn(conv, bubble, usage, details, wallMs) {
  conv.turns += 1;
  const n = usage.completion_tokens;
  const decodeTokS = details.decode_ms > 0 && n > 1 ? (n - 1) / (details.decode_ms / 1000) : null;
  Object.assign(bubble.dataset, {
    promptTokens: String(usage.prompt_tokens),
    tokens: String(n),
    finishReason: details.finish_reason,
    prefixHit: String(usage.prefix_hit_tokens),
    ttftMs: details.ttft_ms == null ? "" : details.ttft_ms.toFixed(0),
  });
  bubble.append(turnStats(usage, details, decodeTokS, wallMs));
  const d = usage.completion_tokens_details ?? {};
  const drafts = { accepted: d.accepted_prediction_tokens ?? 0, drafted: (d.accepted_prediction_tokens ?? 0) + (d.rejected_prediction_tokens ?? 0) };
  bubble.dataset.drafts = `${drafts.accepted}/${drafts.drafted}`;
  state.lastTurn = { hit: usage.prefix_hit_tokens, prompt: usage.prompt_tokens, ttft: details.ttft_ms, speed: decodeTokS, drafts };
  if (details.stats) state.stats = { ...details.stats, running: [], queued: [] };
  claimBlocks(conv, details.blocks ?? [], usage.prefix_hit_tokens);
}

/** "drafts 12/20" (draft tokens taken of those drafted) when the turn drafted any; null otherwise. */
function draftsText(usage) {
  const d = usage.completion_tokens_details;
  const drafted = (d?.accepted_prediction_tokens ?? 0) + (d?.rejected_prediction_tokens ?? 0);
  return drafted > 0 ? `drafts ${d.accepted_prediction_tokens}/${drafted}` : null;
}

function turnStats(usage, details, tokS, wallMs) {
  const el = document.createElement("div");
  el.className = "stats";
  const why = { stop: "finished", length: "token limit", abort: "stopped" }[details.finish_reason] || details.finish_reason;
  const parts = [
    [usage.prefix_hit_tokens > 0 ? "hit" : "", `prefix hit ${usage.prefix_hit_tokens}/${usage.prompt_tokens}`],
    ["", details.ttft_ms != null ? `TTFT ${(details.ttft_ms / 1000).toFixed(2)} s` : null],
    ["", tokS != null ? `${tokS.toFixed(1)} tok/s` : null],
    ["", plural(usage.completion_tokens, "token")],
    ["", draftsText(usage)],
    ["", why],
  ];
  for (const [cls, text] of parts) {
    if (!text) continue;
    const span = document.createElement("span");
    if (cls) span.className = cls;
    span.textContent = text;
    el.append(span);
  }
  el.title = `total ${(wallMs / 1000).toFixed(2)} s · prefill ${details.prefill_tokens} tokens in ${details.prefill_ms.toFixed(0)} ms · decode ${details.decode_ms.toFixed(0)} ms · queued ${(details.queue_ms ?? 0).toFixed(0)} ms`;
  return el;
}

/**
 * Attributes a finished turn's block table to its conversation. Blocks inside the prefix hit
 * were reused from the cache and keep their earlier owners too (a shared prefix); every other
 * block is new to this turn, whoever held that physical block before.
 */
function claimBlocks(conv, blocks, hitTokens) {
  const blockSize = state.info.block_size;
  const reused = Math.floor(hitTokens / blockSize);
  const mine = new Set(blocks);
  for (const [block, owners] of state.claims) {
    if (owners.has(conv.id) && !mine.has(block)) owners.delete(conv.id);
    if (owners.size === 0) state.claims.delete(block);
  }
  blocks.forEach((block, i) => {
    const owners = i < reused ? (state.claims.get(block) ?? new Set()) : new Set();
    owners.add(conv.id);
    state.claims.set(block, owners);
  });
  conv.blocks = blocks;
}

// ---- The KV panel --------------------------------------------------------------------------------

/** Empties the panel while no engine is loaded (before the first model, or while another loads). */
function clearKv() {
  state.stats = null;
  state.lastTurn = null;
  state.claims.clear();
  ui.kvMap.replaceChildren();
  Object.assign(ui.kvStats.dataset, { blocksTotal: "0", blocksUsed: "0", blocksCached: "0", blocksFree: "0", lastPrefixHit: "0" });
  for (const el of [ui.kvSummary, ui.kvBlocks, ui.kvLive, ui.kvRate, ui.kvEvictions, ui.gaugeF32Value, ui.gaugeInt8Value,
    ui.turnHit, ui.turnTtft, ui.turnSpeed, ui.turnDrafts]) el.textContent = "–";
  ui.gaugeNote.textContent = "";
  ui.gaugeF32.style.width = "0";
  ui.gaugeInt8.style.width = "0";
}

function buildKvMap() {
  const total = state.stats.pool.blocks_total;
  ui.kvMap.replaceChildren();
  ui.kvMap.style.setProperty("--cols", String(total <= 64 ? 8 : total <= 256 ? 16 : total <= 1024 ? 32 : 64));
  for (let i = 0; i < total; i++) {
    const cell = document.createElement("span");
    cell.className = "kv-cell";
    ui.kvMap.append(cell);
  }
}

async function refreshStats() {
  if (!state.engine) return;
  try {
    state.stats = await state.engine.stats();
  } catch (e) {
    if (e.code !== "DISPOSED") console.error(e);
    return;
  }
  renderKv();
}

/** A refresh now unless one is in flight: the map follows the tokens as they arrive. */
let refreshing = false;
function requestRefresh() {
  if (refreshing) return;
  refreshing = true;
  refreshStats().finally(() => { refreshing = false; });
}

function startRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setInterval(() => {
    const busy = state.conversations.filter((c) => c.busy);
    for (const c of busy) {
      renderConversationItem(c);
      c.bubble?.classList.toggle("queued", waiting(c));
    }
    if (busy.length === 0) {
      clearInterval(state.refreshTimer);
      state.refreshTimer = 0;
    }
    refreshStats();
  }, 400);
}

/**
 * Draws the pool. Finished turns come from the engine's snapshot; a reply being generated grows
 * into free cells as its tokens arrive (the engine reports the exact blocks when the turn ends).
 */
function renderKv() {
  const stats = state.stats;
  if (!stats || !state.info) return;
  const { pool } = stats;
  const blockSize = pool.block_size;
  const cells = ui.kvMap.children;
  if (cells.length !== pool.blocks_total) buildKvMap();
  const byId = new Map(state.conversations.map((c) => [c.id, c]));
  for (const [block, owners] of state.claims) {
    if (stats.block_states[block] === 0) state.claims.delete(block);
    else for (const id of owners) if (!byId.has(id)) owners.delete(id);
  }

  // Running replies: their block tables from the engine's last step; a reply admitted since
  // then grows into free cells from the lowest index up until the next snapshot has it.
  const growing = new Map();
  const free = [];
  stats.block_states.forEach((s, b) => { if (s === 0) free.push(b); });
  for (const conv of state.conversations) {
    const p = conv.busy && conv.stream ? conv.stream.progress() : null;
    if (!p || p.state !== "running") continue;
    const run = stats.running?.find((r) => r.request === p.request);
    if (run && run.blocks.length > 0) {
      for (const b of run.blocks) growing.set(b, conv);
      continue;
    }
    const need = Math.ceil((p.prompt_tokens + p.completion_tokens) / blockSize);
    for (let k = blocksOf(conv).length; k < need && free.length > 0; k++) growing.set(free.shift(), conv);
  }

  let held = 0;
  let cached = 0;
  for (let b = 0; b < cells.length; b++) {
    const cell = cells[b];
    const st = stats.block_states[b];
    const owners = state.claims.get(b);
    const grow = growing.get(b);
    let kind;
    let color = "";
    let title;
    const sharedWithOthers = grow && owners && [...owners].some((id) => id !== grow.id);
    if (sharedWithOthers) {
      kind = "shared";
      title = `block ${b}: a shared prefix, read by “${grow.title}” now`;
    } else if (grow) {
      kind = "growing";
      color = grow.color;
      title = `block ${b}: held by “${grow.title}”, generating`;
    } else if (st === 0) {
      kind = "free";
      title = `block ${b}: free`;
    } else if (owners && owners.size > 1) {
      kind = "shared";
      title = `block ${b}: a prefix shared by ${owners.size} conversations`;
    } else if (owners && owners.size === 1) {
      const conv = byId.get([...owners][0]);
      kind = st === 2 ? "owned evictable" : "owned";
      color = conv.color;
      title = `block ${b}: “${conv.title}”${st === 2 ? " (cached, evictable)" : ""}`;
    } else {
      kind = st === 2 ? "cached" : "owned";
      title = `block ${b}: ${st === 2 ? "cached, evictable" : "held"}`;
    }
    if (grow || st === 1) held += 1;
    else if (st === 2) cached += 1;
    const className = `kv-cell ${kind}`;
    if (cell.className !== className) cell.className = className;
    cell.style.setProperty("--c", color || "");
    cell.dataset.state = grow ? "1" : String(st);
    cell.title = `${title} · refcount ${stats.refcounts[b] ?? 0}`;
  }
  const free_ = pool.blocks_total - held - cached;
  Object.assign(ui.kvStats.dataset, {
    blocksTotal: String(pool.blocks_total),
    blocksUsed: String(held),
    blocksCached: String(cached),
    blocksFree: String(free_),
    lastPrefixHit: String(state.lastTurn?.hit ?? 0),
  });
  ui.kvSummary.textContent = `${pool.blocks_total} blocks × ${blockSize} tokens · ${pool.kv_dtype} · ${mb(pool.bytes_total)}`;
  ui.kvBlocks.textContent = `${held} · ${cached} · ${free_}`;
  ui.kvLive.textContent = `${pool.live_tokens} tokens`;
  const prefix = stats.prefix;
  ui.kvRate.textContent = prefix ? (prefix.enabled ? `${(prefix.hit_rate * 100).toFixed(0)}% of ${prefix.prompt_tokens} tokens` : "off") : "–";
  ui.kvEvictions.textContent = prefix ? String(prefix.evictions) : "–";
  renderTurn();
  renderGauge(held + cached);
  for (const c of state.conversations) {
    renderConversationItem(c);
    if (c.busy) c.bubble?.classList.toggle("queued", waiting(c));
  }
}

function renderTurn() {
  const t = state.lastTurn;
  ui.turnHit.textContent = t ? `${t.hit}/${t.prompt}` : "–";
  ui.turnHit.classList.toggle("good", !!t && t.hit > 0);
  ui.turnTtft.textContent = t?.ttft != null ? `${(t.ttft / 1000).toFixed(2)} s` : "–";
  ui.turnSpeed.textContent = t?.speed != null ? `${t.speed.toFixed(1)} tok/s` : "–";
  // Draft tokens taken of those drafted (speculative decoding; "–" when the turn drafted none).
  ui.turnDrafts.textContent = t?.drafts?.drafted ? `${t.drafts.accepted}/${t.drafts.drafted}` : "–";
}

/**
 * KV bytes of the blocks in use under f32 and under int8. An f32 value takes 4 bytes; the int8
 * format takes 1 byte per value plus one f32 scale per head and token (measured from the pool
 * when it runs int8).
 */
function renderGauge(blocksInUse) {
  const m = state.info.model;
  const pool = state.stats.pool;
  const values = m.n_layers * m.n_kv_heads * m.head_dim * 2;
  const f32PerToken = values * 4;
  const int8PerToken = pool.kv_dtype === "int8" ? pool.bytes_per_token : values + m.n_layers * m.n_kv_heads * 2 * 4;
  const tokens = blocksInUse * pool.block_size;
  // The bars compare the two formats for what is in use now; f32 fills its bar.
  const scale = Math.max(1, tokens * f32PerToken);
  const f32 = tokens * f32PerToken;
  const int8 = tokens * int8PerToken;
  ui.gaugeF32.style.width = `${Math.max(f32 > 0 ? 1 : 0, (f32 / scale) * 100)}%`;
  ui.gaugeInt8.style.width = `${Math.max(int8 > 0 ? 1 : 0, (int8 / scale) * 100)}%`;
  ui.gaugeF32Value.textContent = mb(f32);
  ui.gaugeInt8Value.textContent = mb(int8);
  const ratio = (f32PerToken / int8PerToken).toFixed(1);
  ui.gaugeNote.textContent = `${plural(blocksInUse, "block")} · per token ${f32PerToken.toLocaleString("en")} B as f32, `
    + `${Math.round(int8PerToken).toLocaleString("en")} B as int8 (${ratio}× less) · this pool: ${pool.kv_dtype}`;
  ui.gaugeNote.title = `Weights take ${mb(state.info.memory.weights_bytes)}; the whole KV pool reserves ${mb(pool.bytes_total)}.`;
}

// ---- Controls ------------------------------------------------------------------------------------

function updateButtons() {
  const conv = state.active;
  const ready = !!state.engine && !state.engine.lost;
  const busy = !!conv?.busy;
  ui.send.disabled = !ready || busy || ui.input.value.trim() === "";
  ui.stop.disabled = !busy;
  ui.composer.classList.toggle("busy", busy);
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
ui.stop.addEventListener("click", () => {
  state.active?.controller?.abort();
  ui.stop.disabled = true;
});
ui.newConversation.addEventListener("click", () => {
  // An empty conversation is reused rather than piling up blank ones.
  const blank = state.conversations.find((c) => !c.started && !c.busy);
  if (blank) activate(blank); else newConversation();
});
ui.systemPrompt.addEventListener("input", () => { ui.systemPrompt.dataset.draft = ui.systemPrompt.value; });
ui.resetCache.addEventListener("click", async () => {
  if (!state.engine) return;
  try {
    await state.engine.resetCache();
  } catch (e) {
    if (e.code !== "BUSY") console.error(e);
    return;
  }
  await refreshStats();
});
ui.kvDtype.addEventListener("change", () => {
  const next = new URLSearchParams(location.search);
  next.set("kv_dtype", ui.kvDtype.value);
  location.search = next.toString();
});
ui.modelFile.addEventListener("change", () => openFile(ui.modelFile.files?.[0]));

// A .gguf dropped anywhere on the page replaces the model.
let dragDepth = 0;
window.addEventListener("dragenter", (e) => {
  if (!e.dataTransfer?.types.includes("Files")) return;
  dragDepth += 1;
  ui.dropOverlay.hidden = false;
});
window.addEventListener("dragleave", () => {
  dragDepth = Math.max(0, dragDepth - 1);
  if (dragDepth === 0) ui.dropOverlay.hidden = true;
});
window.addEventListener("dragover", (e) => e.preventDefault());
window.addEventListener("drop", (e) => {
  e.preventDefault();
  dragDepth = 0;
  ui.dropOverlay.hidden = true;
  const file = [...(e.dataTransfer?.files ?? [])].find((f) => /\.gguf$/i.test(f.name)) ?? e.dataTransfer?.files?.[0];
  openFile(file);
});

for (const m of MODELS) ui.picker.append(new Option(m.label, m.id));
ui.picker.addEventListener("change", () => {
  const entry = MODELS.find((m) => m.id === ui.picker.value);
  if (entry) chooseModel(entry);
});

// For tests and the console: the page's engine (e.g. `chatPage.engine.simulateDeviceLoss()`).
window.chatPage = { get engine() { return state.engine; } };

newConversation();
// Saved conversations come back while the model loads; their snapshots are imported on use.
await restoreConversations();
// ?model=URL loads any file; ?pick=ID one of the picker's models; else the first (SmolLM2).
const wanted = params.get("model");
const known = MODELS.find((m) => m.url === wanted || m.id === (params.get("pick") ?? MODELS[0].id));
if (wanted && !MODELS.some((m) => m.url === wanted)) {
  pickerShows("url", wanted.split("/").pop());
  loadModel(wanted, wanted.split("/").pop().replace(/\.gguf$/i, ""));
} else {
  chooseModel(known ?? MODELS[0]);
}
