// The engine's home: a dedicated Web Worker that owns the WebGPU device and the wasm engine, so
// the page never blocks. It downloads the model into browser storage (js/storage.js: OPFS,
// resumable), hands it to the engine by ranges as the engine reads it (never whole in memory),
// runs every request (chat, or raw-text completion) through the engine's continuous-batching scheduler, and streams
// tokens back. Its messages, in and out, are those of js/protocol.js.
import init, { WebEngine, defaultBackend } from "../pkg/pagedlm.js";
import { fromWorker } from "./protocol.js";
import { deleteCachedModel, headerFiles, modelFiles } from "./storage.js";

/** @type {WebEngine | null} */
let engine = null;
/** Stats taken when the engine was last idle: `WebEngine.stats()` is BUSY during a generation. */
let lastStats = null;
/**
 * Where the engine's model came from, for `restart`: the `load` message, without the bytes of
 * an ArrayBuffer (a second copy of the model in the worker would cost its size for the engine's
 * whole life; the caller, who has them, passes them to `restart` again).
 */
let loadedFrom = null;
/** Whether the page was told that the engine's device is lost (once per engine). */
let lossReported = false;

const post = (message, transfer = []) => self.postMessage(message, transfer);

/**
 * The smallest module that uses relaxed SIMD (`i32x4.relaxed_dot_i8x16_i7x16_add_s` of three
 * zero vectors): `WebAssembly.validate` accepts it where the browser has relaxed SIMD
 * (Chromium 114 on).
 */
const RELAXED_SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 61, 1, 59, 0,
  ...[0, 1, 2].flatMap(() => [253, 12, ...new Array(16).fill(0)]), 253, 147, 2, 11,
]);

/**
 * Instantiates the wasm engine (once): the build with relaxed SIMD where the browser has it,
 * whose int8 dot products take fewer instructions (a step's extra rows, speculative drafts and
 * batches, cost less) and give the same bits; else the SIMD128 build.
 */
async function initWasm() {
  if (WebAssembly.validate(RELAXED_SIMD_PROBE)) {
    try {
      return await init({ module_or_path: new URL("../pkg/pagedlm_relaxed_bg.wasm", import.meta.url) });
    } catch (e) {
      // A server without the file (or one that failed to send it): the SIMD128 build, said so.
      console.warn(`pagedlm: the relaxed-SIMD build did not load (${e?.message || e}); using the SIMD128 build`);
    }
  }
  return init();
}

function fail(code, message) {
  return Object.assign(new Error(message), { code });
}

const WEBGPU_HINT = "Use a browser with WebGPU enabled (a recent Chrome, Edge or Safari; headless Chromium needs --enable-unsafe-webgpu).";

async function checkWebGpu() {
  if (!("gpu" in navigator) || !navigator.gpu) {
    throw fail("WEBGPU_UNAVAILABLE", `This browser does not offer WebGPU to workers (navigator.gpu is missing). ${WEBGPU_HINT}`);
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    throw fail("WEBGPU_UNAVAILABLE", `Requesting a WebGPU adapter failed: ${e?.message || e}. ${WEBGPU_HINT}`);
  }
  if (!adapter) throw fail("WEBGPU_UNAVAILABLE", `WebGPU found no adapter on this machine. ${WEBGPU_HINT}`);
}

/**
 * A random-access reader over `blobs` (one per file of the model) for `WebEngine.loadFrom`:
 * synchronous, as the engine asks for it (FileReaderSync, which only workers have). Each read
 * returns exactly the bytes asked for; a Blob that cannot be read (a File changed on disk) throws,
 * and the load rejects with MODEL_READ.
 */
function blobReader(blobs) {
  const reader = new FileReaderSync();
  return {
    sizes: blobs.map((b) => b.size),
    read(file, offset, length) {
      const bytes = new Uint8Array(reader.readAsArrayBuffer(blobs[file].slice(offset, offset + length)));
      if (bytes.length !== length) throw new Error(`file ${file} holds ${blobs[file].size} bytes: no ${length} at ${offset}`);
      return bytes;
    },
  };
}

/**
 * Files up to this size are read into the worker's JS memory at once (one asynchronous read,
 * never into wasm memory), then read from there: per-range synchronous reads of a Blob cost
 * about twice the time (SmolLM2's 98 MB: a 420 ms upload through FileReaderSync, 216 ms from
 * memory). Larger files are read by ranges, so the worker never holds them.
 */
