// Types of pagedlm's browser API (js/index.js).

export type ErrorCode =
  | "WEBGPU_UNAVAILABLE"
  | "MODEL_DOWNLOAD"
  | "MODEL_FORMAT"
  | "CONTEXT_OVERFLOW"
  | "KV_POOL_FULL"
  | "UNSUPPORTED"
  | "INVALID_ARGUMENT"
  | "ABORTED"
  | "BUSY"
  | "DISPOSED"
  | "WORKER_FAILED"
  | "GPU_ERROR"
  /** The GPU device was lost (a driver reset, memory reclaimed): the request ended with `partial`; `engine.restart()` recovers. */
  | "DEVICE_LOST"
  /** Past `maxMemoryBytes`, or an allocation the device refused: the engine stays usable for what fits. */
  | "OUT_OF_MEMORY"
  | "CALLBACK_ERROR"
  /** A KV snapshot made for another model, KV dtype, layout, block size or format version. */
  | "SNAPSHOT_MISMATCH"
  /** Bytes that are not an intact KV snapshot (truncated, altered, not a snapshot). */
  | "SNAPSHOT_CORRUPT"
  /** Browser storage has no room for the model (before its download, or while writing it): the message names the bytes. Nothing is left stored. */
  | "QUOTA_EXCEEDED"
  /** Reading the model's file failed during the load (a File changed or removed on disk, storage evicted). */
  | "MODEL_READ"
  | "INTERNAL";

/** Every failure pagedlm reports: an `Error` whose `code` says what kind, whose message says what to do. */
export declare class PagedlmError extends Error {
  readonly name: "PagedlmError";
  readonly code: ErrorCode;
  /**
   * On ABORTED after generation began: the text and usage up to the abort. On DEVICE_LOST: the
   * text and usage it had generated (`pagedlm` absent).
   */
  readonly partial?: { content: string; usage: CompletionUsage; pagedlm?: GenerationDetails };
  constructor(code: ErrorCode, message: string, extra?: object);
}

export interface LoadProgress {
  /**
   * "download": bytes from the network into storage (`resumed_from` when a cut download
   * continues, `note` when it starts over); "stored": the download is complete in storage;
   * "cache": the model was found whole in browser storage (its bytes are read as the engine
   * places them: the `upload` events count those reads); "load": the engine starts; "upload": weight
   * bytes read and placed (on the GPU, or in wasm memory for the CPU backend); "tokenizer";
   * "pipelines" (GPU kernels compiled); "ready".
   */
  phase: "download" | "stored" | "cache" | "load" | "upload" | "tokenizer" | "pipelines" | "ready";
  /** Bytes so far (absent for "tokenizer" and "pipelines"). */
  loaded?: number;
  total?: number;
  /** loaded / total, or null when the size is unknown or the phase has no bytes. */
  fraction: number | null;
  /** "download": where a resumed download continued from. */
  resumed_from?: number;
  /** "download": why a partial download was discarded and started over. */
  note?: string;
  /** A split model's part (1-based) and count, on "download" and "stored". */
  part?: number;
  parts?: number;
  /** "stored", "cache": where the model is kept. */
  storage?: "opfs" | "cache";
  message?: string;
}

