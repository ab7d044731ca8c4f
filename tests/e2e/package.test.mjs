// The npm package as a user gets it: `npm pack`, installed into a separate static site that
// imports "pagedlm" through an import map, driven in headless Chromium against the real model.
// Covers the OpenAI-shaped API, concurrent requests, aborts and the coded errors.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { launch, MODEL, openPage, root, staticServer, tinyModel } from "./helpers.mjs";

const TIMEOUT = 240_000;
const SITE_PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>pagedlm package test</title>
<script type="importmap">{"imports": {"pagedlm": "./node_modules/pagedlm/js/index.js"}}</script>
<script type="module">
  import * as pagedlm from "pagedlm";
  window.pagedlm = pagedlm;
  document.title = "ready";
</script></head><body>a page that uses pagedlm from its npm tarball</body></html>`;

// The package's own worker, made to die the two ways a worker does: an uncaught error (when the
// model URL says "crash") and a silent end, as when the browser stops it for its memory (at the
// second token of a request that says "EXIT").
const DYING_WORKER = `import "./node_modules/pagedlm/js/worker.js";
import { WebEngine } from "./node_modules/pagedlm/pkg/pagedlm.js";
// A request whose messages say TRAP makes the engine's next step trap, as a Rust panic or an
// exhausted wasm memory would (WebAssembly.RuntimeError).
let trap = false;
const step = WebEngine.prototype.step;
WebEngine.prototype.step = function (...args) {
  if (trap) throw new WebAssembly.RuntimeError("unreachable (the test worker's trap)");
  return step.apply(this, args);
};
let exitAt = null;
const post = self.postMessage.bind(self);
self.postMessage = (message, transfer) => {
  post(message, transfer);
  if (message.type === "token" && message.id === exitAt?.id && ++exitAt.tokens === 2) self.close();
};
self.addEventListener("message", ({ data }) => {
  if (data.type === "load" && String(data.model).includes("crash")) throw new Error("the test worker crashed");
  if (data.type === "create" && JSON.stringify(data.messages).includes("EXIT")) exitAt = { id: data.id, tokens: 0 };
  if (data.type === "create" && JSON.stringify(data.messages).includes("TRAP")) trap = true;
});`;

describe("npm package", () => {
  let site;
  let server;
  let browser;
  let page;
  let problems;

  before(async () => {
    assert.ok(existsSync(MODEL), "the model is missing: run `npm run fetch-model`");
    site = mkdtempSync(join(tmpdir(), "pagedlm-site-"));
    // prepack builds pkg/ if a source changed.
    execFileSync("npm", ["pack", "--silent", "--pack-destination", site], { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
    const tarball = readdirSync(site).find((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack wrote no tarball");
    writeFileSync(join(site, "package.json"), JSON.stringify({ name: "site", private: true, type: "module" }));
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent", `./${tarball}`], { cwd: site, stdio: ["ignore", "pipe", "inherit"] });
    writeFileSync(join(site, "index.html"), SITE_PAGE);
    writeFileSync(join(site, "dying-worker.js"), DYING_WORKER);
    server = await staticServer(site, {
      "/model.gguf": { file: MODEL },
      // The tiny synthetic model, for the tests of what happens around a model (a lost device, a
      // dead worker), where the real one would only add minutes.
      "/tiny.gguf": { file: join(tinyModel("tiny.gguf"), "tiny.gguf") },
      "/truncated.gguf": { file: MODEL, bytes: 1 << 20 },
    });
    browser = await launch();
    ({ page, problems } = await openPage(browser, `${server.url}/`));
    await page.waitForFunction(() => document.title === "ready", null, { timeout: 30_000 });
  });

  after(async () => {
    await browser?.close();
    await server?.close();
    if (site) rmSync(site, { recursive: true, force: true });
  });

  it("ships types and only what a page needs", () => {
    const files = execFileSync("tar", ["-tzf", join(site, readdirSync(site).find((f) => f.endsWith(".tgz")))]).toString().trim().split("\n");
    for (const f of ["package/js/index.js", "package/js/worker.js", "package/js/protocol.js", "package/js/index.d.ts", "package/pkg/pagedlm.js", "package/pkg/pagedlm_bg.wasm", "package/pkg/pagedlm_relaxed_bg.wasm"]) {
      assert.ok(files.includes(f), `${f} is in the tarball (${files.join(", ")})`);
    }
    assert.ok(!files.some((f) => f.includes("/src/") || f.includes("/www/") || f.endsWith(".gguf")), "no sources, page or model in the tarball");
  });

  it("loads from a URL with progress, chats in both shapes, and keeps concurrent requests apart", { timeout: 2 * TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const phases = [];
      const engine = await createEngine("/model.gguf", { onProgress: (p) => { if (phases.at(-1) !== p.phase) phases.push(p.phase); } });
      const ask = (content) => [{ role: "user", content }];
      const opts = { max_tokens: 4, temperature: 0 };
      const plain = await engine.chat.completions.create({ messages: ask("Name a fruit."), ...opts });

      const stream = await engine.chat.completions.create({ messages: ask("Name a fruit."), ...opts, stream: true, stream_options: { include_usage: true } });
      const chunks = [];
      for await (const chunk of stream) chunks.push(chunk);
      const streamed = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");

      // Solo answers first, then the same two questions at once: each must get its own answer.
      const solo = (await engine.chat.completions.create({ messages: ask("Name an animal."), ...opts })).choices[0].message.content;
      const collect = async (messages) => {
        let text = "";
        for await (const c of await engine.chat.completions.create({ messages, ...opts, stream: true })) text += c.choices[0]?.delta?.content ?? "";
        return text;
      };
      const [a, b] = await Promise.all([collect(ask("Name a fruit.")), collect(ask("Name an animal."))]);
      const stats = await engine.stats();
      const second = await createEngine("/model.gguf", { cache: true });
      const reloaded = second.load.source;
      await second.dispose();
      return { phases, load: engine.load, plain, chunks, streamed, solo, a, b, stats, reloaded, info: engine.info };
    });
    assert.deepEqual(out.phases.filter((p) => ["download", "load", "ready"].includes(p)), ["download", "load", "ready"], `progress phases: ${out.phases}`);
    assert.equal(out.load.source, "network");
    assert.equal(out.reloaded, "cache", "a second engine for the same URL reads the Cache API");
    assert.equal(out.info.kv_layout, "paged");
    // The file's make-up (272 tensors), as llama.cpp lists it for this GGUF.
    assert.deepEqual(out.info.model.weight_types, { F32: 61, Q4_1: 210, Q8_0: 1 });

    const c = out.plain;
    assert.equal(c.object, "chat.completion");
    assert.equal(c.choices[0].message.role, "assistant");
    assert.ok(c.choices[0].message.content.length > 0);
    assert.ok(["stop", "length"].includes(c.choices[0].finish_reason));
    assert.ok(c.usage.prompt_tokens > 0 && c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 4);
    assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
    assert.equal(typeof c.usage.prefix_hit_tokens, "number");

    assert.equal(out.chunks[0].object, "chat.completion.chunk");
    assert.equal(out.chunks[0].choices[0].delta.role, "assistant");
    assert.equal(out.streamed, c.choices[0].message.content, "greedy: the stream spells the same reply");
    const last = out.chunks.at(-1);
    assert.deepEqual(last.choices, [], "include_usage: a last chunk with usage only");
    assert.equal(last.usage.prompt_tokens, c.usage.prompt_tokens);
    assert.ok(last.usage.prefix_hit_tokens >= c.usage.prompt_tokens - 16, `the repeated prompt hits the prefix cache (${last.usage.prefix_hit_tokens})`);
    assert.ok(out.chunks.some((ch) => ch.choices[0]?.finish_reason), "one chunk carries finish_reason");

    assert.equal(out.a, c.choices[0].message.content, "concurrent request A got its own reply");
    assert.equal(out.b, out.solo, "concurrent request B got its own reply");
    const pool = out.stats.pool;
    assert.equal(pool.blocks_used + pool.blocks_cached + pool.blocks_free, pool.blocks_total, "held + cached + free = total");
    assert.equal(out.stats.block_states.length, pool.blocks_total);
    assert.ok(out.stats.prefix.hit_tokens > 0);
  });

  it("completes raw text (completion mode) streaming and not, and info names the architecture and KV cost", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const engine = await createEngine("/model.gguf");
      const opts = { prompt: "The capital of France is", max_tokens: 4, temperature: 0 };
      const plain = await engine.completions.create(opts);
      const chunks = [];
      for await (const chunk of await engine.completions.create({ ...opts, stream: true, stream_options: { include_usage: true } })) chunks.push(chunk);
      const badPrompt = await engine.completions.create({ messages: [{ role: "user", content: "Hi" }] }).then(() => "resolved", (e) => e.code);
      const info = engine.info;
      await engine.dispose();
      return { plain, chunks, badPrompt, info };
    });
    const c = out.plain;
    assert.equal(c.object, "text_completion");
    assert.match(c.id, /^cmpl-/);
    assert.equal(typeof c.choices[0].text, "string");
    assert.ok(c.choices[0].text.length > 0, "a completion");
    assert.equal(c.choices[0].message, undefined, "no chat message in completion mode");
    assert.ok(["stop", "length"].includes(c.choices[0].finish_reason));
    assert.ok(c.usage.prompt_tokens > 0 && c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 4);
    assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
    assert.ok(out.chunks.every((ch) => ch.object === "text_completion"), "every chunk is a text_completion");
    assert.equal(out.chunks.filter((ch) => ch.choices.length > 0).map((ch) => ch.choices[0].text).join(""), c.choices[0].text, "greedy: the stream spells the same text");
    assert.deepEqual(out.chunks.at(-1).choices, [], "include_usage: a last chunk with usage only");
    assert.equal(out.chunks.at(-1).usage.prompt_tokens, c.usage.prompt_tokens);
    assert.equal(out.badPrompt, "INVALID_ARGUMENT", "completion mode wants a prompt");

    const m = out.info.model;
    assert.equal(m.architecture, m.arch);
    assert.equal(m.sliding_window, null, "SmolLM2 has no sliding window");
    assert.equal(m.chat_template, "chatml");
    assert.equal(out.info.kv.bytes_per_token, m.n_layers * m.n_kv_heads * m.head_dim * 2 * 4, "f32 K and V over all layers");
  });

  it("aborts, rejects bad input with codes, resets the cache and disposes", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const codeOf = (p) => p.then(() => "resolved", (e) => `${e.name}:${e.code}:${e instanceof Error}`);
      // WebGPU: the profile below is a GPU step's (the default, auto, takes the CPU backend on SwiftShader).
      const engine = await createEngine("/model.gguf", { backend: "webgpu" });
      const r = {};
      // Abort mid-stream: the iterator throws ABORTED, the partial reply comes with the error.
      const controller = new AbortController();
      const stream = await engine.chat.completions.create({ messages: [{ role: "user", content: "Tell me a long story." }], max_tokens: 200, temperature: 0, stream: true, signal: controller.signal });
      let pieces = 0;
      try {
        for await (const chunk of stream) if (chunk.choices[0]?.delta?.content && ++pieces === 2) controller.abort();
        r.midStream = "resolved";
      } catch (e) {
        r.midStream = e.code;
        r.partialTokens = e.partial?.usage.completion_tokens;
      }
      r.afterAbort = (await engine.stats()).pool;
      r.preAborted = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], signal: AbortSignal.abort() }));
      r.overflow = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "word ".repeat(6000) }], max_tokens: 1 }));
      r.badMessages = await codeOf(engine.chat.completions.create({ messages: "hi" }));
      r.badOption = await codeOf(createEngine("/model.gguf", { kvDtyp: "int8" }));
      r.badSampling = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], temperature: -1, max_tokens: 1 }));
      r.imagePart = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }));
      r.badFormat = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], response_format: { type: "yaml" } }));
      r.badSchema = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "objekt" } } } }));
      // OpenAI-typed messages (a developer turn, text parts) and an enum schema: a short reply.
      const yesNo = await engine.chat.completions.create({
        messages: [{ role: "developer", content: "Answer yes or no." }, { role: "user", content: [{ type: "text", text: "Is the sky " }, { type: "text", text: "blue?" }] }],
        response_format: { type: "json_schema", json_schema: { name: "answer", schema: { enum: ["yes", "no"] }, strict: true } },
        max_tokens: 4,
        temperature: 0,
      });
      r.yesNo = { message: yesNo.choices[0].message, finish: yesNo.choices[0].finish_reason, warning: yesNo.pagedlm.warning };
      // A named tool, streamed: no content while the call is written, then one delta.tool_calls chunk.
      const lamp = { type: "function", function: { name: "lamp", parameters: { type: "object", properties: { on: { type: "boolean" } }, required: ["on"], additionalProperties: false } } };
      const toolStream = await engine.chat.completions.create({
        messages: [{ role: "user", content: "Turn the lamp on." }],
        tools: [lamp],
        tool_choice: { type: "function", function: { name: "lamp" } },
        stream: true,
        max_tokens: 32,
        temperature: 0,
      });
      r.toolChunks = [];
      for await (const c of toolStream) r.toolChunks.push({ delta: c.choices[0].delta, finish: c.choices[0].finish_reason });
      const toolReply = await toolStream.finalCompletion();
      r.toolReply = { message: toolReply.choices[0].message, finish: toolReply.choices[0].finish_reason };
      r.badToolChoice = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], tools: [lamp], tool_choice: "sometimes" }));
      r.badToolMessage = await codeOf(engine.chat.completions.create({ messages: [{ role: "tool", content: "x" }], tools: [lamp] }));
      r.reset = (await engine.resetCache()).pool;
      // The profile runs in the worker on the idle engine; while a request runs it is BUSY.
      const p = await engine.profile(8);
      r.profile = { method: p.method, dispatches: p.decode.dispatches, listed: p.decode.kernels.reduce((n, k) => n + k.dispatches, 0),
        readbacks: p.blocking_readbacks_per_token, bytes: p.decode.bytes_read_back_per_token, summary: p.dispatches_per_decode_step };
      r.badProfile = await codeOf(engine.profile(0));
      const running = engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 2, temperature: 0 });
      r.profileBusy = await codeOf(engine.profile(8));
      await running;
      await engine.dispose();
      r.disposed = await codeOf(engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }] }));

      const bytes = await (await fetch("/truncated.gguf")).arrayBuffer();
      r.truncated = await codeOf(createEngine(bytes));
      r.missing = await codeOf(createEngine("/nothing-here.gguf"));
      // A File (what a drop or a file picker gives) loads like a URL.
      const file = new File([await (await fetch("/model.gguf")).arrayBuffer()], "SmolLM2.gguf");
      const fromFile = await createEngine(file);
      r.fileSource = fromFile.load.source;
      r.fileModel = fromFile.info.model.n_layers;
      await fromFile.dispose();
      try {
        const int8 = await createEngine("/model.gguf", { kvDtype: "int8" });
        const reply = await int8.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 2, temperature: 0 });
        const pool = (await int8.stats()).pool;
        r.int8 = `ok:${int8.info.kv_dtype}:${reply.usage.completion_tokens > 0}`;
        r.int8BytesPerToken = pool.bytes_per_token;
        r.f32BytesPerToken = fromFile.info.model.n_layers * fromFile.info.model.n_kv_heads * fromFile.info.model.head_dim * 2 * 4;
        await int8.dispose();
      } catch (e) {
        r.int8 = `${e.code}:${e.message}`;
      }
      return r;
    });
    assert.equal(out.midStream, "ABORTED");
    assert.ok(out.partialTokens >= 2 && out.partialTokens < 200, `the abort came mid-way (${out.partialTokens} tokens)`);
    assert.equal(out.afterAbort.blocks_used, 0, "the aborted request holds no block afterwards");
    assert.equal(out.preAborted, "PagedlmError:ABORTED:true");
    assert.equal(out.overflow, "PagedlmError:CONTEXT_OVERFLOW:true");
    assert.equal(out.badMessages, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.badOption, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.badSampling, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.imagePart, "PagedlmError:UNSUPPORTED:true");
    assert.equal(out.badFormat, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.badSchema, "PagedlmError:INVALID_ARGUMENT:true");
    assert.ok(['"yes"', '"no"'].includes(out.yesNo.message.content), `an enum answer: ${JSON.stringify(out.yesNo)}`);
    assert.deepEqual([out.yesNo.message.refusal, out.yesNo.finish, out.yesNo.warning], [null, "stop", null]);
    const { message: toolMessage, finish: toolFinish } = out.toolReply;
    assert.deepEqual([toolMessage.content, toolMessage.refusal, toolFinish], [null, null, "tool_calls"], JSON.stringify(out.toolReply));
    assert.equal(toolMessage.tool_calls.length, 1);
    const [call] = toolMessage.tool_calls;
    assert.deepEqual([call.type, call.function.name, typeof JSON.parse(call.function.arguments).on], ["function", "lamp", "boolean"]);
    assert.ok(out.toolChunks.every((c) => !c.delta.content), `no content streamed for a call: ${JSON.stringify(out.toolChunks)}`);
    const callChunks = out.toolChunks.filter((c) => c.delta.tool_calls);
    assert.deepEqual(callChunks.map((c) => c.delta.tool_calls), [[{ index: 0, ...call }]]);
    assert.equal(out.toolChunks.at(-1).finish, "tool_calls");
    assert.equal(out.badToolChoice, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.badToolMessage, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.reset.blocks_cached, 0, "resetCache drops every cached block");
    assert.ok(["timestamps", "wall_clock_per_kernel"].includes(out.profile.method), out.profile.method);
    assert.equal(out.profile.listed, out.profile.dispatches, "the profile's kernels cover every decode dispatch");
    assert.equal(out.profile.summary, out.profile.dispatches);
    assert.equal(out.profile.readbacks, 0, "no blocking readback per greedy decode token: each is read while the next step runs");
    assert.equal(out.profile.bytes, 4, "its 4-byte argmax");
    assert.equal(out.badProfile, "PagedlmError:INVALID_ARGUMENT:true");
    assert.equal(out.profileBusy, "PagedlmError:BUSY:true");
    assert.equal(out.disposed, "PagedlmError:DISPOSED:true");
    assert.equal(out.truncated, "PagedlmError:MODEL_FORMAT:true");
    assert.equal(out.missing, "PagedlmError:MODEL_DOWNLOAD:true");
    assert.equal(out.fileSource, "file");
    assert.ok(out.fileModel > 0);
    assert.ok(out.int8 === "ok:int8:true" || out.int8.startsWith("UNSUPPORTED:"), `int8 runs or says it is not available (${out.int8})`);
    if (out.int8BytesPerToken) assert.ok(out.int8BytesPerToken < out.f32BytesPerToken / 3, `int8 KV per token ${out.int8BytesPerToken} B vs f32 ${out.f32BytesPerToken} B`);
    assert.deepEqual(problems.filter((p) => !/404|Not Found/.test(p)), [], "no page errors");
  });

  it("survives a lost GPU device: requests end with DEVICE_LOST and their text, devicelost fires once, restart() loads again without a download", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const engine = await createEngine("/tiny.gguf", { backend: "webgpu" });
      const events = [];
      engine.addEventListener("devicelost", (e) => events.push(e.detail.message));
      const ask = (content) => [{ role: "user", content }];
      const caught = (e) => ({ code: e.code, partial: e.partial, message: e.message });
      const stream = await engine.chat.completions.create({ messages: ask("Count from one to twenty."), max_tokens: 200, temperature: 0, stream: true });
      const other = engine.chat.completions.create({ messages: ask("Name a color."), max_tokens: 40, temperature: 0 }).then(() => null, caught);
      let text = "";
      let error = null;
      let chunks = 0;
      try {
        for await (const c of stream) {
          text += c.choices[0]?.delta?.content ?? "";
          if (++chunks === 3) await engine.simulateDeviceLoss();
        }
      } catch (e) {
        error = caught(e);
      }
      const second = await other;
      const lost = engine.lost;
      const refused = await engine.chat.completions.create({ messages: ask("Hi"), max_tokens: 2 }).then(() => null, (e) => e.code);
      const phases = [];
      await engine.restart({ onProgress: (p) => { if (phases.at(-1) !== p.phase) phases.push(p.phase); } });
      const answer = await engine.chat.completions.create({ messages: ask("Name a fruit."), max_tokens: 4, temperature: 0 });
      const notLost = await engine.restart().then(() => null, (e) => e.code);
      await engine.dispose();
      return { text, error, second, lost, refused, events, phases, source: engine.load.source, lostAfter: engine.lost, answer: answer.choices[0].message.content, notLost };
    });
    assert.equal(out.error?.code, "DEVICE_LOST", JSON.stringify(out));
    assert.ok(out.text.length > 0, "the stream had text before the loss");
    assert.equal(out.error.partial.content, out.text, "the error carries exactly the streamed text");
    assert.ok(out.error.partial.usage.completion_tokens >= 2, JSON.stringify(out.error.partial));
    assert.equal(out.second?.code, "DEVICE_LOST", "the other request ends too");
    assert.equal(out.events.length, 1, `devicelost fired once: ${JSON.stringify(out.events)}`);
    assert.ok(out.lost && !out.lostAfter, "engine.lost until restart()");
    assert.equal(out.refused, "DEVICE_LOST", "a request on the lost engine is refused");
    assert.equal(out.source, "cache", `restart() reads the Cache API, not the network (${out.phases})`);
    assert.ok(!out.phases.includes("download") && out.phases.at(-1) === "ready", JSON.stringify(out.phases));
    assert.ok(out.answer.length > 0, "the restarted engine answers");
    assert.equal(out.notLost, "INVALID_ARGUMENT", "restart() refuses an engine whose device is fine");
  });

  it("fails pending calls with WORKER_FAILED when its worker dies (an uncaught error, a silent end, a wasm trap), and the next createEngine works", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const code = (p) => p.then(() => null, (e) => e.code);
      const ask = (content, max_tokens) => ({ messages: [{ role: "user", content }], max_tokens, temperature: 0 });
      const crashed = await code(createEngine("/tiny.gguf?crash", { workerUrl: "/dying-worker.js" }));
      const engine = await createEngine("/tiny.gguf", { workerUrl: "/dying-worker.js", maxBatch: 1 });
      const t0 = performance.now();
      const stream = await engine.chat.completions.create({ ...ask("EXIT, then count to a hundred.", 200), stream: true });
      const queued = code(engine.chat.completions.create(ask("Name a color.", 4)));
      let chunks = 0;
      const streamed = await (async () => {
        try {
          for await (const _ of stream) chunks += 1;
          return null;
        } catch (e) {
          return e.code;
        }
      })();
      const seconds = (performance.now() - t0) / 1000;
      const later = await code(engine.stats());
      await engine.dispose();
      // A trap in the wasm engine while requests run and wait: the worker ends itself.
      const trapping = await createEngine("/tiny.gguf", { workerUrl: "/dying-worker.js", maxBatch: 1 });
      const warm = await trapping.chat.completions.create(ask("Say hi.", 2));
      const trapped = code(trapping.chat.completions.create(ask("TRAP, then count to ten.", 50)));
      const trappedQueued = code(trapping.chat.completions.create(ask("Name a color.", 4)));
      const trap = { running: await trapped, queued: await trappedQueued, later: await code(trapping.stats()), before: warm.usage.completion_tokens };
      await trapping.dispose();
      const fresh = await createEngine("/tiny.gguf");
      const answer = await fresh.chat.completions.create(ask("Name a fruit.", 3));
      await fresh.dispose();
      return { crashed, streamed, chunks, queued: await queued, later, seconds, trap, answer: answer.choices[0].message.content };
    });
    assert.equal(out.crashed, "WORKER_FAILED", `an uncaught error in the worker fails the load: ${JSON.stringify(out)}`);
    assert.equal(out.streamed, "WORKER_FAILED", `a worker that ends silently fails the running request: ${JSON.stringify(out)}`);
    assert.ok(out.chunks > 0, "the request ran before the worker ended");
    assert.equal(out.queued, "WORKER_FAILED", "and the queued one");
    assert.equal(out.later, "WORKER_FAILED", "and every later call");
    assert.ok(out.trap.before > 0, `the trapping worker answered before its trap: ${JSON.stringify(out.trap)}`);
    assert.deepEqual([out.trap.running, out.trap.queued, out.trap.later], ["WORKER_FAILED", "WORKER_FAILED", "WORKER_FAILED"],
      `a trap in the wasm engine fails the running, the queued and every later call: ${JSON.stringify(out.trap)}`);
    assert.ok(out.answer.length > 0, "a new engine answers");
  });

  it("runs on a phone's device limits and under a memory cap that shrinks its pool; a cap that cannot fit is OUT_OF_MEMORY, naming the sizes", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const refusal = (p) => p.then(() => null, (e) => ({ code: e.code, message: e.message }));
      const ask = { messages: [{ role: "user", content: "Name a fruit." }], max_tokens: 8, temperature: 0 };
      const total = (m) => m.weights_bytes + m.kv_bytes + m.graph_bytes;
      // Device limits and a cap on device memory: the WebGPU backend's.
      const gpu = { backend: "webgpu" };
      const plain = await createEngine("/tiny.gguf", gpu);
      const want = (await plain.chat.completions.create(ask)).choices[0].message.content;
      const { pool: plainPool, memory: plainMemory } = await plain.stats();
      const perToken = plain.info.kv.bytes_per_token;
      await plain.dispose();
      // Under the weights; then just over them, which names what a step's activations take.
      const under = await refusal(createEngine("/tiny.gguf", { ...gpu, maxMemoryBytes: Math.floor(plainMemory.weights_bytes / 2) }));
      const tight = await refusal(createEngine("/tiny.gguf", { ...gpu, maxMemoryBytes: plainMemory.weights_bytes + 1 }));
      const activations = Number(/activations \((\d+)\)/.exec(tight?.message ?? "")?.[1]);
      // Room for the weights, the activations and 200 tokens of K/V, on a phone's limits.
      const cap = plainMemory.weights_bytes + activations + 200 * perToken;
      const phone = await createEngine("/tiny.gguf", { ...gpu, deviceLimits: "phone", maxMemoryBytes: cap });
      const got = (await phone.chat.completions.create(ask)).choices[0].message.content;
      const { pool, memory } = await phone.stats();
      await phone.dispose();
      const badLimits = await refusal(createEngine("/tiny.gguf", { ...gpu, deviceLimits: "tablet" }));
      return { want, got, cap, held: total(memory), memory, poolTokens: pool.blocks_total * pool.block_size, plainPoolTokens: plainPool.blocks_total * plainPool.block_size, under, tight, activations, badLimits };
    });
    assert.equal(out.under?.code, "OUT_OF_MEMORY", `a cap under the weights: ${JSON.stringify(out.under)}`);
    assert.match(out.under.message, /weights/, "and it says what takes the memory");
    assert.equal(out.tight?.code, "OUT_OF_MEMORY", `a cap that leaves no KV block: ${JSON.stringify(out.tight)}`);
    assert.ok(out.activations > 0, `the refusal names a step's activations: ${out.tight?.message}`);
    assert.equal(out.got, out.want, "a phone's limits and a cap give the same greedy reply");
    assert.ok(out.held <= out.cap, `the engine holds ${out.held} bytes under its cap of ${out.cap}: ${JSON.stringify(out.memory)}`);
    assert.ok(out.poolTokens >= 128 && out.poolTokens < out.plainPoolTokens, `the pool shrank to what the cap leaves: ${out.poolTokens} of ${out.plainPoolTokens} tokens`);
    assert.equal(out.badLimits?.code, "INVALID_ARGUMENT", `an unknown deviceLimits: ${JSON.stringify(out.badLimits)}`);
  });

  it("runs on the CPU backend: the WebGPU backend's greedy reply, in the relaxed-SIMD build and in the SIMD128 one where that is not served, auto (the default) takes it on a software GPU and says why, a bad backend is INVALID_ARGUMENT", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const ask = { messages: [{ role: "user", content: "Name a fruit." }], max_tokens: 12, temperature: 0 };
      const reply = async (options) => {
        const engine = await createEngine("/tiny.gguf", options);
        const text = (await engine.chat.completions.create(ask)).choices[0].message.content;
        const { memory } = await engine.stats();
        const info = engine.info;
        await engine.dispose();
        return { text, info, memory };
      };
      const webgpu = await reply({ backend: "webgpu" });
      const cpu = await reply({ backend: "cpu" });
      const auto = await reply({ backend: "auto" });
      const byDefault = await reply({});
      // A CPU step waits on nothing: the worker still hears an abort, and a request sent
      // mid-stream, between its steps.
      const engine = await createEngine("/tiny.gguf", { backend: "cpu" });
      const controller = new AbortController();
      const stream = await engine.chat.completions.create({ ...ask, max_tokens: 200, stream: true, signal: controller.signal });
      const abort = { pieces: 0, joined: null };
      try {
        for await (const chunk of stream) {
          if (!chunk.choices[0]?.delta?.content) continue;
          if (++abort.pieces === 2) abort.joined = engine.chat.completions.create({ ...ask, max_tokens: 3 });
          if (abort.pieces === 4) controller.abort();
        }
        abort.code = "resolved";
      } catch (e) {
        abort.code = e.code;
        abort.partial = e.partial?.usage.completion_tokens;
      }
      abort.joined = (await abort.joined).usage.completion_tokens;
      await engine.dispose();
      const bad = await createEngine("/tiny.gguf", { backend: "gpu" }).then(() => null, (e) => e.code);
      return { webgpu, cpu, auto, byDefault, abort, bad };
    });
    // A server without the relaxed-SIMD build: the worker says so and takes the SIMD128 one.
    await page.route("**/pagedlm_relaxed_bg.wasm", (r) => r.fulfill({ status: 404 }));
    const warnings = [];
    const onConsole = (m) => { if (m.type() === "warning") warnings.push(m.text()); };
    page.on("console", onConsole);
    const simd128 = await page.evaluate(async () => {
      const engine = await window.pagedlm.createEngine("/tiny.gguf", { backend: "cpu" });
      const text = (await engine.chat.completions.create({ messages: [{ role: "user", content: "Name a fruit." }], max_tokens: 12, temperature: 0 })).choices[0].message.content;
      const { variant } = engine.info;
      await engine.dispose();
      return { text, variant };
    });
    page.off("console", onConsole);
    await page.unroute("**/pagedlm_relaxed_bg.wasm");
    assert.equal(simd128.variant, "cpu+simd128+int8-activations", JSON.stringify(simd128));
    assert.ok(warnings.some((w) => /relaxed-SIMD build did not load/.test(w)), `the worker says why: ${JSON.stringify(warnings)}`);
    assert.equal(simd128.text, out.cpu.text, "both builds give the same greedy reply");
    assert.equal(out.webgpu.info.backend, "webgpu");
    assert.equal(out.cpu.info.backend, "cpu", JSON.stringify(out.cpu.info));
    assert.equal(out.cpu.info.backend_reason, "asked for");
    assert.match(out.cpu.info.adapter, /^CPU backend/);
    // Chromium has relaxed SIMD: the worker took that build (bit-equal to the SIMD128 one, which
    // the wasm-bindgen browser suites run).
    assert.match(out.cpu.info.variant, /^cpu\+simd128\+relaxed-simd\+int8-activations$/, JSON.stringify(out.cpu.info));
    assert.ok(out.cpu.memory.weights_bytes > 0 && out.cpu.memory.kv_bytes > 0, JSON.stringify(out.cpu.memory));
    assert.equal(out.cpu.text, out.webgpu.text, "the CPU backend gives the WebGPU backend's greedy reply");
    // SwiftShader is a fallback adapter (a CPU emulation): auto leaves it for the CPU backend.
    assert.equal(out.auto.info.backend, out.webgpu.info.is_cpu ? "cpu" : "webgpu", JSON.stringify(out.auto.info));
    if (out.auto.info.backend === "cpu") assert.match(out.auto.info.backend_reason, /CPU emulation/);
    assert.deepEqual([out.byDefault.info.backend, out.byDefault.info.backend_reason], [out.auto.info.backend, out.auto.info.backend_reason], "the default is auto");
    assert.equal(out.byDefault.text, out.webgpu.text);
    assert.equal(out.abort.code, "ABORTED", `an abort mid-stream on the CPU backend: ${JSON.stringify(out.abort)}`);
    assert.ok(out.abort.partial >= 4 && out.abort.partial < 100, `it stops the stream within a few steps: ${JSON.stringify(out.abort)}`);
    assert.equal(out.abort.joined, 3, "a request sent mid-stream runs");
    assert.equal(out.bad, "INVALID_ARGUMENT");
  });

  it("speculative decoding (the default): the same reply as speculative off, with prompt lookup and a prediction, counted in usage.completion_tokens_details, streamed too; bad values are INVALID_ARGUMENT", { timeout: TIMEOUT }, async () => {
    const out = await page.evaluate(async () => {
      const { createEngine } = window.pagedlm;
      const messages = [{ role: "user", content: "Repeat this sentence exactly: Alice was beginning to get very tired of sitting by her sister on the bank." }];
      const opts = { messages, max_tokens: 30, temperature: 0 };
      const off = await createEngine("/model.gguf", { backend: "cpu", speculative: "off" });
      const plain = await off.chat.completions.create(opts);
      await off.dispose();
      // The default is speculative: "auto".
      const on = await createEngine("/model.gguf", { backend: "cpu", maxDraft: 7 });
      const prediction = { type: "content", content: plain.choices[0].message.content };
      const predicted = await on.chat.completions.create({ ...opts, prediction });
      const lookup = await on.chat.completions.create(opts);
      // Text parts, as OpenAI's SDK types the prediction's content too.
      const half = prediction.content.length >> 1;
      const parts = [{ type: "text", text: prediction.content.slice(0, half) }, { type: "text", text: prediction.content.slice(half) }];
      const inParts = await on.chat.completions.create({ ...opts, prediction: { type: "content", content: parts } });
      const offByRequest = await on.chat.completions.create({ ...opts, prediction, speculative: "off" });
      const chunks = [];
      for await (const c of await on.chat.completions.create({ ...opts, prediction, stream: true, stream_options: { include_usage: true } })) chunks.push(c);
      const code = async (p) => p.then(() => "resolved", (e) => e.code);
      const badRequest = await code(on.chat.completions.create({ ...opts, speculative: "always" }));
      const badPrediction = await code(on.chat.completions.create({ ...opts, prediction: { type: "text", text: "x" } }));
      await on.dispose();
      const badEngine = await code(createEngine("/model.gguf", { backend: "cpu", speculative: "yes" }));
      const streamed = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
      return { plain, predicted, lookup, inParts, offByRequest, streamed, lastUsage: chunks.at(-1).usage, badRequest, badPrediction, badEngine };
    });
    const text = out.plain.choices[0].message.content;
    assert.deepEqual(out.plain.usage.completion_tokens_details, { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 }, "off: nothing drafted");
    for (const [what, c] of [["a prediction", out.predicted], ["prompt lookup", out.lookup], ["a prediction in text parts", out.inParts], ["speculative off per request", out.offByRequest]]) {
      assert.equal(c.choices[0].message.content, text, `${what}: the reply speculation off gives`);
      assert.equal(c.usage.completion_tokens, out.plain.usage.completion_tokens, what);
    }
    assert.deepEqual(out.inParts.usage.completion_tokens_details, out.predicted.usage.completion_tokens_details, "text parts predict as their joined text");
    const taken = out.predicted.usage.completion_tokens_details.accepted_prediction_tokens;
    assert.ok(taken * 2 >= out.predicted.usage.completion_tokens, `the reply as its own prediction: ${taken} of ${out.predicted.usage.completion_tokens} tokens taken`);
    const looked = out.lookup.usage.completion_tokens_details.accepted_prediction_tokens;
    assert.ok(looked > 0, `an engine with the default options drafts by prompt lookup (the reply repeats the prompt): ${JSON.stringify(out.lookup.usage)}`);
    assert.deepEqual(out.offByRequest.usage.completion_tokens_details, { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 }, "a request's own off wins");
    assert.equal(out.streamed, text, "streamed with a prediction: the same reply");
    assert.ok(out.lastUsage.completion_tokens_details.accepted_prediction_tokens > 0, `the last chunk's usage counts the drafts: ${JSON.stringify(out.lastUsage)}`);
    assert.deepEqual([out.badRequest, out.badPrediction, out.badEngine], ["INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]);
  });

  it("says WEBGPU_UNAVAILABLE without WebGPU when asked for it, and runs there on the CPU backend (backend cpu, auto or the default)", { timeout: TIMEOUT }, async () => {
    const plain = await launch({ webgpu: false });
    try {
      const { page: p } = await openPage(plain, `${server.url}/`);
      await p.waitForFunction(() => document.title === "ready", null, { timeout: 30_000 });
      const got = await p.evaluate(() => window.pagedlm.createEngine("/model.gguf", { backend: "webgpu" }).then(() => "resolved", (e) => ({ code: e.code, message: e.message })));
      assert.equal(got.code, "WEBGPU_UNAVAILABLE");
      assert.match(got.message, /--enable-unsafe-webgpu|WebGPU/);
      const cpu = await p.evaluate(async () => {
        const ask = { messages: [{ role: "user", content: "Name a fruit." }], max_tokens: 6, temperature: 0 };
        const out = {};
        for (const backend of ["cpu", "auto", "default"]) {
          const engine = await window.pagedlm.createEngine("/tiny.gguf", backend === "default" ? {} : { backend });
          const reply = await engine.chat.completions.create(ask);
          out[backend] = { info: engine.info, tokens: reply.usage.completion_tokens };
          await engine.dispose();
        }
        return out;
      });
      for (const backend of ["cpu", "auto", "default"]) {
        assert.equal(cpu[backend].info.backend, "cpu", `${backend}: ${JSON.stringify(cpu[backend].info)}`);
        assert.ok(cpu[backend].tokens > 0, `${backend}: it answers without WebGPU`);
      }
      for (const backend of ["auto", "default"]) assert.match(cpu[backend].info.backend_reason, /^auto: no usable WebGPU adapter/, cpu[backend].info.backend_reason);
    } finally {
      await plain.close();
    }
  });
});