const READ_WHOLE_BYTES = 256 * 1024 * 1024;

/** The reader for `blobs`: a small single file read whole into JS memory, else by ranges. */
async function readerOf(blobs) {
  if (blobs.length === 1 && blobs[0].size <= READ_WHOLE_BYTES) return bufferReader(new Uint8Array(await blobs[0].arrayBuffer()));
  return blobReader(blobs);
}

/** A reader over bytes the worker holds in JS memory (never copied whole into wasm). */
function bufferReader(bytes) {
  return {
    sizes: [bytes.length],
    read(file, offset, length) {
      if (file !== 0 || offset + length > bytes.length) throw new Error(`the model holds ${bytes.length} bytes: no ${length} at ${offset}`);
      return bytes.subarray(offset, offset + length);
    },
  };
}

const isFileHandle = (model) => typeof FileSystemFileHandle !== "undefined" && model instanceof FileSystemFileHandle;

/**
 * The model as a reader for `WebEngine.loadFrom`: a URL from browser storage or the network
 * (js/storage.js), a Blob/File, an OPFS file handle, or an ArrayBuffer. Returns {reader, bytes,
 * source: "network"|"cache"|"file"|"buffer", storage: "opfs"|"cache"|null, url}.
 */
async function modelSource(model, store, progress) {
  let bytes = null;
  if (model instanceof ArrayBuffer) bytes = new Uint8Array(model);
  else if (ArrayBuffer.isView(model)) bytes = new Uint8Array(model.buffer, model.byteOffset, model.byteLength);
  if (bytes) return { reader: bufferReader(bytes), bytes: bytes.length, source: "buffer", storage: null };
  let blobs = null;
  if (typeof Blob !== "undefined" && model instanceof Blob) blobs = [model];
  else if (isFileHandle(model)) blobs = [await model.getFile()];
  if (blobs) return { reader: await readerOf(blobs), bytes: blobs[0].size, source: "file", storage: null };
  if (typeof model !== "string") {
    throw fail("INVALID_ARGUMENT", "model must be a URL, an ArrayBuffer (or typed array), a File/Blob or an OPFS file handle");
  }
  const got = await modelFiles(model, store, progress);
  const total = got.blobs.reduce((sum, b) => sum + b.size, 0);
  // Read from storage as the engine uploads: its `upload` events count those reads.
  if (got.source === "cache") progress({ phase: "cache", loaded: total, total, storage: got.storage });
  return { reader: await readerOf(got.blobs), bytes: total, source: got.source, storage: got.storage, url: got.url };
}

/**
 * The engine's load progress (`upload`: weight bytes read and placed; `tokenizer`; `pipelines`)
 * as page events, `upload` at most every 50 ms and its last one always.
 */
function engineProgress(progress) {
  let last = -Infinity;
  return (event) => {
    const e = plain(event instanceof Map ? event : { ...event });
    const now = performance.now();
    if (e.phase === "upload" && e.loaded !== e.total && now - last < 50) return;
    last = now;
    progress(e);
  };
}

/** Whether this worker holds its Web Lock (holdLock). */
let holdingLock = false;

/**
 * Takes the Web Lock `name` for the rest of the worker's life: the page's request for the same
 * lock is granted when the worker ends, however it ends (closed, or stopped by the browser for
 * its memory), which is how the page learns of a death no error event reports. Resolves once
 * held (false where the browser has no Web Locks).
 */
function holdLock(name) {
  if (holdingLock || !name || !navigator.locks) return Promise.resolve(holdingLock);
  return new Promise((resolve) => {
    navigator.locks.request(name, () => {
      holdingLock = true;
      resolve(true);
      return new Promise(() => {});
    }).catch(() => resolve(false));
  });
}

/**
 * A failure the wasm module does not come back from (a trap: a Rust panic, memory exhausted):
 * its state may be half-written, so no further call can be trusted.
 */
function fatal(e) {
  return e instanceof WebAssembly.RuntimeError || (e instanceof RangeError && /memory/i.test(e.message));
}