export interface EngineOptions {
  /** KV precision: "f32" (default) or "int8". */
  kvDtype?: "f32" | "int8";
  /** "paged" (default) or "contiguous" (one reservation per sequence, the baseline). */
  kvLayout?: "paged" | "contiguous";
  /** Tokens per KV block (default 16). */
  blockSize?: number;
  /** Token slots in the KV pool (default: room for the longest sequence). */
  poolTokens?: number;
  /** Longest prompt + reply (default min(model context, 4096)). */
  maxContext?: number;
  /** Prompt tokens per prefill pass (default 512). */
  prefillChunk?: number;
  /** Reuse KV of shared prefixes across turns and conversations (default true). */
  prefixCache?: boolean;
  /** Continuous batching: most requests decoding together in one step (default 8). */
  maxBatch?: number;
  /** Most token rows (decode + prefill) per engine step (default 256). */
  stepTokens?: number;
  /**
   * Run as on a device whose largest storage buffer binding is this many MiB (default: what the
   * device offers; WebGPU guarantees 128). For testing that big matrices are split across bindings.
   */
  maxBindingMib?: number;
  /**
   * The limits the GPU device is created with: the adapter's (default), or `"phone"`: WebGPU's
   * default limits (what every device offers: 8 storage buffers per stage, 16 KiB of workgroup
   * storage) with buffers of at most 128 MiB, to try a page as a phone would run it.
   */
  deviceLimits?: "adapter" | "phone";
  /**
   * Cap on the GPU memory the engine holds: weights, KV pool and a step's activations. The KV
   * pool shrinks to fit (unless `poolTokens` is given); a model that cannot fit is refused at load
   * with OUT_OF_MEMORY, and a request whose step would need more fails with OUT_OF_MEMORY while
   * the engine keeps serving what fits. `engine.stats().memory` says what it holds.
   */
  maxMemoryBytes?: number;
  /**
   * Tune the kernels as for this kind of adapter (default: the adapter's own). For comparing
   * variants; every variant computes the same results.
   */
  adapterClass?: "cpu" | "integrated" | "discrete";
  /** Use the adapter's optional WebGPU features (subgroups, shader-f16) where offered (default true). */
  optionalFeatures?: boolean;
  /**
   * Which backend runs the model (default "auto"): "cpu" runs it on CPU kernels in wasm (no
   * device; the same KV cache, snapshots and results), "auto" takes WebGPU on a real GPU and the
   * CPU backend when there is no adapter or the adapter is a CPU emulation. `info.backend` and
   * `info.backend_reason` say which runs and why.
   */
  backend?: "auto" | "webgpu" | "cpu";
  onProgress?: (progress: LoadProgress) => void;
  /**
   * Keep a downloaded model in browser storage so a reload does not download it again, and a cut
   * download resumes (default true): OPFS, else the Cache API (whole responses only). false: the
   * download goes into a Blob and nothing is stored.
   */
  cache?: boolean;
  /** The OPFS folder and Cache API cache models are kept in (default "pagedlm-models-v1"). */
  cacheName?: string;
  /**
   * A download that receives nothing for this long (default 30000 ms) has stalled: it is asked
   * again from the byte it reached (a Range request, into OPFS), up to 3 times in a row, then fails
   * with MODEL_DOWNLOAD. Without OPFS (nothing to resume into) the first stall fails it.
   */
  downloadStallMs?: number;
  /** Where js/worker.js is served, if not next to this module. */
  workerUrl?: string | URL;
  /**
   * Speculative decoding: "auto" drafts tokens by prompt lookup and from a request's
   * `prediction`, verifies them in one step with the next token and keeps the draft where it is
   * right (the same tokens as "off"; faster where the reply copies text it was given), and stops
   * drafting for a while where drafts are not taken (default "auto"); "off": one token per step.
   * A request's own `speculative` wins.
   */
  speculative?: "auto" | "off";
  /**
   * Most draft tokens per sequence and step (default 15): a draft that follows a `prediction`
   * the reply agrees with may be this long; prompt lookup drafts at most 7.
   */
  maxDraft?: number;
}

/** A text part of a message's content, as OpenAI's SDK types it (other parts are UNSUPPORTED). */
export interface ChatContentPartText {
  type: "text";
  text: string;
}

/** Another kind of content part (image, audio, file): refused with `UNSUPPORTED`. */
export interface ChatContentPartOther {
  type: string;
}

/** A call of a function, in a reply or in an assistant message of the history. */
export interface ToolCall {
  id: string;
  type: "function";
  /** `arguments`: a JSON text. */
  function: { name: string; arguments: string };
}

export interface ChatMessage {
  /** `developer` is taken as `system`; `tool` answers a call (`tool_call_id`). */
  role: "system" | "developer" | "user" | "assistant" | "tool" | string;
  /** Text, or text parts (joined); null on an assistant message that holds `tool_calls`. */
  content?: string | (ChatContentPartText | ChatContentPartOther)[] | null;
  /** An assistant message's calls, written back into the conversation (function calls only). */
  tool_calls?: (ToolCall | { id: string; type: string })[];
  /** A `tool` message: the call it answers. */
  tool_call_id?: string;
  /** An assistant reply's reasoning, as a reasoning model's reply returned it (templates that keep it, Qwen3's, write it back). */
  reasoning_content?: string | null;
}

/** A function the model may call (OpenAI's function tool; other kinds are refused). */
export interface FunctionTool {
  type: "function";
  function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean | null };
}

