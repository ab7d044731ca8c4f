// End-to-end: the chat page in headless Chromium (WebGPU on SwiftShader) against the real model.
// Needs pkg/ (bash scripts/build-web.sh) and models/ (npm run fetch-model). Run: node --test tests/e2e/
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { byId, launch, MODEL, openPage, results, root, startServer, tinyModel } from "./helpers.mjs";

// Small replies keep the test quick: SwiftShader decodes a few tokens per second.
const MAX_TOKENS = 8;
/** A limit no reply reaches before the test stops it (in tests that look at replies while they run). */
const LONG_REPLY = 1000;
const LOAD_TIMEOUT = 240_000;
const REPLY_TIMEOUT = 120_000;

/** Waits for the model to be ready; fails at once with the page's error panel if loading fails. */
async function waitForModel(page, problems) {
  const ready = page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: LOAD_TIMEOUT });
  const failed = page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: LOAD_TIMEOUT })
    .then(async (el) => { throw new Error(`the page failed to load the model: ${await el.innerText()}\n${problems.join("\n")}`); });
  await Promise.race([ready, failed]);
  failed.catch(() => {});
}

/** Types `text` and clicks send. */
async function ask(page, text) {
  await page.fill(byId("chat-input"), text);
  await page.click(byId("send-button"));
}

async function waitDone(page, n) {
  await page.waitForSelector(`${byId("message-assistant")}[data-done="true"] >> nth=${n}`, { timeout: REPLY_TIMEOUT });
  const msg = page.locator(byId("message-assistant")).nth(n);
  const num = async (name) => Number(await msg.getAttribute(name));
  return {
    text: (await msg.locator(".body").textContent()) ?? "",
    promptTokens: await num("data-prompt-tokens"),
    tokens: await num("data-tokens"),
    prefixHit: await num("data-prefix-hit"),
    finish: await msg.getAttribute("data-finish-reason"),
    error: await msg.locator(".message-error").count() ? await msg.locator(".message-error").textContent() : null,
  };
}

async function kvStats(page) {
  return page.$eval(byId("kv-stats"), (el) => ({
    total: Number(el.dataset.blocksTotal), used: Number(el.dataset.blocksUsed), cached: Number(el.dataset.blocksCached),
    hit: Number(el.dataset.lastPrefixHit),
  }));
}

/** How many map cells are in each drawn kind. */
async function kvCells(page) {
  return page.$$eval(`${byId("kv-map")} .kv-cell`, (cells) => {
    const count = { free: 0, owned: 0, evictable: 0, shared: 0, cached: 0, growing: 0, held: 0 };
    for (const c of cells) {
      for (const k of Object.keys(count)) if (c.classList.contains(k)) count[k] += 1;
      if (c.dataset.state === "1") count.held += 1;
    }
    return count;
  });
}