/** Ends the worker through an uncaught error: the page fails every pending call with WORKER_FAILED. */
function die(e) {
  setTimeout(() => { throw new Error(`the wasm engine failed and cannot continue: ${e?.message || e}`); });
}

async function load({ id, model, options, cache: cacheOptions, lock }, progress) {
  if (engine) throw fail("INVALID_ARGUMENT", "this worker already holds an engine");
  if (await holdLock(lock)) post(fromWorker.held(id));
  // The wasm module first: it says which backend a load that names none takes.
  await initWasm();
  // The CPU backend needs no WebGPU; "auto" without it takes the CPU backend and says why.
  let noWebGpu = null;
  const backend = options?.backend ?? defaultBackend();
  if (backend === "auto") {
    noWebGpu = await checkWebGpu().then(() => null, (e) => e.message);
    if (noWebGpu) options = { ...options, backend: "cpu" };
  } else if (backend !== "cpu") {
    await checkWebGpu();
  }
  const t0 = performance.now();
  const got = await modelSource(model, cacheOptions, progress);
  const downloadMs = performance.now() - t0;
  progress({ phase: "load", loaded: got.bytes, total: got.bytes });
  const t1 = performance.now();
  try {
    engine = await WebEngine.loadFrom(got.reader.sizes, got.reader.read, options, engineProgress(progress));
  } catch (e) {
    // A stored file that does not load is not worth keeping: the next try downloads it again.
    if (got.source === "cache" && e?.code === "MODEL_FORMAT") await deleteCachedModel(got.url, cacheOptions.name).catch(() => {});
    throw e;
  }
  const info = engine.info();
  if (noWebGpu) info.backend_reason = `auto: no usable WebGPU adapter (${noWebGpu})`;
  lastStats = engine.stats();
  loadedFrom = { id, model: got.source === "buffer" ? null : model, options, cache: cacheOptions };
  lossReported = false;
  progress({ phase: "ready", loaded: got.bytes, total: got.bytes });
  return {
    info,
    stats: lastStats,
    load: { source: got.source, storage: got.storage, bytes: got.bytes, files: got.reader.sizes.length, download_ms: downloadMs, engine_ms: performance.now() - t1 },
  };
}

/** What `estimateMemory` reads of a file first: a GGUF header with a 150k-token vocabulary fits. */
const HEADER_BYTES = 4 << 20;

/** Objects of the wasm engine as plain ones (a Rust map may come as a JS Map). */
function plain(value) {
  if (value instanceof Map) return Object.fromEntries([...value].map(([k, v]) => [k, plain(v)]));
  if (Array.isArray(value)) return value.map(plain);
  if (value && typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  }
  return value;
}

/** The model's files for reading their headers only: {sizes, prefix(file, length) -> Promise<Uint8Array>}. */
async function headerSource(model, store) {
  let bytes = null;
  if (model instanceof ArrayBuffer) bytes = new Uint8Array(model);
  else if (ArrayBuffer.isView(model)) bytes = new Uint8Array(model.buffer, model.byteOffset, model.byteLength);
  if (bytes) return { sizes: [bytes.length], prefix: async (_, length) => bytes.subarray(0, length) };
  let blob = null;
  if (typeof Blob !== "undefined" && model instanceof Blob) blob = model;
  else if (isFileHandle(model)) blob = await model.getFile();
  if (blob) return { sizes: [blob.size], prefix: async (_, length) => new Uint8Array(await blob.slice(0, length).arrayBuffer()) };
  if (typeof model !== "string") {
    throw fail("INVALID_ARGUMENT", "model must be a URL, an ArrayBuffer (or typed array), a File/Blob or an OPFS file handle");
  }
  return headerFiles(model, store.name, HEADER_BYTES);
}

/**
 * What the device allows, for the estimate: the WebGPU adapter's buffer limits, and a memory
 * budget (`maxMemoryBytes`, else the browser's `navigator.deviceMemory`, a rounded GiB figure).
 */
async function deviceLimits(options) {
  const limits = {};
  let adapter = null;
  try {
    adapter = await navigator.gpu?.requestAdapter();
  } catch {
    adapter = null;
  }
  if (adapter) {
    limits.maxBufferSize = adapter.limits.maxBufferSize;
    limits.maxStorageBufferBindingSize = adapter.limits.maxStorageBufferBindingSize;
  }
  const memory = options?.maxMemoryBytes ?? (navigator.deviceMemory ? navigator.deviceMemory * 2 ** 30 : undefined);
  if (memory) limits.memoryBytes = memory;
  return { limits, webgpu: !!adapter };
}