/** Another kind of tool (OpenAI's custom tools): refused with `INVALID_ARGUMENT`. */
export interface OtherTool {
  type: string;
}

/** Another tool choice (OpenAI's `allowed_tools`, custom tools): refused with `INVALID_ARGUMENT`. */
export interface OtherToolChoice {
  type: string;
}

/**
 * Which calls a reply may hold: `auto` (text or calls, the default), `none` (text; the tools are
 * not offered), `required` (one call or more), or one named function.
 */
export type ToolChoice = "auto" | "none" | "required" | { type: "function"; function: { name: string } };

export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; json_schema: { name: string; description?: string; schema?: Record<string, unknown>; strict?: boolean | null } };

/** Null for a parameter means "not set", as in OpenAI's SDK; other OpenAI parameters (`model`, ...) are ignored. */
export interface ChatCompletionCreateParams {
  messages: ChatMessage[];
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean } | null;
  max_tokens?: number | null;
  /** 0 = greedy. */
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number;
  repetition_penalty?: number;
  seed?: number | null;
  stop?: string | string[] | null;
  /**
   * Structured output: `{type: "json_object"}` (any JSON object) or `{type: "json_schema",
   * json_schema: {name, schema, strict}}` (JSON valid against `schema`); `{type: "text"}` is none.
   * An invalid schema is refused with `INVALID_ARGUMENT` and the reason.
   */
  response_format?: ResponseFormat;
  /** The output matches this grammar (llguidance's Lark syntax); not with `response_format`. */
  grammar?: string;
  /** Whether this request drafts (the engine's `speculative` otherwise). */
  speculative?: "auto" | "off";
  /**
   * OpenAI's predicted outputs: text the reply is expected to be (a file being edited, say);
   * drafted from and followed as the reply advances. The reply is the same with or without it;
   * `usage.completion_tokens_details` counts its tokens taken and refused.
   */
  prediction?: { type: "content"; content: string | ChatContentPartText[] } | null;
  /**
   * Functions the model may call: a reply of calls has `message.tool_calls` (arguments valid
   * against each function's `parameters`) and `finish_reason: "tool_calls"`; streamed, it comes
   * as one `delta.tool_calls` chunk. Not with `response_format` or `grammar`.
   */
  tools?: (FunctionTool | OtherTool)[];
  tool_choice?: ToolChoice | OtherToolChoice;
  /** More than one call in a reply (one otherwise). */
  parallel_tool_calls?: boolean;
  /**
   * Extra variables for the model's own chat template, as vLLM and llama.cpp's server take them:
   * `{enable_thinking: false}` turns Qwen3's (and SmolLM3's) reasoning off.
   */
  chat_template_kwargs?: Record<string, unknown>;
  signal?: AbortSignal;
}

/** Completion mode (`engine.completions.create`): one raw-text prompt, no chat template. */
export interface CompletionCreateParams {
  /** Raw text; special tokens written in it become their ids, BOS is added when the model asks for it. */
  prompt: string;
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  /** 0 = greedy. */
  temperature?: number;
  top_p?: number;
  top_k?: number;
  repetition_penalty?: number;
  seed?: number;
  stop?: string | string[];
  /**
   * Structured output: `{type: "json_object"}` (any JSON object) or `{type: "json_schema",
   * json_schema: {name, schema, strict}}` (JSON valid against `schema`); `{type: "text"}` is none.
   * An invalid schema is refused with `INVALID_ARGUMENT` and the reason.
   */
  response_format?: ResponseFormat;
  /** The output matches this grammar (llguidance's Lark syntax); not with `response_format`. */
  grammar?: string;
  /** Whether this request drafts (the engine's `speculative` otherwise). */
  speculative?: "auto" | "off";
  /**
   * OpenAI's predicted outputs: text the reply is expected to be (a file being edited, say);
   * drafted from and followed as the reply advances. The reply is the same with or without it;
   * `usage.completion_tokens_details` counts its tokens taken and refused.
   */
  prediction?: { type: "content"; content: string | ChatContentPartText[] } | null;
  signal?: AbortSignal;
}

export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens whose KV came from the prefix cache instead of prefill. */
  prefix_hit_tokens: number;
  /** Draft tokens (a `prediction`'s or prompt lookup's) the reply took, and those it did not. */
  completion_tokens_details: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
}

