// The messages between the page (js/index.js) and the engine's Worker (js/worker.js), and the
// option names each side passes on to the wasm engine. Both sides build every message with the
// constructors here, so a message's shape is written once.
//
// Page -> worker: every message carries the `id` the page's channel gives it; replies and a
// request's stream carry the same id. Worker -> page: `result` and `error` answer a message;
// `progress` streams a load; `queued`, `begin`, `start`, `token` then `done` (or `error`)
// stream one request (chat or completion).

/** Options of `createEngine` that go to the wasm engine (`WebEngine.load`). */
export const ENGINE_OPTIONS = Object.freeze(["kvDtype", "kvLayout", "blockSize", "poolTokens", "maxContext", "prefillChunk", "prefixCache", "maxBatch", "stepTokens", "maxBindingMib", "deviceLimits", "maxMemoryBytes", "adapterClass", "optionalFeatures", "backend", "speculative", "maxDraft"]);
/** Options of `estimateMemory` only that go to the wasm engine (`WebEngine.estimateMemory`; loads ignore them). */
export const ESTIMATE_OPTIONS = Object.freeze(["limits"]);
/** Options of `createEngine` that js/index.js handles itself. */
export const PACKAGE_OPTIONS = Object.freeze(["onProgress", "cache", "cacheName", "downloadStallMs", "workerUrl"]);
/** Parameters of `chat.completions.create` and `completions.create` that go to the wasm engine (`WebEngine.submit`, `submitPrompt`). */
export const REQUEST_OPTIONS = Object.freeze(["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty", "response_format", "grammar", "speculative", "prediction"]);
/** Engine options only chat requests take (a raw-text completion cannot offer tools). */
export const CHAT_OPTIONS = Object.freeze(["tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"]);
/** Parameters of `chat.completions.create` that js/index.js handles itself. */
export const REQUEST_PARAMS = Object.freeze(["messages", "stream", "stream_options", "signal"]);
/** Parameters of `completions.create` (completion mode) that js/index.js handles itself. */
export const COMPLETION_PARAMS = Object.freeze(["prompt", "stream", "stream_options", "signal"]);

/** The engine's share of `params`: the `REQUEST_OPTIONS` (and for `chat`, `CHAT_OPTIONS`) that are set. */
export function requestOptions(params, chat = false) {
  const options = {};
  for (const k of chat ? [...REQUEST_OPTIONS, ...CHAT_OPTIONS] : REQUEST_OPTIONS) if (params[k] !== undefined && params[k] !== null) options[k] = params[k];
  return options;
}

/**
 * @typedef {{role: string, content: string | null, tool_calls?: ToolCall[], tool_call_id?: string, reasoning_content?: string}} ChatMessage
 * @typedef {{id: string, type: "function", function: {name: string, arguments: string}}} ToolCall
 * @typedef {{code: string, message: string}} ErrorBody
 * @typedef {{enabled: boolean, name: string, stallMs?: number}} CacheOptions  `name`: the OPFS folder and Cache API cache models are stored in (js/storage.js); `stallMs`: how long a download may receive nothing
 * @typedef {{phase: string, loaded?: number, total?: number, resumed_from?: number, part?: number, parts?: number, note?: string, storage?: string}} Progress
 * @typedef {string | ArrayBuffer | ArrayBufferView | Blob | FileSystemFileHandle} ModelSource  a URL (absolute), bytes, a File/Blob or an OPFS file handle
 *
 * @typedef {{type: "load", model: ModelSource, options: object, cache: CacheOptions, lock?: string}} LoadMessage  `lock`: a Web Lock the worker holds for its life
 * @typedef {{type: "estimate", model: ModelSource, options: object, cache: CacheOptions}} EstimateMessage  the memory a load would take, from the header (`WebEngine.estimateMemory`)
 * @typedef {{type: "create", messages: ChatMessage[], options: object}} CreateMessage
 * @typedef {{type: "complete", prompt: string, options: object}} CompleteMessage  raw text, no chat template
 * @typedef {{type: "abort", id: number}} AbortMessage  `id`: the `create` message's
 * @typedef {{type: "stats"}} StatsMessage
 * @typedef {{type: "resetCache"}} ResetCacheMessage
 * @typedef {{type: "dispose"}} DisposeMessage
 * @typedef {{type: "exportConversation", messages: ChatMessage[]}} ExportConversationMessage
 * @typedef {{type: "importConversation", bytes: Uint8Array}} ImportConversationMessage
 * @typedef {{type: "profile", promptTokens: number, options: {timestamps?: boolean}}} ProfileMessage
 * @typedef {{type: "restart", model?: ModelSource}} RestartMessage  a new engine on the lost one's model (from where it came, or `model`)
 * @typedef {{type: "simulateDeviceLoss"}} SimulateDeviceLossMessage
 * @typedef {(LoadMessage | EstimateMessage | CreateMessage | CompleteMessage | AbortMessage | StatsMessage | ResetCacheMessage | DisposeMessage
 *   | ExportConversationMessage | ImportConversationMessage | ProfileMessage
 *   | RestartMessage | SimulateDeviceLossMessage) & {id?: number}} ToWorkerMessage
 */