/**
 * The memory a load of `model` with `options` would take and whether it fits, from the file's
 * header alone (`WebEngine.estimateMemory`): fetches more of a header only when the engine asks.
 */
async function estimate({ model, options, cache: store }) {
  await initWasm();
  const files = await headerSource(model, store);
  const { limits, webgpu } = await deviceLimits(options);
  const engineOptions = { ...options, limits: { ...limits, ...options?.limits } };
  if (!webgpu && (engineOptions.backend ?? defaultBackend()) === "auto") engineOptions.backend = "cpu";
  let prefixes = await Promise.all(files.sizes.map((size, i) => files.prefix(i, Math.min(size, HEADER_BYTES))));
  for (;;) {
    const result = plain(WebEngine.estimateMemory(prefixes, files.sizes, engineOptions));
    if (result.complete) return result;
    const need = result.need.map((n, i) => Math.min(n, files.sizes[i]));
    if (!need.some((n, i) => n > prefixes[i].length)) {
      throw fail("MODEL_FORMAT", "the model's header does not end inside the file: it is not a usable GGUF");
    }
    prefixes = await Promise.all(need.map((n, i) => (n > prefixes[i].length ? files.prefix(i, n) : prefixes[i])));
  }
}

// ==== Requests: the engine's continuous-batching scheduler ===========================================
// `create` and `abort` messages land in the inbox; the loop applies them between engine steps
// (the engine is busy during a step) and runs steps while any request is unfinished. Every
// submitted request advances in the same steps, so concurrent requests stream together.
const inbox = [];
/** engine request id -> {id (the page's), engineId, state: "queued"|"running", queuedAt, startedAt, tokens, prompt_tokens} */
const requests = new Map();
let looping = false;
/** A profile holds the engine (`WebEngine.profile`): no step may start until it ends. */
let profiling = false;

function enqueue(request) {
  request.queuedAt = performance.now();
  inbox.push({ op: "submit", request });
  kick();
}

/** A snapshot operation, run between engine steps (the engine is busy during one). */
function snapshotOp(op, id, payload) {
  inbox.push({ op, id, payload });
  kick();
}

async function runSnapshotOp({ op, id, payload }) {
  try {
    if (!engine) throw fail("DISPOSED", "the engine was disposed");
    if (op === "export") {
      const tokens = engine.historyTokens(payload);
      const bytes = await engine.exportSnapshot(tokens);
      lastStats = engine.stats();
      post(fromWorker.result(id, { bytes, tokens: tokens.length }), [bytes.buffer]);
    } else {
      const tokens = engine.importSnapshot(payload);
      lastStats = engine.stats();
      post(fromWorker.result(id, { tokens: tokens.length }));
    }
  } catch (e) {
    post(fromWorker.error(id, e));
  }
}

function abort(id) {
  inbox.push({ op: "abort", id });
  kick();
}

function kick() {
  if (looping || profiling) return;
  looping = true;
  loop().finally(() => {
    looping = false;
    freeRetired();
    if (inbox.length > 0) kick();
  });
}

async function applyInbox() {
  for (const item of inbox.splice(0)) {
    if (item.op === "export" || item.op === "import") {
      await runSnapshotOp(item);
    } else if (item.op === "submit") {
      const { request } = item;
      try {
        if (!engine) throw fail("DISPOSED", "the engine was disposed");
        const { id, prompt_tokens } = request.prompt !== undefined
          ? engine.submitPrompt(request.prompt, request.options)
          : engine.submit(request.messages, request.options);
        Object.assign(request, { engineId: id, prompt_tokens, tokens: 0, state: "queued" });
        requests.set(id, request);
        post(fromWorker.queued(request.id, prompt_tokens));
      } catch (e) {
        if (e?.code === "DEVICE_LOST") reportLoss();
        post(fromWorker.error(request.id, e));
      }
    } else {
      const entry = [...requests.values()].find((r) => r.id === item.id);
      if (!entry) {
        // Not submitted yet: it may still sit in this very inbox.
        const at = inbox.findIndex((i) => i.op === "submit" && i.request.id === item.id);
        if (at >= 0) inbox.splice(at, 1);
        continue;
      }
      try {
        const result = engine.abort(entry.engineId);
        lastStats = engine.stats();
        if (result) finish(entry, result);
      } catch (e) {
        requests.delete(entry.engineId);
        post(fromWorker.error(entry.id, e));
      }
    }
  }
}

