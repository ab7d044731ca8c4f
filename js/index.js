// pagedlm: an LLM on WebGPU in a Web Worker, driven through an OpenAI-shaped API.
//
//   import { createEngine } from "pagedlm";
//   const engine = await createEngine("/models/SmolLM2-135M-Instruct.Q4_1.gguf", { onProgress: console.log });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) {
//     out.textContent += chunk.choices[0]?.delta?.content ?? "";
//   }
//   // A base model (engine.info.model.chat_template === null) completes raw text instead:
//   const { choices } = await engine.completions.create({ prompt: "Once upon a time", max_tokens: 32 });
//
// Everything heavy happens in js/worker.js; this module only turns calls into messages and
// messages back into promises and async iterables; the messages are those of js/protocol.js.

import { ENGINE_OPTIONS, ESTIMATE_OPTIONS, PACKAGE_OPTIONS, requestOptions, toWorker } from "./protocol.js";
import { DEFAULT_STALL_MS, DEFAULT_STORE, deleteCachedModel as deleteStored, listCachedModels as listStored } from "./storage.js";

/** Errors from pagedlm: an `Error` with a `code` (WEBGPU_UNAVAILABLE, MODEL_FORMAT, ...). */
export class PagedlmError extends Error {
  constructor(code, message, extra = {}) {
    super(message);
    this.name = "PagedlmError";
    this.code = code;
    Object.assign(this, extra);
  }
}

function invalid(message) {
  return new PagedlmError("INVALID_ARGUMENT", message);
}

/** The model argument as something a Worker can receive. */
function modelSource(model, what = "createEngine(model)") {
  if (typeof model === "string" || model instanceof URL) {
    // Relative URLs mean the page's, not the worker script's.
    return absoluteUrl(model);
  }
  if (model instanceof ArrayBuffer || ArrayBuffer.isView(model)) return model;
  if (typeof Blob !== "undefined" && model instanceof Blob) return model;
  if (typeof FileSystemFileHandle !== "undefined" && model instanceof FileSystemFileHandle) return model;
  throw invalid(`${what}: model must be a URL (string or URL), an ArrayBuffer or typed array, a File/Blob or an OPFS FileSystemFileHandle`);
}

const absoluteUrl = (url) => new URL(String(url), globalThis.location?.href).href;

/** Whether this page asked the browser to keep its storage (asked once: models are big to fetch again). */
let persistAsked = false;

function askPersistence() {
  if (persistAsked) return;
  persistAsked = true;
  // persist() exists on Window's StorageManager only; the browser may say no, which costs nothing.
  globalThis.navigator?.storage?.persist?.().catch(() => {});
}

/** The engine options of `options` (checked against `known`, ENGINE_OPTIONS by default) and the package's own. */
function splitOptions(options, what, known = ENGINE_OPTIONS) {
  const { onProgress, cache = true, cacheName = DEFAULT_STORE, downloadStallMs = DEFAULT_STALL_MS, workerUrl, ...rest } = options ?? {};
  const engineOptions = {};
  for (const [k, v] of Object.entries(rest)) {
    if (!known.includes(k)) throw invalid(`${what}: unknown option ${k} (known: ${[...known, ...PACKAGE_OPTIONS].join(", ")})`);
    if (v !== undefined && v !== null) engineOptions[k] = v;
  }
  if (onProgress !== undefined && typeof onProgress !== "function") throw invalid(`${what}: onProgress must be a function`);
  if (typeof cacheName !== "string" || cacheName === "") throw invalid(`${what}: cacheName must be a non-empty string`);
  if (!(Number.isFinite(downloadStallMs) && downloadStallMs > 0)) throw invalid(`${what}: downloadStallMs must be a positive number of milliseconds`);
  return { engineOptions, onProgress, store: { enabled: !!cache, name: cacheName, stallMs: downloadStallMs }, workerUrl };
}

function startWorker(workerUrl) {
  if (typeof Worker === "undefined") throw new PagedlmError("UNSUPPORTED", "pagedlm needs Web Workers (a browser page)");
  return new Worker(workerUrl ?? new URL("./worker.js", import.meta.url), { type: "module", name: "pagedlm" });
}