/** Page -> worker. The channel adds the `id`. */
export const toWorker = Object.freeze({
  /** @returns {LoadMessage} */
  load: (model, options, cache, lock) => ({ type: "load", model, options, cache, lock }),
  /** @returns {EstimateMessage} */
  estimate: (model, options, cache) => ({ type: "estimate", model, options, cache }),
  /** @returns {CreateMessage} */
  create: (messages, options) => ({ type: "create", messages, options }),
  /** @returns {CompleteMessage} */
  complete: (prompt, options) => ({ type: "complete", prompt, options }),
  /** Stops the request that `create` (or `complete`) message `id` started. @returns {AbortMessage} */
  abort: (id) => ({ type: "abort", id }),
  /** @returns {StatsMessage} */
  stats: () => ({ type: "stats" }),
  /** @returns {ResetCacheMessage} */
  resetCache: () => ({ type: "resetCache" }),
  /** @returns {DisposeMessage} */
  dispose: () => ({ type: "dispose" }),
  /** @returns {ExportConversationMessage} */
  exportConversation: (messages) => ({ type: "exportConversation", messages }),
  /** @returns {ImportConversationMessage} */
  importConversation: (bytes) => ({ type: "importConversation", bytes }),
  /** @returns {ProfileMessage} */
  profile: (promptTokens, options) => ({ type: "profile", promptTokens, options }),
  /** @returns {RestartMessage} */
  restart: (model) => ({ type: "restart", model }),
  /** @returns {SimulateDeviceLossMessage} */
  simulateDeviceLoss: () => ({ type: "simulateDeviceLoss" }),
});

/**
 * @typedef {{type: "progress", id: number, progress: Progress}} ProgressMessage
 * @typedef {{type: "result", id: number, value: any}} ResultMessage
 * @typedef {{type: "error", id: number, error: ErrorBody}} ErrorMessage
 * @typedef {{type: "queued", id: number, prompt_tokens: number}} QueuedMessage  submitted to the engine
 * @typedef {{type: "begin", id: number, prompt_tokens: number, prefix_hit_tokens: number}} BeginMessage  admitted by the scheduler
 * @typedef {{type: "start", id: number, prompt_tokens: number}} StartMessage  before the first token
 * @typedef {{type: "token", id: number, text: string, reasoning?: string}} TokenMessage  `reasoning`: what the token adds to a reasoning reply's think block
 * @typedef {{type: "devicelost", message: string}} DeviceLostMessage  once per engine, with no id: its GPU device is gone
 * @typedef {{type: "held", id: number}} HeldMessage  on a load: the worker holds the load's lock (the page may now wait for it)
 * @typedef {{type: "done", id: number, result: object, stats: object}} DoneMessage  `result`: the engine's Generation plus queue_ms; `stats`: the pool right after
 * @typedef {ProgressMessage | ResultMessage | ErrorMessage | QueuedMessage | BeginMessage | StartMessage | TokenMessage | DoneMessage | DeviceLostMessage | HeldMessage} FromWorkerMessage
 */

/** `{code, message}` of a thrown value: a wasm error or a `fail(...)` keeps its code. @returns {ErrorBody} */
export function errorBody(e) {
  const code = typeof e?.code === "string" ? e.code : "INTERNAL";
  const message = (e && e.message) || String(e);
  return { code, message };
}

/** Worker -> page. */
export const fromWorker = Object.freeze({
  /** @returns {ProgressMessage} */
  progress: (id, progress) => ({ type: "progress", id, progress }),
  /** @returns {ResultMessage} */
  result: (id, value) => ({ type: "result", id, value }),
  /** `error`: an Error or anything thrown (see `errorBody`). @returns {ErrorMessage} */
  error: (id, error) => ({ type: "error", id, error: errorBody(error) }),
  /** @returns {QueuedMessage} */
  queued: (id, prompt_tokens) => ({ type: "queued", id, prompt_tokens }),
  /** @returns {BeginMessage} */
  begin: (id, prompt_tokens, prefix_hit_tokens) => ({ type: "begin", id, prompt_tokens, prefix_hit_tokens }),
  /** @returns {StartMessage} */
  start: (id, prompt_tokens) => ({ type: "start", id, prompt_tokens }),
  /** @returns {TokenMessage} */
  token: (id, text, reasoning) => (reasoning ? { type: "token", id, text, reasoning } : { type: "token", id, text }),
  /** @returns {DoneMessage} */
  done: (id, result, stats) => ({ type: "done", id, result, stats }),
  /** @returns {DeviceLostMessage} */
  deviceLost: (message) => ({ type: "devicelost", message }),
  /** @returns {HeldMessage} */
  held: (id) => ({ type: "held", id }),
});
