// End-to-end: hostile input. The package's API fed random values for every option and message
// field (wrong types, NaN, huge numbers and strings, values a Worker cannot receive); the page's
// saved conversations corrupted in IndexedDB; a model whose name is HTML. All on a tiny
// synthetic model (examples/write_tiny_model.rs), so that hundreds of calls take seconds.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { byId, launch, openPage, root, startServer, tinyModel } from "./helpers.mjs";

const HOSTILE_NAME = `<img src=x onerror="window.__xss=(window.__xss||0)+1"><b>bold</b> & "tiny"`;
/** The codes index.d.ts documents; INTERNAL and GPU_ERROR are the engine's own failures, not refusals. */
const CODES = [...readFileSync(join(root, "js/index.d.ts"), "utf8").match(/export type ErrorCode =([^;]*);/)[1].matchAll(/"([A-Z_]+)"/g)].map((m) => m[1]);
/** A dead worker or a lost device is a crash, not a refusal: only a hostile `workerUrl` may fail the worker. */
const CRASHES = ["INTERNAL", "GPU_ERROR", "WORKER_FAILED", "DEVICE_LOST"];
const REFUSALS = CODES.filter((c) => !CRASHES.includes(c));
const refused = (f) => REFUSALS.includes(f.code) || (f.code === "WORKER_FAILED" && /^createEngine .*workerUrl/.test(f.what));
const CALLS = Number(process.env.PAGEDLM_FUZZ_CALLS || 300);
const SEED = Number(process.env.PAGEDLM_FUZZ_SEED || 20261204);