/** Request/response over the worker's messages; streams go to per-request listeners. */
class Channel {
  constructor(worker) {
    this.worker = worker;
    this.next = 1;
    /** id -> {resolve, reject, onMessage} */
    this.pending = new Map();
    this.broken = null;
    worker.onmessage = ({ data }) => this.receive(data);
    worker.onerror = (event) => {
      event.preventDefault?.();
      this.breakAll(new PagedlmError("WORKER_FAILED",
        `the pagedlm worker failed: ${event.message || "it could not be started (is js/worker.js served next to index.js, with pkg/ beside js/?)"}`));
    };
    worker.onmessageerror = () => this.breakAll(new PagedlmError("WORKER_FAILED", "a message from the pagedlm worker could not be read"));
  }

  /** Fails every pending call and every later one with `error`; the worker is ended (the first time). */
  breakAll(error) {
    if (!this.broken) {
      this.unwatch?.abort();
      this.worker.terminate();
    }
    this.broken = error;
    for (const p of this.pending.values()) p.reject(error);
    this.pending.clear();
  }

  /**
   * Waits for the Web Lock the worker holds for its life (js/worker.js `holdLock`): granted
   * when the worker has ended without an error event (closed, or stopped by the browser for its
   * memory), then every pending call fails with WORKER_FAILED. No-op without Web Locks.
   */
  watch(lock) {
    if (this.unwatch || !globalThis.navigator?.locks) return;
    this.unwatch = new AbortController();
    navigator.locks.request(lock, { signal: this.unwatch.signal }, () => {
      this.breakAll(new PagedlmError("WORKER_FAILED", "the pagedlm worker ended (stopped by the browser, out of memory?); create a new engine"));
    }).catch(() => { /* the page ended the worker itself */ });
  }

  /** @param {import("./protocol.js").FromWorkerMessage} data */
  receive(data) {
    if (data.type === "devicelost") {
      this.onDeviceLost?.(data.message);
      return;
    }
    const p = this.pending.get(data.id);
    if (!p) return;
    if (data.type === "result") {
      this.pending.delete(data.id);
      p.resolve(data.value);
    } else if (data.type === "error") {
      this.pending.delete(data.id);
      p.reject(new PagedlmError(data.error.code, data.error.message));
    } else if (data.type === "done") {
      this.pending.delete(data.id);
      p.onMessage?.(data);
      p.resolve(data);
    } else {
      p.onMessage?.(data);
    }
  }

  /**
   * Sends `message` (from `toWorker`) with a fresh id; resolves with the result (or the `done`
   * message). Messages with that id other than the answer go to `onMessage`.
   */
  send(message, onMessage, transfer = []) {
    if (this.broken) return { id: 0, promise: Promise.reject(this.broken) };
    const id = this.next++;
    const promise = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, onMessage }));
    try {
      this.worker.postMessage({ ...message, id }, transfer);
    } catch (e) {
      // A value no Worker can receive (a function, a symbol, a BigInt inside an object...).
      const refused = e?.name === "DataCloneError" ? invalid(`a parameter holds a value that cannot be sent to the engine's worker: ${e.message}`) : e;
      this.pending.get(id).reject(refused);
      this.pending.delete(id);
    }
    return { id, promise };
  }

  call(message, onMessage) {
    return this.send(message, onMessage).promise;
  }
}

/**
 * Messages as OpenAI's SDK types them, for the engine: `content` a string or an array of text
 * parts (joined; image, audio and file parts are UNSUPPORTED), the `developer` role as `system`,
 * an assistant message's `tool_calls` (its `content` may then be null) and `reasoning_content`,
 * and a `tool` message's `tool_call_id` passed on.
 */