export interface GenerationDetails {
  finish_reason: "stop" | "length" | "tool_calls" | "abort";
  prefix_hit_tokens: number;
  prefill_tokens: number;
  ttft_ms: number | null;
  prefill_ms: number;
  decode_ms: number;
  queue_ms: number;
  /** The request's block table at its end (physical KV blocks), once the engine reports it. */
  blocks: number[] | null;
  /** The pool right after the request. */
  stats: PoolSnapshot;
  /** Set when a constrained output (response_format, grammar) ended before it was complete. */
  warning: string | null;
}

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  /**
   * A reply of tool calls has `content: null` and `tool_calls`, and finishes with `tool_calls`.
   * A reasoning model's reply (Qwen3, DeepSeek-R1 distills, SmolLM3) has what it wrote between
   * its think markers in `reasoning_content` and its answer in `content`; structured output and
   * tool calls apply to the answer.
   */
  choices: {
    index: 0;
    message: { role: "assistant"; content: string | null; refusal: null; tool_calls?: ToolCall[]; reasoning_content?: string };
    logprobs: null;
    finish_reason: "stop" | "length" | "tool_calls";
  }[];
  usage: CompletionUsage;
  pagedlm: GenerationDetails;
}

export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  /** A reasoning model's reasoning streams in `delta.reasoning_content`, its answer in `delta.content`. */
  choices: {
    index: 0;
    delta: { role?: "assistant"; content?: string; reasoning_content?: string; tool_calls?: (ToolCall & { index: number })[] };
    logprobs: null;
    finish_reason: "stop" | "length" | "tool_calls" | null;
  }[];
  /** Only on the last chunk, with stream_options.include_usage. */
  usage?: CompletionUsage;
  /** Only on the chunk that carries finish_reason. */
  pagedlm?: GenerationDetails;
}

/** Where a request stands (queued behind others, running, done) and its token counts so far. */
export interface RequestProgress {
  request: number;
  state: "queued" | "running" | "done";
  prompt_tokens: number;
  completion_tokens: number;
}

export interface ChatCompletionStream extends AsyncIterable<ChatCompletionChunk> {
  abort(): void;
  finalCompletion(): Promise<ChatCompletion>;
  progress(): RequestProgress;
}

/** What completion mode returns (OpenAI's legacy completions shape). */
export interface Completion {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  /** `text`: the continuation only, not the prompt. */
  choices: { index: 0; text: string; logprobs: null; finish_reason: "stop" | "length" }[];
  usage: CompletionUsage;
  pagedlm: GenerationDetails;
}

export interface CompletionChunk {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: { index: 0; text: string; logprobs: null; finish_reason: "stop" | "length" | null }[];
  /** Only on the last chunk, with stream_options.include_usage. */
  usage?: CompletionUsage;
  /** Only on the chunk that carries finish_reason. */
  pagedlm?: GenerationDetails;
}

export interface CompletionStream extends AsyncIterable<CompletionChunk> {
  abort(): void;
  finalCompletion(): Promise<Completion>;
  progress(): RequestProgress;
}

export interface PoolStats {
  kv_dtype: "f32" | "int8";
  block_size: number;
  blocks_total: number;
  blocks_used: number;
  blocks_free: number;
  blocks_cached: number;
  bytes_total: number;
  bytes_per_token: number;
  live_tokens: number;
  internal_fragmentation: number;
  /** K/V bytes of every held block (sequences and prefix cache), both block groups. */
  bytes_held: number;
  /** The sliding-window layers' block group (Gemma 3); null without windowed layers. */
  local: GroupStats | null;
}

export interface GroupStats {
  blocks_total: number;
  blocks_used: number;
  blocks_free: number;
  blocks_cached: number;
  bytes_total: number;
}

export interface PoolSnapshot {
  pool: PoolStats;
  /** Per block: 0 free, 1 held by a sequence, 2 cached only (evictable). */
  block_states: number[];
  refcounts: number[];
  sequences: { id: number; len: number; blocks: number[] }[];
  prefix?: { enabled: boolean; requests: number; prompt_tokens: number; hit_tokens: number; hit_rate: number; evictions: number };
  /**
   * GPU bytes the engine holds: weights and KV pool (fixed at load) and the forward graphs of the
   * step shapes run lately (they come and go).
   */
  memory: { weights_bytes: number; kv_bytes: number; graph_bytes: number };
  /** null while the KV cache's invariants hold; else what broke (a bug worth reporting). */
  integrity: string | null;
  /** The wasm engine's linear memory (its CPU heap, which only grows). */
  wasm_bytes: number;
}