describe("chat page", () => {
  let server;
  let browser;
  let page;
  let problems;

  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    assert.ok(existsSync(MODEL), "the model is missing: run `npm run fetch-model`");
    mkdirSync(results, { recursive: true });
    server = await startServer();
    browser = await launch();
    ({ page, problems } = await openPage(browser, `${server.url}/?max_tokens=${MAX_TOKENS}&temperature=0`));
  });

  after(async () => {
    await browser?.close();
    server?.close();
  });

  it("loads the model with progress, and from the browser cache after a reload", { timeout: 2 * LOAD_TIMEOUT }, async () => {
    const t0 = Date.now();
    await waitForModel(page, problems);
    console.log(`model ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    assert.match(await page.locator(byId("model-progress")).innerText(), /ready/i);
    assert.equal(await page.getAttribute(byId("model-progress"), "data-source"), "network");
    assert.equal(await page.isEnabled(byId("chat-input")), true);
    const kv = await kvStats(page);
    assert.ok(kv.total > 0, "the pool has blocks");
    assert.equal(kv.used, 0, "nothing is held before the first message");
    assert.equal(await page.locator(`${byId("kv-map")} .kv-cell`).count(), kv.total, "one map cell per block");

    await page.reload();
    await waitForModel(page, problems);
    assert.equal(await page.getAttribute(byId("model-progress"), "data-source"), "cache", "a reload reads the model from the Cache API");
  });

  // What the page shows while a reply runs is checked on long replies (stopped mid-way, below):
  // an eight-token reply can end before a look at the page (the CPU backend, which a software
  // GPU gets by default, writes one in a fraction of a second).
  it("replies, then a follow-up hits the prefix cache", { timeout: 3 * REPLY_TIMEOUT }, async () => {
    await ask(page, "What is the capital of France?");
    const first = await waitDone(page, 0);
    assert.equal(first.error, null, `the reply failed: ${first.error}`);
    assert.ok(first.text.trim().length > 0, "the first reply is empty");
    assert.ok(first.tokens >= 1 && first.tokens <= MAX_TOKENS, `max_tokens=${MAX_TOKENS} from the URL is honoured (got ${first.tokens})`);
    assert.equal(await page.locator(byId("message-user")).first().textContent(), "What is the capital of France?");
    const afterFirst = await kvStats(page);
    assert.ok(afterFirst.cached > 0, "the finished turn's blocks stay cached for the next turn");
    console.log(`reply 1 (${first.tokens} tokens, ${first.finish}, hit ${first.prefixHit}): ${JSON.stringify(first.text)}`);

    await ask(page, "And what is the capital of Italy?");
    const second = await waitDone(page, 1);
    assert.equal(second.error, null, `the follow-up failed: ${second.error}`);
    assert.ok(second.text.trim().length > 0, "the follow-up reply is empty");
    assert.ok(second.promptTokens > first.promptTokens + first.tokens,
      `the follow-up prompt (${second.promptTokens} tokens) carries the first turn (${first.promptTokens} + ${first.tokens})`);
    assert.ok(second.prefixHit >= first.promptTokens - 1,
      `the follow-up reuses at least the first prompt's KV (hit ${second.prefixHit}, first prompt ${first.promptTokens})`);
    const kv = await kvStats(page);
    assert.equal(kv.hit, second.prefixHit, "the KV panel shows the last prefix hit");
    assert.match(await page.locator(byId("turn-stats")).innerText(), new RegExp(`${second.prefixHit}/${second.promptTokens}`));
    const cells = await kvCells(page);
    assert.ok(cells.owned + cells.shared >= Math.ceil(second.promptTokens / 16) - 1, `the map attributes the conversation's blocks to it (${JSON.stringify(cells)})`);
    await page.screenshot({ path: join(results, "chat-follow-up.png") });
    console.log(`reply 2 (${second.tokens} tokens, ${second.finish}, hit ${second.prefixHit}/${second.promptTokens}): ${JSON.stringify(second.text)}`);
  });

  it("runs two conversations at once, each with its own reply", { timeout: 4 * REPLY_TIMEOUT }, async () => {
    const firstConversation = page.locator(byId("conversation")).first();
    await page.click(byId("new-conversation"));
    assert.equal(await page.locator(byId("message-user")).count(), 0, "a new conversation starts empty");
    assert.equal(await page.locator(byId("conversation")).count(), 2);
    // Long replies, so that both are still running when the page is looked at; stopped below.
    await page.fill("#max-tokens", String(LONG_REPLY));
    const fruitQuestion = "Tell me a long story about a fruit.";
    const animalQuestion = "Tell me a long story about an animal.";
    await ask(page, fruitQuestion);
    await page.click(byId("new-conversation"));
    await ask(page, animalQuestion);
    // Both are in flight now, batched by the engine's scheduler: while the second streams, the
    // map shows blocks held by both conversations.
    assert.equal(await page.locator(`${byId("conversation")}.busy`).count(), 2, "both conversations are generating");
    await page.waitForFunction(() => {
      const colors = new Set([...document.querySelectorAll('[data-testid="kv-map"] .kv-cell.growing')].map((c) => c.style.getPropertyValue("--c")));
      const body = document.querySelector('[data-testid="message-assistant"] .body');
      return colors.size >= 2 && body.textContent.length > 0;
    }, null, { timeout: REPLY_TIMEOUT });
    await page.screenshot({ path: join(results, "chat-two-conversations.png") });
    await page.click(byId("stop-button"));
    const animal = await waitDone(page, 0);
    assert.equal(animal.error, null, `the second conversation failed: ${animal.error}`);
    assert.ok(animal.text.trim().length > 0);
    assert.equal(await page.locator(byId("message-user")).first().textContent(), animalQuestion);

    await page.locator(byId("conversation")).nth(1).click();
    // Stopped too, unless it has ended by itself (a disabled button's click does nothing).
    await page.$eval(byId("stop-button"), (b) => b.click());
    const fruit = await waitDone(page, 0);
    await page.fill("#max-tokens", String(MAX_TOKENS));
    assert.equal(fruit.error, null, `the first conversation failed: ${fruit.error}`);
    assert.ok(fruit.text.trim().length > 0);
    assert.equal(await page.locator(byId("message-user")).count(), 1);
    assert.equal(await page.locator(byId("message-user")).first().textContent(), fruitQuestion);
    assert.ok(animal.prefixHit > 0 && fruit.prefixHit > 0, "conversations share the system prompt's blocks");
    const cells = await kvCells(page);
    assert.ok(cells.shared > 0, `the map shows a prefix shared by conversations (${JSON.stringify(cells)})`);
    await page.screenshot({ path: join(results, "chat-shared-prefix.png") });
    assert.ok(await firstConversation.count());
  });

  it("streams a long reply, showing its text and held blocks as it runs; stops it mid-way and frees its blocks; renders text as text", { timeout: 2 * REPLY_TIMEOUT }, async () => {
    await page.click(byId("new-conversation"));
    // A long limit, so only the stop button can end this reply early.
    await page.fill("#max-tokens", String(LONG_REPLY));
    const question = "Tell me a long story about <b>dragons</b> & knights.";
    await ask(page, question);
    // Text shows up while the reply is still being generated.
    await page.waitForFunction(() => {
      const m = document.querySelector('[data-testid="message-assistant"]');
      return m && m.dataset.done !== "true" && m.querySelector(".body").textContent.length > 0;
    }, null, { timeout: REPLY_TIMEOUT });
    // The map shows the running reply's blocks while it streams.
    await page.waitForFunction(() => [...document.querySelectorAll('[data-testid="kv-map"] .kv-cell')].some((c) => c.dataset.state === "1")
      && document.querySelector('[data-testid="message-assistant"]').dataset.done !== "true", null, { timeout: 30_000 });
    assert.ok(Number(await page.getAttribute(byId("kv-stats"), "data-blocks-used")) > 0, "kv-stats counts the held blocks");
    await page.screenshot({ path: join(results, "chat-streaming.png") });
    await page.click(byId("stop-button"));
    const reply = await waitDone(page, 0);
    assert.equal(reply.error, null, `the reply failed: ${reply.error}`);
    assert.equal(reply.finish, "abort");
    assert.ok(reply.tokens >= 1 && reply.tokens < LONG_REPLY, `stopped early (${reply.tokens} tokens)`);
    assert.ok(reply.text.length > 0, "the stopped reply keeps its partial text");
    const kv = await kvStats(page);
    assert.equal(kv.used, 0, "no block stays held once the reply is stopped (they are cached or free)");
    assert.equal((await kvCells(page)).held, 0, "the map shows no held block");
    const user = page.locator(byId("message-user")).first();
    assert.equal(await user.textContent(), question);
    assert.equal(await user.locator("b").count(), 0, "user text is not parsed as HTML");
    assert.equal(await page.isEnabled(byId("chat-input")), true);
    await page.fill("#max-tokens", String(MAX_TOKENS));
    await page.screenshot({ path: join(results, "chat-stopped.png") });
  });

  it("answers in JSON from the settings, and shows a tool call as such, whose result continues", { timeout: 4 * REPLY_TIMEOUT }, async () => {
    await page.click(byId("new-conversation"));
    // JSON output: an enum schema gives a short reply that is JSON and one of its values.
    await page.check(byId("json-output"));
    await page.fill(byId("json-schema"), '{"enum": ["yes", "no"]}');
    await ask(page, "Is the sky blue?");
    const json = await waitDone(page, 0);
    assert.equal(json.error, null, `the reply failed: ${json.error}`);
    assert.ok(['"yes"', '"no"'].includes(json.text), `a JSON enum value: ${json.text}`);
    // A schema that is not JSON fails the turn with a clear message, and nothing is lost.
    await page.fill(byId("json-schema"), "{not json");
    await ask(page, "Again?");
    const bad = await waitDone(page, 1);
    assert.match(bad.error ?? "", /not valid JSON/);
    await page.uncheck(byId("json-output"));

    // Tools, required: the reply is a call, shown as a call and not as text.
    await page.click(byId("new-conversation"));
    const lamp = [{ type: "function", function: { name: "lamp", parameters: { type: "object", properties: { on: { type: "boolean" } }, required: ["on"], additionalProperties: false } } }];
    await page.fill(byId("tools"), JSON.stringify(lamp));
    await page.selectOption(byId("tool-choice"), "required");
    await page.fill("#max-tokens", "32");
    await ask(page, "Turn the lamp on.");
    const call = await waitDone(page, 0);
    assert.equal(call.error, null, `the reply failed: ${call.error}`);
    assert.equal(call.finish, "tool_calls");
    const shown = page.locator(`${byId("message-assistant")} >> nth=0 >> ${byId("tool-call")}`);
    assert.equal(await shown.count(), 1);
    assert.equal(await shown.getAttribute("data-name"), "lamp");
    assert.match(await shown.textContent(), /^call lamp\(\{"on":(true|false)\}\)$/);
    // The next message is the tool's result; with tools on auto the conversation goes on.
    await page.selectOption(byId("tool-choice"), "auto");
    await page.fill("#max-tokens", String(MAX_TOKENS));
    await ask(page, '{"lamp": "on"}');
    const after = await waitDone(page, 1);
    assert.equal(after.error, null, `the turn after the tool result failed: ${after.error}`);
    assert.ok(after.tokens > 0);
    assert.ok(await page.locator(`${byId("message-user")}.tool-result`).count() === 1, "the result is shown as a tool result");
    assert.ok(after.prefixHit > 0, "the turn after the call reuses the conversation's K/V");
    await page.fill(byId("tools"), "");
    await page.screenshot({ path: join(results, "chat-tools.png") });
  });

  it("loads a .gguf chosen with the file picker, and says so when the file is broken", { timeout: LOAD_TIMEOUT }, async () => {
    const truncated = readFileSync(MODEL).subarray(0, 1 << 20);
    await page.setInputFiles(byId("model-file"), { name: "broken.gguf", mimeType: "application/octet-stream", buffer: truncated });
    const panel = await page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: 60_000 });
    assert.equal(await page.getAttribute(byId("error-panel"), "data-code"), "MODEL_FORMAT");
    assert.match(await panel.innerText(), /GGUF|model/i);
    await page.screenshot({ path: join(results, "broken-model.png") });

    await page.setInputFiles(byId("model-file"), MODEL);
    await waitForModel(page, problems);
    assert.equal(await page.getAttribute(byId("model-progress"), "data-source"), "file");
    assert.equal(await page.isHidden(byId("error-panel")), true);
    await page.click(byId("new-conversation"));
    await ask(page, "Hi!");
    const reply = await waitDone(page, 0);
    assert.equal(reply.error, null, `the reply failed: ${reply.error}`);
    assert.ok(reply.tokens >= 1);

    // A .gguf dropped on the page loads the same way.
    await page.evaluate(async () => {
      const bytes = await (await fetch("/models/SmolLM2-135M-Instruct.Q4_1.gguf")).arrayBuffer();
      const data = new DataTransfer();
      data.items.add(new File([bytes], "dropped.gguf"));
      window.dispatchEvent(new DragEvent("dragenter", { dataTransfer: data }));
      window.dispatchEvent(new DragEvent("drop", { dataTransfer: data, cancelable: true }));
    });
    await page.waitForSelector(`${byId("model-progress")}:not([data-done])`, { timeout: 10_000 });
    await waitForModel(page, problems);
    assert.equal(await page.getAttribute(byId("model-progress"), "data-source"), "file");
    assert.match(await page.locator("#model-name").textContent(), /^\S.* \(dropped\) · Q4_1 ×210, F32 ×61, Q8_0 ×1 · KV/, "the page shows the name in the file, where it came from and the file's weight types");
    assert.match(await page.locator("#model-name").textContent(), / · llama$/, "and its architecture (no sliding window)");
    assert.equal(await page.getAttribute(byId("model-picker"), "data-mode"), "chat", "a model with a chat template: chat mode");
    const expected = /Failed to load resource|favicon|MODEL_FORMAT|not a usable GGUF/;
    assert.deepEqual(problems.filter((p) => !expected.test(p)), [], "no page errors");
  });

  it("switches the KV cache to int8 from the settings, and the gauge shows its smaller footprint", { timeout: LOAD_TIMEOUT }, async () => {
    await page.selectOption("#kv-dtype", "int8");
    await page.waitForURL(/kv_dtype=int8/);
    const ready = page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: LOAD_TIMEOUT }).then(() => "ready");
    const failed = page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: LOAD_TIMEOUT }).then(() => "error");
    const outcome = await Promise.race([ready, failed]);
    if (outcome === "error") {
      // Until the engine offers int8, the page must say so with the engine's code.
      assert.equal(await page.getAttribute(byId("error-panel"), "data-code"), "UNSUPPORTED");
      return;
    }
    await ask(page, "Hi!");
    const reply = await waitDone(page, 0);
    assert.equal(reply.error, null, `the int8 reply failed: ${reply.error}`);
    assert.ok(reply.text.trim().length > 0);
    const note = await page.locator("#gauge-note").textContent();
    assert.match(note, /this pool: int8/);
    const [f32, int8] = await Promise.all(["#gauge-f32-value", "#gauge-int8-value"].map((s) => page.locator(s).textContent().then(parseFloat)));
    assert.ok(int8 > 0 && int8 < f32 / 3, `int8 KV takes under a third of f32 (${int8} vs ${f32} MB)`);
    await page.screenshot({ path: join(results, "chat-int8.png") });
  });
});