describe("hostile input", () => {
  let server;
  let browser;

  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    tinyModel("tiny.gguf");
    const dir = tinyModel("html-name.gguf", ["--name", HOSTILE_NAME]);
    server = await startServer({ PAGEDLM_MODELS_DIR: dir });
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    server?.close();
  });

  it(`the JS API: ${CALLS} calls with random values settle with a documented code, and the engine keeps serving`, { timeout: 900_000 }, async () => {
    const { page, problems } = await openPage(browser, `${server.url}/blank`);
    const out = await page.evaluate(fuzzApi, { calls: CALLS, seed: SEED });
    const byCode = Object.entries(out.outcomes).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", ");
    console.log(`API fuzz (seed ${SEED}): ${out.calls} calls and 16 loads in ${(out.ms / 1000).toFixed(1)} s: ${byCode}`);
    const wrong = out.failures.filter((f) => !refused(f));
    assert.deepEqual(wrong.slice(0, 10), [], `calls that did not settle with a documented refusal (${wrong.length} in all)`);
    assert.ok((out.outcomes.ok ?? 0) > out.calls / 10, `some calls must be accepted and run (${byCode})`);
    assert.ok((out.outcomes.INVALID_ARGUMENT ?? 0) > out.calls / 10, `some calls must be refused (${byCode})`);
    assert.ok(out.served, `the engine answers a plain request after the fuzz: ${out.servedError}`);
    assert.equal(out.pool.blocks_free + out.pool.blocks_cached, out.pool.blocks_total, `every block is free or cached when idle: ${JSON.stringify(out.pool)}`);
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
  });

  it("stored page data: damaged IndexedDB records are dropped, the page says so and loads the rest", { timeout: 240_000 }, async () => {
    const context = await browser.newContext();
    const { page, problems } = await openPage(context, `${server.url}/blank`);
    await page.evaluate(seedRecords);
    await page.goto(`${server.url}/?model=/models/tiny.gguf&max_tokens=4&temperature=0`);
    await page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: 120_000 });
    const notice = page.locator(byId("store-notice"));
    assert.equal(await notice.getAttribute("data-dropped"), String(DAMAGED), `the page says ${DAMAGED} records were dropped: ${await notice.textContent()}`);
    const restored = await page.locator(`${byId("conversation")}[data-restored="true"]`).count();
    assert.equal(restored, GOOD, "the good records are back");
    const left = await page.evaluate(() => new Promise((resolve, reject) => {
      const open = indexedDB.open("pagedlm-chat", 1);
      open.onerror = () => reject(open.error);
      open.onsuccess = () => {
        const keys = open.result.transaction("conversations").objectStore("conversations").getAllKeys();
        keys.onsuccess = () => resolve(keys.result);
      };
    }));
    assert.deepEqual(left, [1, 2], "only the good records stay stored");
    // A restored conversation with a damaged snapshot continues (the snapshot is dropped).
    await page.locator(`${byId("conversation")}[data-conversation="2"]`).click();
    await page.fill(byId("chat-input"), "and then?");
    await page.click(byId("send-button"));
    await page.waitForSelector(`${byId("message-assistant")}[data-done="true"] >> nth=1`, { timeout: 120_000 });
    const error = await page.locator(`${byId("message-assistant")} .message-error`).count();
    assert.equal(error, 0, "the turn after a damaged snapshot runs");
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
    await context.close();
  });

  it("the page runs on the CPU backend when asked (?backend=cpu) and says so", { timeout: 240_000 }, async () => {
    const context = await browser.newContext();
    const { page, problems } = await openPage(context, `${server.url}/?model=/models/tiny.gguf&backend=cpu&max_tokens=4&temperature=0`);
    await page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: 120_000 });
    const adapter = page.locator("#adapter");
    assert.equal(await adapter.getAttribute("data-backend"), "cpu");
    assert.match(await adapter.textContent(), /^CPU backend/);
    await page.fill(byId("chat-input"), "hi");
    await page.click(byId("send-button"));
    await page.waitForSelector(`${byId("message-assistant")}[data-done="true"]`, { timeout: 120_000 });
    assert.equal(await page.locator(`${byId("message-assistant")} .message-error`).count(), 0, "the reply runs on the CPU backend");
    assert.ok(Number(await page.locator(byId("kv-stats")).getAttribute("data-blocks-total")) > 0, "the KV map shows the CPU backend's pool");
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
    await context.close();
  });

  it("text from a GGUF (its name) is shown as text, never as HTML", { timeout: 240_000 }, async () => {
    const context = await browser.newContext();
    const { page, problems } = await openPage(context, `${server.url}/?model=/models/html-name.gguf`);
    await page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: 120_000 });
    const shown = await page.evaluate(() => ({
      xss: window.__xss ?? 0,
      images: document.querySelectorAll("img").length,
      bold: [...document.querySelectorAll("b")].filter((b) => b.textContent === "bold").length,
      text: document.body.innerText,
      line: document.getElementById("model-name")?.textContent ?? "",
    }));
    assert.equal(shown.xss, 0, "no handler from the file ran");
    assert.equal(shown.images + shown.bold, 0, "no element from the file was made");
    assert.ok(shown.line.includes(HOSTILE_NAME), `the model line shows the file's name as text: ${JSON.stringify(shown.line)}`);
    const info = await page.evaluate(() => window.chatPage.engine.info.model.name);
    assert.equal(info, HOSTILE_NAME, "engine.info keeps the name as it is");
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
    await context.close();
  });
});

const GOOD = 2;
const DAMAGED = 7;

/** Writes 2 good conversation records (one with a damaged snapshot) and 7 damaged ones. In the page. */
function seedRecords() {
  const history = [{ role: "user", content: "hi" }, { role: "assistant", content: "hello" }];
  const good = [
    { id: 1, title: "good", system: null, history, turns: 1, snapshot: null },
    { id: 2, title: "good, damaged snapshot", system: "be brief", history, turns: 1, snapshot: new Uint8Array([80, 75, 86, 1, 2, 3]) },
  ];
  const damaged = [
    { id: 3, title: "history not a list", system: null, history: "hi", turns: 1, snapshot: null },
    { id: 4, title: "a message without content", system: null, history: [{ role: "user" }], turns: 1, snapshot: null },
    { id: 5, title: "an unknown role", system: null, history: [{ role: "<script>", content: "x" }], turns: 1, snapshot: null },
    { id: 6, title: { html: "<b>x</b>" }, system: null, history, turns: 1, snapshot: null },
    { id: 7, title: "snapshot as text", system: null, history, turns: 1, snapshot: "not bytes" },
    { id: "eight", title: "a key that is not a number", system: null, history, turns: 1, snapshot: null },
    { id: 9, title: "bad tool calls", system: null, history: [{ role: "assistant", content: null, tool_calls: [{ id: 1 }] }], turns: -2, snapshot: null },
  ];
  return new Promise((resolve, reject) => {
    const open = indexedDB.open("pagedlm-chat", 1);
    open.onupgradeneeded = () => open.result.createObjectStore("conversations", { keyPath: "id" });
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const tx = open.result.transaction("conversations", "readwrite");
      for (const r of [...good, ...damaged]) tx.objectStore("conversations").put(r);
      tx.oncomplete = () => { open.result.close(); resolve(); };
      tx.onerror = () => reject(tx.error);
    };
  });
}