/** Tells the page, once, that the engine's GPU device is lost (its requests end with DEVICE_LOST). */
function reportLoss() {
  if (!engine || lossReported || !engine.isLost()) return false;
  lossReported = true;
  post(fromWorker.deviceLost("the GPU device was lost; engine.restart() loads the model again on a new device"));
  return true;
}

function finish(entry, result) {
  requests.delete(entry.engineId);
  const queueMs = entry.startedAt != null ? entry.startedAt - entry.queuedAt : null;
  post(fromWorker.done(entry.id, { ...result, queue_ms: queueMs }, lastStats));
}

/**
 * Resolves in a new task, so the page's messages (create, abort, stats, dispose) are handled
 * between steps. A CPU backend step resolves without waiting on anything outside: awaiting it
 * alone would keep the loop in microtasks and the inbox closed until every request had ended.
 * A MessageChannel, not setTimeout: no 4 ms clamp per step.
 */
const nextTask = (() => {
  const channel = new MessageChannel();
  const waiting = [];
  channel.port1.onmessage = () => waiting.shift()?.();
  return () => new Promise((resolve) => {
    waiting.push(resolve);
    channel.port2.postMessage(null);
  });
})();

async function loop() {
  for (;;) {
    await applyInbox();
    if (!engine || !engine.hasWork()) return;
    let events;
    try {
      events = await engine.step();
    } catch (e) {
      if (fatal(e)) return die(e);
      reportLoss();
      // A failed step leaves no request worth continuing: end them all with its error.
      for (const entry of requests.values()) {
        try { engine?.abort(entry.engineId); } catch { /* already gone */ }
        post(fromWorker.error(entry.id, e));
      }
      requests.clear();
      return;
    }
    if (!engine) return;
    // Before the requests' DEVICE_LOST errors, so that the page's `engine.lost` holds when they come.
    reportLoss();
    // The pool after this step: what `stats` answers while the next step runs (the page's KV
    // panel), and the `stats` of a request finishing in it.
    lastStats = engine.stats();
    for (const event of events) {
      const entry = requests.get(event.id);
      if (!entry) continue;
      if (event.type === "admitted") {
        // Once per request, before its first token.
        entry.state = "running";
        entry.startedAt = performance.now();
        post(fromWorker.begin(entry.id, entry.prompt_tokens, event.prefix_hit_tokens));
      } else if (event.type === "token") {
        if (entry.tokens === 0) post(fromWorker.start(entry.id, entry.prompt_tokens));
        entry.tokens += 1;
        post(fromWorker.token(entry.id, event.text, event.reasoning));
      } else if (event.type === "finished") {
        finish(entry, event.result);
      } else {
        requests.delete(event.id);
        post(fromWorker.error(entry.id, { code: event.code, message: event.message }));
      }
    }
    await nextTask();
  }
}
// ====================================================================================================

function stats() {
  if (!engine) throw fail("DISPOSED", "the engine was disposed");
  // During a step the engine is busy: the snapshot after the last step is at most one step old.
  if (!looping && !profiling) lastStats = engine.stats();
  const entries = [...requests.values()];
  return {
    ...lastStats,
    running: entries.filter((r) => r.state === "running").map((r) => ({ request: r.id, prompt_tokens: r.prompt_tokens, tokens: r.tokens, blocks: lastStats.sched.sequences.find((s) => s.request === r.engineId)?.blocks ?? [] })),
    queued: entries.filter((r) => r.state === "queued").map((r) => r.id).concat(inbox.filter((i) => i.op === "submit").map((i) => i.request.id)),
  };
}

/** An engine disposed while a generation still ran: freed once that generation has ended. */
let retired = null;

function freeRetired() {
  if (!retired) return;
  try { retired.free(); } catch { /* already freed */ }
  retired = null;
}