describe("chat page without WebGPU", () => {
  it("runs on the CPU backend by default and says why; asked for WebGPU, shows a clear error", { timeout: 240_000 }, async () => {
    tinyModel("tiny.gguf");
    const server = await startServer({ PAGEDLM_MODELS_DIR: join(results, "fixtures") });
    const browser = await launch({ webgpu: false });
    try {
      // The default backend (auto) takes the CPU backend when there is no WebGPU.
      const { page: cpu, problems } = await openPage(browser, `${server.url}/?model=/models/tiny.gguf&max_tokens=4&temperature=0`);
      await cpu.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: 120_000 });
      const adapter = cpu.locator("#adapter");
      assert.equal(await adapter.getAttribute("data-backend"), "cpu");
      assert.match(await adapter.getAttribute("title"), /no usable WebGPU adapter/);
      await cpu.fill(byId("chat-input"), "hi");
      await cpu.click(byId("send-button"));
      await cpu.waitForSelector(`${byId("message-assistant")}[data-done="true"]`, { timeout: 120_000 });
      assert.equal(await cpu.locator(`${byId("message-assistant")} .message-error`).count(), 0, "the reply runs on the CPU backend");
      assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
      await cpu.close();
      // ?backend=webgpu asks for WebGPU: a clear error, nothing loaded.
      const { page } = await openPage(browser, `${server.url}/?model=/models/tiny.gguf&backend=webgpu`);
      const panel = await page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: 30_000 });
      assert.match(await panel.innerText(), /WebGPU/);
      assert.equal(await page.getAttribute(byId("error-panel"), "data-code"), "WEBGPU_UNAVAILABLE");
      assert.equal(await page.getAttribute(byId("model-progress"), "data-done"), null);
      assert.equal(await page.isDisabled(byId("send-button")), true);
      mkdirSync(results, { recursive: true });
      await page.screenshot({ path: join(results, "no-webgpu.png") });
    } finally {
      await browser.close();
      server.close();
    }
  });
});