/**
 * In the page: `calls` random calls on an engine over the tiny model, 4 at a time (so that they
 * batch and preempt each other in a small pool), each a valid call with one to three fields
 * replaced by a hostile value. Returns the outcomes by code and every failure that is not a
 * refusal of the package's own.
 */
async function fuzzApi({ calls, seed }) {
  const { createEngine, PagedlmError } = await import("/js/index.js");
  let state = seed >>> 0;
  const rand = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const hostile = () => pick([
    undefined, null, NaN, Infinity, -Infinity, -1, 0, 0.5, 1, 3, 2 ** 31, 2 ** 53, 1e308, -1e308, "", "0", "NaN", "x".repeat(200_000),
    "<|im_end|>", "\u0000\uffff\ud800", [], [1, "a"], [null], {}, { a: 1 }, { type: "nope" }, true, false, () => 1, Symbol("s"), 10n,
    new Date(0), new Uint8Array(5), new ArrayBuffer(3), new Map(),
  ]);
  const message = () => pick([
    { role: "user", content: "Count." },
    { role: "system", content: "Be brief." },
    { role: "assistant", content: "Sure." },
    { role: "developer", content: [{ type: "text", text: "hi" }] },
    { role: "tool", tool_call_id: "c1", content: "42" },
    { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] },
    { role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] },
  ]);
  const tool = { type: "function", function: { name: "f", description: "a function", parameters: { type: "object", properties: { a: { type: "integer" } } } } };
  const base = () => ({
    messages: [message(), { role: "user", content: "Say something." }],
    max_tokens: 1 + Math.floor(rand() * 24),
    temperature: pick([0, 0.7, 1.3]),
    top_p: pick([undefined, 0.9, 1]),
    top_k: pick([undefined, 0, 40]),
    seed: pick([undefined, 7]),
    stop: pick([undefined, "a", ["b", "c"]]),
    repetition_penalty: pick([undefined, 1.1]),
    stream: rand() < 0.5,
    ...pick([{}, {}, { response_format: { type: "json_object" } }, { grammar: 'start: "a"+' }, { tools: [tool], tool_choice: pick(["auto", "required", "none"]) }]),
  });
  const fields = ["messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty", "stream", "stream_options",
    "response_format", "grammar", "tools", "tool_choice", "parallel_tool_calls", "signal", "n", "model", "unknown_option"];
  /** One to three fields of `params` (or of its messages) replaced by hostile values. */
  const mutate = (params) => {
    for (let k = 1 + Math.floor(rand() * 3); k > 0; k--) {
      const r = rand();
      if (r < 0.25 && Array.isArray(params.messages)) {
        const m = { ...pick(params.messages) };
        m[pick(["role", "content", "tool_calls", "tool_call_id", "name"])] = hostile();
        params.messages = [...params.messages, m];
      } else if (r < 0.3) {
        params.messages = hostile();
      } else {
        params[pick(fields)] = hostile();
      }
    }
    return params;
  };

  const outcomes = {};
  const failures = [];
  const count = (key) => { outcomes[key] = (outcomes[key] ?? 0) + 1; };
  const codeOf = (e) => (e instanceof PagedlmError ? e.code : e?.code === "HUNG" ? "HUNG" : `${e?.name}: ${e?.message}`.slice(0, 160));

  // createEngine's options, each of a few loads given a hostile value or two.
  const engineOptions = ["kvDtype", "kvLayout", "blockSize", "poolTokens", "maxContext", "prefillChunk", "prefixCache", "maxBatch", "stepTokens",
    "maxBindingMib", "deviceLimits", "maxMemoryBytes", "adapterClass", "optionalFeatures", "backend", "onProgress", "cache", "cacheName", "workerUrl", "unknownOption"];
  for (let i = 0; i < 16; i++) {
    const options = { maxContext: 64 };
    for (let k = 1 + Math.floor(rand() * 2); k > 0; k--) options[pick(engineOptions)] = hostile();
    const what = `createEngine ${Object.keys(options).join(",")}`;
    try {
      const loaded = await createEngine(pick(["/models/tiny.gguf", "/models/tiny.gguf", hostile()]), options);
      await loaded.dispose();
      count("ok");
    } catch (e) {
      count(codeOf(e));
      failures.push({ i: -1 - i, what, code: codeOf(e), message: String(e?.message).slice(0, 200) });
    }
  }

  const engine = await createEngine("/models/tiny.gguf", { maxContext: 128, poolTokens: 192, blockSize: 8, maxBatch: 4 });
  /** Settles within 120 s, or counts as hung. */
  const settled = (promise) => Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(Object.assign(new Error("hung"), { code: "HUNG" })), 120_000))]);
  const one = async (i) => {
    const kind = rand();
    let what = "";
    try {
      if (kind < 0.75) {
        const params = mutate(base());
        what = `chat ${Object.keys(params).join(",")}`;
        await settled((async () => {
          const result = await engine.chat.completions.create(params);
          if (params.stream === true) {
            let n = 0;
            const stopAt = rand() < 0.2 ? 2 : Infinity;
            for await (const _ of result) if (++n >= stopAt) break;
          } else if (!Array.isArray(result?.choices)) {
            throw new Error(`a completion without choices: ${JSON.stringify(result)?.slice(0, 200)}`);
          }
        })());
      } else if (kind < 0.85) {
        const params = mutate({ prompt: "Once upon a time", max_tokens: 8, stream: rand() < 0.5 });
        params.prompt = rand() < 0.5 ? hostile() : params.prompt;
        what = `completion ${Object.keys(params).join(",")}`;
        await settled((async () => {
          const result = await engine.completions.create(params);
          if (params.stream === true) for await (const _ of result);
        })());
      } else if (kind < 0.92) {
        what = "importConversation";
        await settled(engine.importConversation(pick([new Uint8Array(64).map(() => rand() * 256), hostile()])));
      } else if (kind < 0.97) {
        what = "exportConversation";
        await settled(engine.exportConversation(rand() < 0.5 ? [message(), { role: "user", content: "x" }] : hostile()));
      } else {
        what = "stats";
        const stats = await settled(engine.stats());
        if (typeof stats?.pool?.blocks_total !== "number") throw new Error("stats without a pool");
      }
      count("ok");
    } catch (e) {
      count(codeOf(e));
      failures.push({ i, what: what.slice(0, 200), code: codeOf(e), message: String(e?.message).slice(0, 200) });
    }
  };
  const t0 = performance.now();
  let next = 0;
  await Promise.all([0, 1, 2, 3].map(async () => {
    while (next < calls) await one(next++);
  }));
  const ms = performance.now() - t0;
  let served = false;
  let servedError = null;
  try {
    const answer = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
    served = answer.choices[0].message.content.length > 0 || answer.usage.completion_tokens > 0;
  } catch (e) {
    servedError = `${e.code}: ${e.message}`;
  }
  const { pool } = await engine.stats();
  await engine.dispose();
  return { calls, ms, outcomes, failures: failures.filter((f) => !["INVALID_ARGUMENT", "UNSUPPORTED", "ABORTED", "CONTEXT_OVERFLOW", "KV_POOL_FULL", "SNAPSHOT_CORRUPT", "SNAPSHOT_MISMATCH"].includes(f.code)), served, servedError, pool };
}