export interface SchedStats {
  running: number;
  waiting: number;
  steps: number;
  preemptions: number;
  finished: number;
  aborted: number;
  failed: number;
  /** The running set: engine request id, KV sequence, its length and block table. */
  sequences: { request: number; seq: number; len: number; prefilling: boolean; blocks: number[] }[];
}

export interface EngineStats extends PoolSnapshot {
  /** The continuous-batching scheduler. */
  sched: SchedStats;
  /** Requests generating now (request = the stream's progress().request), with their block tables. */
  running: { request: number; prompt_tokens: number; tokens: number; blocks: number[] }[];
  /** Requests waiting for their turn. */
  queued: number[];
}

export interface EngineInfo {
  /** The WebGPU adapter, or "CPU backend (1 threads)" on the CPU backend. */
  adapter: string;
  /** True when the kernels run on a CPU: the CPU backend, or WebGPU on a software GPU. */
  is_cpu: boolean;
  /** The kernel variants in use: adapter class and optional features, e.g. "cpu" or "discrete+f16"; "cpu+simd128+int8-activations" on the CPU backend in a browser, "cpu+simd128+relaxed-simd+int8-activations" where it has relaxed SIMD (Chromium 114 on; the same results). */
  variant: string;
  /** Which backend runs the model. */
  backend: "webgpu" | "cpu";
  /** Why that backend: "asked for", or what `backend: "auto"` found. */
  backend_reason: string;
  kv_layout: "paged" | "contiguous";
  kv_dtype: "f32" | "int8";
  block_size: number;
  max_context: number;
  model: {
    arch: string; name: string; n_layers: number; hidden: number; n_heads: number; n_kv_heads: number; head_dim: number; vocab: number; context_length: number;
    /** `general.architecture` of the file. */
    architecture: "llama" | "gemma3" | "qwen2" | "qwen3" | "phi3" | "gemma2" | "smollm3" | string;
    /** Tokens a local (sliding-window) attention layer sees; null when every layer is global. */
    sliding_window: number | null;
    /**
     * The family of the chat template `chat.completions.create` renders (the file's own Jinja
     * template, whatever the family): "chatml", "gemma", "jinja" for another family (Llama 3,
     * Phi, DeepSeek); null for a base model without a chat template, which takes
     * `completions.create({prompt})` only (chat is INVALID_ARGUMENT).
     */
    chat_template: "chatml" | "gemma" | "jinja" | null;
    /** Tensors of each weight type the file holds, by ggml's type name, e.g. {"F32": 61, "Q4_1": 210, "Q8_0": 1}. */
    weight_types: Record<string, number>;
  };
  memory: { weights_bytes: number; kv_bytes: number };
  /** K and V bytes one token takes in the KV cache, all layers together. */
  kv: { bytes_per_token: number };
}

/** One kernel's share of a profiled step. */
export interface KernelTime {
  name: string;
  dispatches: number;
  ms: number;
}

/** A profiled decode step or prefill (`Engine.profile`). */
export interface StepProfile {
  /** Tokens computed (1 for a decode step). */
  tokens: number;
  /** The sequence's length after the step. */
  context: number;
  dispatches: number;
  submits: number;
  /** Buffers mapped for reading, each a wait for the GPU. */
  readbacks: number;
  /** Readbacks that found no later work queued: the GPU idles while the host waits. */
  blocking_readbacks: number;
  bytes_read_back: number;
  bytes_read_back_per_token: number;
  buffers_created: number;
  buffer_bytes_created: number;
  bind_groups_created: number;
  /** Host time from starting to record to `queue.submit` returning. */
  host_ms: number;
  /** The part of host_ms inside queue.submit. */
  submit_ms: number;
  wall_ms: number;
  /** Sum of `kernels[].ms`. */
  gpu_ms: number;
  /** With timestamps: from the first dispatch's beginning to the last one's end (gaps included); else null. */
  gpu_span_ms: number | null;
  /** Slowest first. */
  kernels: KernelTime[];
}