function checkMessages(messages) {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw invalid("messages must be a non-empty array of {role, content}");
  }
  return messages.map((m, i) => {
    if (!m || typeof m.role !== "string") {
      throw invalid(`messages[${i}] must be {role: string, content: string | text parts}`);
    }
    const role = m.role === "developer" ? "system" : m.role;
    const calls = role === "assistant" && m.tool_calls != null ? checkToolCalls(m.tool_calls, i) : null;
    const content = calls && m.content == null ? null : messageText(m.content, i);
    const out = { role, content };
    if (calls) out.tool_calls = calls;
    if (role === "assistant" && m.reasoning_content != null) {
      if (typeof m.reasoning_content !== "string") throw invalid(`messages[${i}].reasoning_content must be a string`);
      out.reasoning_content = m.reasoning_content;
    }
    if (role === "tool") {
      if (typeof m.tool_call_id !== "string") throw invalid(`messages[${i}] (tool) needs tool_call_id: string`);
      out.tool_call_id = m.tool_call_id;
    }
    return out;
  });
}

/** An assistant message's `tool_calls`: `[{id, type: "function", function: {name, arguments}}]`. */
function checkToolCalls(calls, i) {
  if (!Array.isArray(calls)) throw invalid(`messages[${i}].tool_calls must be an array`);
  return calls.map((c, j) => {
    const f = c?.function;
    if (!c || typeof c.id !== "string" || (c.type ?? "function") !== "function" || typeof f?.name !== "string" || typeof f.arguments !== "string") {
      throw invalid(`messages[${i}].tool_calls[${j}] must be {id, type: "function", function: {name, arguments: string}}`);
    }
    return { id: c.id, type: "function", function: { name: f.name, arguments: f.arguments } };
  });
}

function messageText(content, i) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw invalid(`messages[${i}].content must be a string or an array of {type: "text", text} parts`);
  return content
    .map((part, j) => {
      if (part && part.type === "text" && typeof part.text === "string") return part.text;
      if (part && typeof part.type === "string" && part.type !== "text") {
        throw new PagedlmError("UNSUPPORTED", `messages[${i}].content[${j}]: ${part.type} parts are not supported (text only)`);
      }
      throw invalid(`messages[${i}].content[${j}] must be {type: "text", text: string}`);
    })
    .join("");
}

function abortError(signal) {
  const reason = signal?.reason;
  const why = reason instanceof Error ? `: ${reason.message}` : typeof reason === "string" ? `: ${reason}` : "";
  return new PagedlmError("ABORTED", `the request was aborted${why}`);
}

/** The parameters the package handles itself: `stream` a boolean, `stream_options` an object, `signal` an AbortSignal (each may be null). */
function checkRequestParams({ stream, stream_options: streamOptions, signal }) {
  if (stream != null && typeof stream !== "boolean") throw invalid("stream must be a boolean");
  if (streamOptions != null && (typeof streamOptions !== "object" || Array.isArray(streamOptions))) throw invalid("stream_options must be an object ({include_usage})");
  if (signal != null && !(typeof signal.aborted === "boolean" && typeof signal.addEventListener === "function" && typeof signal.removeEventListener === "function")) {
    throw invalid("signal must be an AbortSignal");
  }
}

function checkPrompt(prompt) {
  if (typeof prompt !== "string") throw invalid("prompt must be a string (completion mode takes one raw-text prompt)");
  return prompt;
}

let completionCounter = 0;
/** How a reply of calls starts in each family's format: Hermes/Qwen, Phi-4-mini, Llama 3.x's bare JSON. */
const TOOL_CALL_OPENERS = Object.freeze(["<tool_call>", "<|tool_call|>", "{"]);

/**
 * The OpenAI shapes of one kind of request: chat (`chat.completion`, text in `delta.content`
 * and `message.content`) or completion mode (`text_completion`, text in `text`).
 */