function dispose() {
  const disposed = fail("DISPOSED", "the engine was disposed");
  for (const item of inbox.splice(0)) {
    if (item.op === "submit") post(fromWorker.error(item.request.id, disposed));
    else if (item.op === "export" || item.op === "import") post(fromWorker.error(item.id, disposed));
  }
  for (const entry of requests.values()) post(fromWorker.error(entry.id, disposed));
  requests.clear();
  retired = engine;
  engine = null;
  if (!looping && !profiling) freeRetired();
}

/** `WebEngine.profile` between steps, on an idle engine; requests sent meanwhile wait for it. */
async function profile({ promptTokens, options }) {
  if (!engine) throw fail("DISPOSED", "the engine was disposed");
  if (looping || profiling || inbox.length > 0 || requests.size > 0) {
    throw fail("BUSY", "requests are running: profile when they have finished");
  }
  profiling = true;
  try {
    return await engine.profile(promptTokens, options);
  } finally {
    profiling = false;
    freeRetired();
    if (inbox.length > 0) kick();
  }
}

/**
 * Destroys the device as a driver reset would (WebEngine.simulateDeviceLoss) and, once its loss
 * is seen, lets the loop end the requests; reports the loss even when nothing runs.
 */
async function simulateDeviceLoss() {
  if (!engine) throw fail("DISPOSED", "the engine was disposed");
  engine.simulateDeviceLoss();
  for (let i = 0; i < 200 && !engine.isLost(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  kick();
  if (!looping) reportLoss();
}

/**
 * A new engine on the lost one's model, read again from where it came (browser storage, the File;
 * a URL loaded with `cache: false` is downloaded again), or from `model` when given (required
 * for an engine loaded from an ArrayBuffer, whose bytes the worker does not keep).
 */
async function restart(model, progress) {
  if (!engine) throw fail("DISPOSED", "the engine was disposed");
  if (!engine.isLost()) throw fail("INVALID_ARGUMENT", "restart() is for an engine whose GPU device was lost; this one's is not");
  const from = { ...loadedFrom, id: null, model: model ?? loadedFrom.model };
  if (from.model == null) {
    throw fail("INVALID_ARGUMENT", "this engine was loaded from an ArrayBuffer, which pagedlm does not keep: pass it again, restart({ model: bytes })");
  }
  // The loop ends every request of a lost engine at its next step: let it.
  kick();
  while (looping || profiling || inbox.length > 0) await new Promise((resolve) => setTimeout(resolve, 5));
  retired = engine;
  engine = null;
  freeRetired();
  return load(from, progress);
}

/** One handler per message of `toWorker` (js/protocol.js), by its type. */
const handlers = {
  load: (data, reply) => reply(() => load(data, (progress) => post(fromWorker.progress(data.id, progress)))),
  create: ({ id, messages, options }) => enqueue({ id, messages, options }),
  complete: ({ id, prompt, options }) => enqueue({ id, prompt, options }),
  abort: ({ id }) => abort(id),
  stats: (_, reply) => reply(async () => stats()),
  resetCache: (_, reply) => reply(async () => {
    if (!engine) throw fail("DISPOSED", "the engine was disposed");
    if (looping || profiling) throw fail("BUSY", "requests are running: reset the cache when they have finished");
    engine.resetCache();
    lastStats = engine.stats();
    return lastStats;
  }),
  dispose: (_, reply) => reply(async () => dispose()),
  exportConversation: ({ id, messages }) => snapshotOp("export", id, messages),
  importConversation: ({ id, bytes }) => snapshotOp("import", id, bytes),
  profile: (data, reply) => reply(() => profile(data)),
  simulateDeviceLoss: (_, reply) => reply(() => simulateDeviceLoss()),
  estimate: (data, reply) => reply(() => estimate(data)),
  restart: (data, reply) => reply(() => restart(data.model, (progress) => post(fromWorker.progress(data.id, progress)))),
};

self.onmessage = async ({ data }) => {
  const { type, id } = data;
  const reply = async (work) => {
    try {
      post(fromWorker.result(id, await work()));
    } catch (e) {
      if (fatal(e)) return die(e);
      post(fromWorker.error(id, e));
    }
  };
  if (!Object.hasOwn(handlers, type)) return post(fromWorker.error(id, fail("INTERNAL", `unknown message ${type}`)));
  return handlers[type](data, reply);
};