/** `Engine.profile`: one prefill and one steady-state decode step. */
export interface Profile {
  adapter: string;
  /** Where per-kernel times come from: GPU timestamp queries, or each kernel alone on the host clock. */
  method: "timestamps" | "wall_clock_per_kernel";
  prompt_tokens: number;
  prefill_chunk: number;
  /** Whether decode steps are planned ahead (the default). */
  lookahead: boolean;
  /** The kernel variants in use, as `info.variant`. */
  variant: string;
  /** The first prefill of this length: graphs built, pipelines compiled. */
  prefill_cold: { wall_ms: number; host_ms: number; buffers_created: number; buffer_bytes_created: number; bind_groups_created: number; pipelines_compiled: number };
  prefill: StepProfile;
  decode_warmup_steps: number;
  decode_samples: number;
  decode: StepProfile;
  dispatches_per_decode_step: number;
  host_ms_per_decode_step: number;
  gpu_ms_per_decode_step: number;
  wall_ms_per_decode_step: number;
  blocking_readbacks_per_token: number;
  /** Host record+submit time over a decode step's wall time. */
  host_share_of_decode_step: number;
  /** The same without the time inside queue.submit (where a driver may wait for the step before). */
  record_share_of_decode_step: number;
  /** A decode step's wall time over the sum of its kernels' GPU times. */
  decode_wall_over_gpu: number;
}

/** The event an engine dispatches once when its GPU device is lost. */
export type DeviceLostEvent = CustomEvent<{ message: string }>;

/**
 * A model loaded in a Worker. An `EventTarget`: `devicelost` ({@link DeviceLostEvent}) is
 * dispatched once when its GPU device is lost; `restart()` recovers.
 */
export declare class Engine extends EventTarget {
  readonly info: EngineInfo;
  /**
   * How the model was loaded: `source` "network" (downloaded now), "cache" (browser storage),
   * "file" (a File/Blob or an OPFS handle), "buffer"; `storage` where a URL's model is kept;
   * `files` how many files (the parts of a split GGUF).
   */
  readonly load: { source: "network" | "cache" | "file" | "buffer"; storage: "opfs" | "cache" | null; bytes: number; files: number; download_ms: number; engine_ms: number };
  readonly model: string;
  readonly chat: {
    completions: {
      create(params: ChatCompletionCreateParams & { stream: true }): Promise<ChatCompletionStream>;
      create(params: ChatCompletionCreateParams & { stream?: false | null }): Promise<ChatCompletion>;
      create(params: ChatCompletionCreateParams): Promise<ChatCompletion | ChatCompletionStream>;
    };
  };
  /** Completion mode: raw text in, its continuation out (for base models; works on chat models too). */
  readonly completions: {
    create(params: CompletionCreateParams & { stream: true }): Promise<CompletionStream>;
    create(params: CompletionCreateParams & { stream?: false }): Promise<Completion>;
    create(params: CompletionCreateParams): Promise<Completion | CompletionStream>;
  };
  stats(): Promise<EngineStats>;
  resetCache(): Promise<PoolSnapshot>;
  /** Whether the GPU device is lost: requests fail with DEVICE_LOST until `restart()`. */
  readonly lost: boolean;
  /**
   * After a loss: loads the model again on a new device from where its bytes came (browser storage
   * or the File: no new download unless the URL was loaded with `cache: false`), or from `model`.
   * An engine loaded from an ArrayBuffer needs `model` (its bytes are not kept). Rejects with
   * INVALID_ARGUMENT when the device is not lost.
   */
  restart(options?: { onProgress?: (progress: LoadProgress) => void; model?: ModelSource }): Promise<Engine>;
  /** Destroys the GPU device as a driver reset would (like `WEBGL_lose_context.loseContext()`), to test recovery. */
  simulateDeviceLoss(): Promise<void>;
  addEventListener(type: "devicelost", listener: (event: DeviceLostEvent) => void, options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions): void;
  /**
   * Where the time goes: one prefill of `promptTokens` tokens (default 512) and one steady-state
   * decode step, on an idle engine (rejects with BUSY while requests run).
   */
  profile(promptTokens?: number, options?: { timestamps?: boolean }): Promise<Profile>;
  /**
   * A KV snapshot of a conversation, to keep it (IndexedDB, a file) or hand it to another engine.
   * A conversation is identified by its messages: `messages` (the history so far, typically
   * ending with the assistant's reply) are rendered with the chat template without the generation
   * prompt, so the prompt of the next turn (these messages plus a user message) starts with
   * exactly these tokens. The snapshot holds the token ids and their K/V blocks, the model's and
   * KV format's fingerprint and a checksum; whatever part is not cached is computed first.
   */
  exportConversation(messages: ChatMessage[]): Promise<Uint8Array>;
  /**
   * Loads a snapshot from `exportConversation` into the prefix cache, so the next request that
   * continues the conversation reuses its K/V (`usage.prefix_hit_tokens`). Resolves to how many
   * tokens it holds. Rejects with `SNAPSHOT_MISMATCH` (made by another model or KV format, e.g.
   * f32 vs int8) or `SNAPSHOT_CORRUPT` (damaged); a refused snapshot changes nothing.
   */
  importConversation(bytes: Uint8Array | ArrayBuffer): Promise<{ tokens: number }>;
  dispose(): Promise<void>;
}