const SHAPES = Object.freeze({
  chat: {
    idPrefix: "chatcmpl",
    chunkObject: "chat.completion.chunk",
    object: "chat.completion",
    /** The choice of the chunk before the first token, or null for none. */
    first: () => ({ delta: { role: "assistant", content: "" } }),
    /** The choice of a chunk carrying `text` (undefined: none, as on the last chunk). */
    choice: (text) => (text === undefined ? { delta: {} } : { delta: { content: text } }),
    /** The choice of a chunk carrying a reasoning model's reasoning (vLLM's and llama.cpp's field). */
    reasoning: (text) => ({ delta: { reasoning_content: text } }),
    final: (text, calls, reasoning) => {
      const message = calls ? { role: "assistant", content: null, tool_calls: calls, refusal: null } : { role: "assistant", content: text, refusal: null };
      if (reasoning != null) message.reasoning_content = reasoning;
      return { message };
    },
    /** The choice of the chunk carrying a reply's tool calls. */
    calls: (calls) => ({ delta: { tool_calls: calls.map((c, index) => ({ index, ...c })) } }),
  },
  completion: {
    idPrefix: "cmpl",
    chunkObject: "text_completion",
    object: "text_completion",
    first: () => null,
    choice: (text) => ({ text: text ?? "" }),
    final: (text) => ({ text }),
  },
});

/** One `create` call in flight: gathers chunks for the stream and the final completion. */
class Request {
  constructor(engine, params, shape = SHAPES.chat) {
    this.model = engine.model;
    this.shape = shape;
    this.id = `${shape.idPrefix}-${Date.now().toString(36)}${(completionCounter++).toString(36)}`;
    this.created = Math.floor(Date.now() / 1000);
    this.includeUsage = !!params.stream_options?.include_usage;
    this.content = "";
    /** The reasoning streamed so far (a reasoning model's think block). */
    this.reasoning = "";
    this.chunks = [];
    this.waiters = [];
    this.finished = false;
    this.error = null;
    this.completion = null;
    this.promptTokens = 0;
    this.completionTokens = 0;
    /**
     * With tools offered, streamed text is held back while it may still be the start of a tool
     * call (`<tool_call>`, `<|tool_call|>` or `{`, by family): a reply of calls streams as
     * `delta.tool_calls`, never as content.
     */
    this.held = shape === SHAPES.chat && params.tools != null && params.tool_choice !== "none" ? "" : null;
    /** "queued" until the engine takes it, "running", then "done". */
    this.state = "queued";
  }

  /** A stream chunk carrying `text` (undefined: none, as on the last chunk). */
  chunk(text, finishReason = null, extra = {}) {
    return this.chunkOf(this.shape.choice(text), finishReason, extra);
  }

  chunkOf(choice, finishReason = null, extra = {}) {
    return {
      id: this.id,
      object: this.shape.chunkObject,
      created: this.created,
      model: this.model,
      choices: [{ index: 0, ...choice, logprobs: null, finish_reason: finishReason }],
      ...extra,
    };
  }

  push(chunk) {
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve({ value: chunk, done: false });
    else this.chunks.push(chunk);
  }

  /** A message of this request's stream (js/protocol.js `fromWorker`). */
  onMessage(data) {
    if (data.type === "queued") {
      this.promptTokens = data.prompt_tokens;
    } else if (data.type === "begin") {
      this.state = "running";
      this.promptTokens = data.prompt_tokens;
    } else if (data.type === "start") {
      this.promptTokens = data.prompt_tokens;
      const first = this.shape.first();
      if (first) this.push(this.chunkOf(first));
    } else if (data.type === "token") {
      this.completionTokens += 1;
      if (data.reasoning && this.shape.reasoning) {
        this.reasoning += data.reasoning;
        this.push(this.chunkOf(this.shape.reasoning(data.reasoning)));
      }
      if (data.text) this.stream(data.text);
    }
  }

  /** Streams `text` as content, unless it is (still possibly) a tool call being held back. */
  stream(text) {
    if (this.held !== null) {
      this.held += text;
      const start = this.held.trimStart();
      if (TOOL_CALL_OPENERS.some((open) => start.startsWith(open) || open.startsWith(start))) return;
      [text, this.held] = [this.held, null];
    }
    this.content += text;
    this.push(this.chunk(text));
  }

  finish(done) {
    const r = done.result;
    const usage = {
      prompt_tokens: r.prompt_tokens.length,
      completion_tokens: r.tokens.length,
      total_tokens: r.prompt_tokens.length + r.tokens.length,
      prefix_hit_tokens: r.prefix_hit_tokens ?? 0,
      // OpenAI's names for predicted outputs: draft tokens (a prediction's or prompt lookup's)
      // the reply took and those it did not.
      completion_tokens_details: {
        accepted_prediction_tokens: r.accepted_prediction_tokens ?? 0,
        rejected_prediction_tokens: r.rejected_prediction_tokens ?? 0,
      },
    };
    const details = {
      finish_reason: r.finish_reason,
      prefix_hit_tokens: r.prefix_hit_tokens ?? 0,
      prefill_tokens: r.prefill_tokens ?? r.prompt_tokens.length,
      ttft_ms: r.ttft_ms,
      prefill_ms: r.prefill_ms,
      decode_ms: r.decode_ms,
      queue_ms: r.queue_ms,
      blocks: r.blocks ?? null,
      stats: done.stats,
      warning: r.warning ?? null,
    };
    if (r.finish_reason === "abort") {
      this.fail(new PagedlmError("ABORTED", "the request was aborted", { partial: { content: r.text, usage, pagedlm: details } }));
      return;
    }
    const calls = r.finish_reason === "tool_calls" ? r.tool_calls : null;
    this.completion = {
      id: this.id,
      object: this.shape.object,
      created: this.created,
      model: this.model,
      choices: [{ index: 0, ...this.shape.final(r.text, calls, r.reasoning_content), logprobs: null, finish_reason: r.finish_reason }],
      usage,
      pagedlm: details,
    };
    // The engine holds back the end of a reasoning block that may be the start of its closing
    // marker; a reply that ended there gets it now, so the stream adds up to the message.
    const reasoning = r.reasoning_content ?? "";
    if (this.shape.reasoning && reasoning.length > this.reasoning.length && reasoning.startsWith(this.reasoning)) {
      this.push(this.chunkOf(this.shape.reasoning(reasoning.slice(this.reasoning.length))));
    }
    if (calls) {
      this.push(this.chunkOf(this.shape.calls(calls)));
    } else if (this.held) {
      // Held back as a possible call, but the reply ended as text (cut short, or not a call).
      this.push(this.chunk(this.held));
    }
    this.held = null;
    // Text that a stop string cut off was streamed already; the completion's text is the truth.
    this.push(this.chunk(undefined, r.finish_reason, { pagedlm: details }));
    if (this.includeUsage) this.push({ ...this.chunk(undefined), choices: [], usage });
    this.end();
  }

  fail(error) {
    if (this.finished) return;
    this.state = "done";
    this.error = error;
    this.finished = true;
    for (const w of this.waiters.splice(0)) w.reject(error);
  }

  end() {
    this.finished = true;
    this.state = "done";
    for (const w of this.waiters.splice(0)) w.resolve({ value: undefined, done: true });
  }

  nextChunk() {
    if (this.chunks.length > 0) return Promise.resolve({ value: this.chunks.shift(), done: false });
    if (this.error) return Promise.reject(this.error);
    if (this.finished) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }
}

/** What `create({stream: true})` returns: an async iterable of chunks, as OpenAI's SDK does. */
class ChatCompletionStream {
  #request;
  #cancel;
  #done;
  constructor(request, cancel, done) {
    this.#request = request;
    this.#cancel = cancel;
    this.#done = done;
  }

  /** Stops the request (the iterator then throws an ABORTED error). */
  abort() {
    this.#cancel();
  }

  /** The whole completion (with usage) once the stream has ended. */
  finalCompletion() {
    return this.#done;
  }

  /**
   * Where the request stands: {request, state: "queued"|"running"|"done", prompt_tokens,
   * completion_tokens}; `request` matches `engine.stats().running[].request`.
   */
  progress() {
    const r = this.#request;
    return { request: r.channelId, state: r.state, prompt_tokens: r.promptTokens, completion_tokens: r.completionTokens };
  }