/**
 * A model file: a URL (downloaded into browser storage and loaded from there by ranges; a split
 * GGUF by its first part, `name-00001-of-0000N.gguf`), its bytes (kept in the worker's JS memory,
 * never whole in wasm), a File/Blob, or an OPFS file handle.
 */
export type ModelSource = string | URL | ArrayBuffer | ArrayBufferView | Blob | FileSystemFileHandle;

export declare function createEngine(
  model: ModelSource,
  options?: EngineOptions,
): Promise<Engine>;

/** Bytes per backend. */
export interface BackendBytes {
  webgpu: number;
  cpu: number;
}

/** What a load would take, from the model's header alone ({@link estimateMemory}). */
export interface MemoryEstimate {
  complete: true;
  /** Whether the load fits what this device offers (`limits`) on the backend asked for (either, for "auto"); `reasons` says why not. */
  fits: boolean;
  fits_backend: { webgpu: boolean; cpu: boolean };
  /** The backend the options ask for ("cpu" for "auto" where there is no WebGPU adapter). */
  backend: "webgpu" | "cpu" | "auto";
  weights_bytes: BackendBytes;
  kv_bytes_per_token: { f32: number; int8: number };
  /** The tokens the KV pool would hold. */
  kv_tokens: number;
  kv_bytes: { f32: number; int8: number };
  activations_bytes: BackendBytes;
  total_bytes: BackendBytes;
  /** The largest single GPU buffer the load would create (a weight matrix, or one layer's KV). */
  largest_buffer_bytes: number;
  kv_layer_bytes: number;
  /** What a wasm32 module addresses (4 GiB): the CPU backend's ceiling. */
  wasm32_bytes: number;
  /** What the estimate was held to: the adapter's buffer limits, a memory budget. */
  limits: { maxBufferSize?: number; maxStorageBufferBindingSize?: number; memoryBytes?: number };
  /** Why it does not fit; empty when it fits. */
  reasons: string[];
}

export interface EstimateOptions extends Omit<EngineOptions, "onProgress"> {
  /** The memory budget to hold the load to (default: `navigator.deviceMemory` GiB where the browser tells it). */
  maxMemoryBytes?: number;
  /** Limits to hold the estimate to instead of this device's (another device's, say); each one given overrides the adapter's. */
  limits?: { maxBufferSize?: number; maxStorageBufferBindingSize?: number; memoryBytes?: number };
}

/**
 * What loading `model` with `options` would take and whether this device offers it, from the
 * header alone: a URL's first 4 MiB (one range request; more only for a longer header), a File's
 * slice. Held to the WebGPU adapter's limits and a memory budget.
 */
export declare function estimateMemory(model: ModelSource, options?: EstimateOptions): Promise<MemoryEstimate>;

/** A model in browser storage. */
export interface CachedModel {
  /** The model's URL (a split model's first part). */
  url: string;
  /** Bytes stored (every part of a split model). */
  bytes: number;
  /** Whether it is whole: a download that was cut is listed incomplete (loading the URL resumes it). */
  complete: boolean;
  storage: "opfs" | "cache";
  /** Files: the parts of a split model, else 1. */
  parts: number;
}

/** The models in browser storage. */
export declare function listCachedModels(options?: { cacheName?: string }): Promise<CachedModel[]>;

/** Deletes a model (every part of a split one, a partial download too); resolves to whether it was stored. BUSY while it downloads. */
export declare function deleteCachedModel(url: string | URL, options?: { cacheName?: string }): Promise<boolean>;