  [Symbol.asyncIterator]() {
    return {
      next: () => this.#request.nextChunk(),
      // `break` out of `for await`: stop generating, the reader no longer wants the tokens.
      return: async () => {
        if (!this.#request.finished) this.#cancel();
        return { value: undefined, done: true };
      },
    };
  }
}

/** The text and usage a request had when its device was lost, on its DEVICE_LOST error. */
function lostWith(error, request) {
  if (error.code !== "DEVICE_LOST") return error;
  const content = request.content + (request.held ?? "");
  const usage = {
    prompt_tokens: request.promptTokens,
    completion_tokens: request.completionTokens,
    total_tokens: request.promptTokens + request.completionTokens,
    // The engine's counts went with the device.
    completion_tokens_details: { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
  };
  return new PagedlmError("DEVICE_LOST", error.message, { partial: { content, usage } });
}

/**
 * A model loaded in a Worker. Create it with {@link createEngine}. An `EventTarget`: it
 * dispatches `devicelost` (a `CustomEvent` whose `detail` is `{message}`) once when its GPU
 * device is lost; `restart()` then loads the model again on a new device.
 */
export class Engine extends EventTarget {
  #channel;
  #worker;
  #disposed = false;
  #lost = false;

  constructor(worker, channel, loaded) {
    super();
    this.#worker = worker;
    this.#channel = channel;
    this.#loaded(loaded);
    channel.onDeviceLost = (message) => {
      if (this.#lost) return;
      this.#lost = true;
      this.dispatchEvent(new CustomEvent("devicelost", { detail: { message } }));
    };
    this.chat = { completions: { create: (params) => this.#create(params, SHAPES.chat) } };
    /** Completion mode (OpenAI's legacy completions): raw text in, its continuation out. */
    this.completions = { create: (params) => this.#create(params, SHAPES.completion) };
  }

  #loaded(loaded) {
    /** Adapter, model shape, KV layout and memory, fixed at load. */
    this.info = loaded.info;
    /** How the model was loaded: {source: "network"|"cache"|"file"|"buffer", storage: "opfs"|"cache"|null, bytes, files, download_ms, engine_ms}. */
    this.load = loaded.load;
    this.model = loaded.info?.model?.name || "pagedlm";
  }

  /** Whether the GPU device is lost: requests fail with DEVICE_LOST until `restart()`. */
  get lost() {
    return this.#lost;
  }

  /**
   * After a `devicelost` event: loads the model again on a new GPU device, from where its bytes
   * came (browser storage or the File: no new download, except for a URL loaded with
   * `cache: false`), or from `model` when given. An engine loaded from an ArrayBuffer needs
   * `model` (the worker does not keep a second copy of the bytes). Cached prefixes are gone with
   * the old device; conversations continue (their prompts are computed again, or imported from
   * snapshots). Resolves to the engine, with `info` and `load` of the new load; `onProgress`
   * reports as at `createEngine`.
   */
  async restart({ onProgress, model } = {}) {
    this.#alive();
    const report = (data) => {
      if (data.type === "progress" && onProgress) onProgress({ ...data.progress, fraction: data.progress.total ? data.progress.loaded / data.progress.total : null });
    };
    const source = model === undefined || model === null ? undefined : modelSource(model);
    this.#loaded(await this.#channel.call(toWorker.restart(source), report));
    this.#lost = false;
    return this;
  }

  /**
   * Destroys the engine's GPU device as a driver reset would lose it, to test how an app
   * recovers (what `WEBGL_lose_context.loseContext()` is to WebGL): running and queued requests
   * end with DEVICE_LOST and `devicelost` is dispatched.
   */
  async simulateDeviceLoss() {
    this.#alive();
    await this.#channel.call(toWorker.simulateDeviceLoss());
  }

  #alive() {
    if (this.#disposed) throw new PagedlmError("DISPOSED", "this engine was disposed");
  }

  #create(params, shape) {
    try {
      this.#alive();
      if (!params || typeof params !== "object") throw invalid("create(params): params must be an object");
      checkRequestParams(params);
      const message = shape === SHAPES.chat
        ? toWorker.create(checkMessages(params.messages), requestOptions(params, true))
        : toWorker.complete(checkPrompt(params.prompt), requestOptions(params));
      const { signal } = params;
      if (signal?.aborted) throw abortError(signal);

      const request = new Request(this, params, shape);
      const sent = this.#channel.send(message, (data) => request.onMessage(data));
      request.channelId = sent.id;
      let onAbort = null;
      const cancel = () => this.#worker.postMessage(toWorker.abort(sent.id));
      if (signal) {
        onAbort = cancel;
        signal.addEventListener("abort", onAbort, { once: true });
      }
      const done = sent.promise
        .then((message) => request.finish(message), (error) => request.fail(error.code === "ABORTED" && signal?.aborted ? abortError(signal) : lostWith(error, request)))
        .then(() => {
          if (request.error) throw request.error;
          return request.completion;
        })
        .finally(() => signal?.removeEventListener("abort", onAbort));
      if (params.stream) {
        // The stream reports failures through its iterator; keep `done` from being an unhandled rejection.
        done.catch(() => {});
        return Promise.resolve(new ChatCompletionStream(request, cancel, done));
      }
      return done;
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * The KV pool now: {pool, prefix, block_states, refcounts, sequences, sched, running, queued}.
   * While requests run, it is the snapshot after the engine's last step.
   */
  async stats() {
    this.#alive();
    return this.#channel.call(toWorker.stats());
  }

  /**
   * A KV snapshot of a conversation, to keep it across a page reload or hand it to another
   * engine: `messages` ([{role, content}], the history so far, typically ending with the
   * assistant's reply) rendered with the chat template without the generation prompt, their
   * token ids and K/V blocks, fingerprinted by model and KV format, with a checksum. Computes
   * whatever part is not cached yet. Runs between engine steps, so it may wait for one.
   * @returns {Promise<Uint8Array>}
   */
  async exportConversation(messages) {
    this.#alive();
    const { bytes } = await this.#channel.call(toWorker.exportConversation(checkMessages(messages)));
    return bytes;
  }

  /**
   * Loads a snapshot from `exportConversation` into the prefix cache: the next request whose
   * messages continue that conversation reuses its K/V (see `usage.prefix_hit_tokens`).
   * Resolves to `{tokens}` (how many tokens it holds). Rejects with SNAPSHOT_MISMATCH (another
   * model, KV dtype, layout, block size or format version) or SNAPSHOT_CORRUPT (damaged bytes);
   * a refused snapshot changes nothing.
   * @param {Uint8Array | ArrayBuffer} bytes
   */
  async importConversation(bytes) {
    this.#alive();
    let view;
    if (bytes instanceof ArrayBuffer) view = new Uint8Array(bytes);
    else if (ArrayBuffer.isView(bytes)) view = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    else throw invalid("importConversation(bytes): bytes must be a Uint8Array or an ArrayBuffer");
    return this.#channel.call(toWorker.importConversation(view));
  }

  /**
   * Where the time goes: one prefill of `promptTokens` tokens (default 512) and one steady-state
   * decode step after it, measured in the worker on an idle engine (BUSY while requests run;
   * requests sent meanwhile wait). Per-kernel GPU times come from timestamp queries where the
   * device has them (`method: "timestamps"`), else each kernel runs alone on the host clock;
   * `options.timestamps: false` asks for the latter. Resolves to the engine's profile, the
   * object `pagedlm profile` prints.
   */
  async profile(promptTokens = 512, options = {}) {
    this.#alive();
    if (!Number.isInteger(promptTokens) || promptTokens < 1) throw invalid("profile(promptTokens): promptTokens must be a positive integer");
    return this.#channel.call(toWorker.profile(promptTokens, options ?? {}));
  }

  /** Drops cached prefixes; their blocks return to the free list. */
  async resetCache() {
    this.#alive();
    return this.#channel.call(toWorker.resetCache());
  }

  /** Stops everything, frees the GPU memory and ends the worker. Later calls fail with DISPOSED. */
  async dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    // A failed worker (WORKER_FAILED) is gone already: nothing to free.
    if (this.#channel.broken) return;
    try {
      await this.#channel.call(toWorker.dispose());
    } finally {
      // Ends the worker too.
      this.#channel.breakAll(new PagedlmError("DISPOSED", "this engine was disposed"));
    }
  }
}

/**
 * Loads a model in a new Web Worker.
 * @param model a URL (string or URL; a split GGUF by its first part, `name-00001-of-0000N.gguf`), an ArrayBuffer/typed
 *   array, a File/Blob (e.g. a dropped .gguf) or an OPFS FileSystemFileHandle. A URL is downloaded into browser storage
 *   (OPFS, resumable; the Cache API where OPFS is missing) and loaded from there by ranges.
 * @param options {kvDtype, blockSize, poolTokens, maxContext, prefillChunk, kvLayout, prefixCache, maxBatch, stepTokens,
 *   maxBindingMib, deviceLimits, maxMemoryBytes, adapterClass, optionalFeatures, backend ("auto" (default) | "webgpu" | "cpu"),
 *   onProgress({phase, loaded, total, fraction, ...}), cache (default true; false: no storage), cacheName, workerUrl}
 */
export async function createEngine(model, options = {}) {
  const { engineOptions, onProgress, store, workerUrl } = splitOptions(options, "createEngine");
  const source = modelSource(model);
  if (store.enabled && typeof source === "string") askPersistence();
  const worker = startWorker(workerUrl);
  const channel = new Channel(worker);
  const lock = `pagedlm-worker-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  const report = (data) => {
    if (data.type === "held") channel.watch(lock);
    if (data.type !== "progress" || !onProgress) return;
    const p = data.progress;
    try {
      onProgress({ ...p, fraction: p.total ? p.loaded / p.total : null });
    } catch (e) {
      console.error("pagedlm: onProgress threw", e);
    }
  };
  try {
    const loaded = await channel.call(toWorker.load(source, engineOptions, store, lock), report);
    return new Engine(worker, channel, loaded);
  } catch (e) {
    channel.breakAll(e);
    throw e;
  }
}

/**
 * The memory a load of `model` with `options` would take, and whether this device offers it,
 * from the file's header alone (a URL: one range request of its first 4 MiB, more only when the
 * header is longer; a File: a slice), in a short-lived worker. Resolves to the engine's estimate:
 * {complete: true, fits, backend, weights_bytes, kv_bytes_per_token, kv_tokens, kv_bytes,
 * activations_bytes, total_bytes, largest_buffer_bytes, limits, reasons}. The limits are the
 * WebGPU adapter's buffer limits and a memory budget: `options.maxMemoryBytes`, else
 * `navigator.deviceMemory` where the browser tells it; `options.limits` ({maxBufferSize,
 * maxStorageBufferBindingSize, memoryBytes}) overrides any of them (another device's, say).
 */
export async function estimateMemory(model, options = {}) {
  const { engineOptions, store, workerUrl } = splitOptions(options, "estimateMemory", [...ENGINE_OPTIONS, ...ESTIMATE_OPTIONS]);
  const source = modelSource(model, "estimateMemory(model)");
  const channel = new Channel(startWorker(workerUrl));
  try {
    return await channel.call(toWorker.estimate(source, engineOptions, store));
  } finally {
    channel.breakAll(new PagedlmError("DISPOSED", "the estimate has ended"));
  }
}

/**
 * The models in browser storage: [{url, bytes, complete, storage: "opfs"|"cache", parts}] (a split
 * model once, by its first part's URL). A download that was cut is listed with complete: false;
 * loading its URL again resumes it.
 */
export async function listCachedModels({ cacheName = DEFAULT_STORE } = {}) {
  return listStored(cacheName);
}

/**
 * Deletes the model at `url` (every part of a split one, a partial download too) from browser
 * storage. Resolves to whether anything was stored; rejects with BUSY while it downloads.
 */
export async function deleteCachedModel(url, { cacheName = DEFAULT_STORE } = {}) {
  if (typeof url !== "string" && !(url instanceof URL)) throw invalid("deleteCachedModel(url): url must be a string or URL");
  try {
    return await deleteStored(absoluteUrl(url), cacheName);
  } catch (e) {
    throw e instanceof PagedlmError ? e : new PagedlmError(typeof e?.code === "string" ? e.code : "INTERNAL", e?.message ?? String(e));
  }
}
