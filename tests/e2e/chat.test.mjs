// End-to-end: the chat page in headless Chromium (WebGPU on SwiftShader) against the real model.
// Needs pkg/ (bash scripts/build-web.sh) and models/ (npm run fetch-model). Run: node --test tests/e2e/
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { chromium } from "playwright-core";

const root = fileURLToPath(new URL("../..", import.meta.url));
const results = join(root, "test-results");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const BASE_ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];
// Small replies keep the test quick: SwiftShader decodes a few tokens per second.
const MAX_TOKENS = 12;
const LOAD_TIMEOUT = 240_000;
const REPLY_TIMEOUT = 90_000;

const byId = (id) => `[data-testid="${id}"]`;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Starts scripts/serve.mjs; resolves once it listens. */
async function startServer() {
  const port = await freePort();
  const child = spawn(process.execPath, [join(root, "scripts/serve.mjs")], {
    env: { ...process.env, PORT: String(port) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve.mjs did not start in 10 s:\n${log}`)), 10_000);
    child.stdout.on("data", (d) => { log += d; if (log.includes("serving")) { clearTimeout(timer); resolve(); } });
    child.stderr.on("data", (d) => { log += d; });
    child.once("exit", (code) => { clearTimeout(timer); reject(new Error(`serve.mjs exited with ${code}:\n${log}`)); });
  });
  return { child, url: `http://127.0.0.1:${port}` };
}

/** A page that records its console errors and exceptions, to explain a failure. */
async function openPage(browser, url) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const problems = [];
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  await page.goto(url);
  return { page, problems };
}

/** Waits for the model to be ready; fails at once with the page's error panel if loading fails. */
async function waitForModel(page, problems) {
  const ready = page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: LOAD_TIMEOUT });
  const failed = page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: LOAD_TIMEOUT })
    .then(async (el) => { throw new Error(`the page failed to load the model: ${await el.innerText()}\n${problems.join("\n")}`); });
  await Promise.race([ready, failed]);
  failed.catch(() => {});
}

/** Types `text`, clicks send, and returns the new assistant message's locator (index `n`). */
async function ask(page, text, n) {
  await page.fill(byId("chat-input"), text);
  await page.click(byId("send-button"));
  return page.locator(byId("message-assistant")).nth(n);
}

async function waitDone(page, n) {
  await page.waitForSelector(`${byId("message-assistant")}[data-done="true"] >> nth=${n}`, { timeout: REPLY_TIMEOUT });
  const msg = page.locator(byId("message-assistant")).nth(n);
  return {
    text: (await msg.locator(".body").textContent()) ?? "",
    promptTokens: Number(await msg.getAttribute("data-prompt-tokens")),
    tokens: Number(await msg.getAttribute("data-tokens")),
    finish: await msg.getAttribute("data-finish-reason"),
    error: await msg.locator(".message-error").count() ? await msg.locator(".message-error").textContent() : null,
  };
}

async function kvStats(page) {
  return page.$eval(byId("kv-stats"), (el) => ({
    total: el.dataset.blocksTotal, used: el.dataset.blocksUsed, cached: el.dataset.blocksCached, hit: el.dataset.lastPrefixHit,
  }));
}

describe("chat page", () => {
  let server;
  let browser;
  let page;
  let problems;

  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    assert.ok(existsSync(join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf")), "the model is missing: run `npm run fetch-model`");
    mkdirSync(results, { recursive: true });
    server = await startServer();
    browser = await chromium.launch({ executablePath: CHROMIUM, args: [...BASE_ARGS, "--enable-unsafe-webgpu"] });
    ({ page, problems } = await openPage(browser, `${server.url}/?max_tokens=${MAX_TOKENS}&temperature=0`));
  });

  after(async () => {
    await browser?.close();
    server?.child.kill();
  });

  it("loads the model with progress", { timeout: LOAD_TIMEOUT + 10_000 }, async () => {
    const t0 = Date.now();
    await waitForModel(page, problems);
    console.log(`model ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    assert.match(await page.locator(byId("model-progress")).innerText(), /ready/i);
    assert.equal(await page.isEnabled(byId("chat-input")), true);
    const kv = await kvStats(page);
    assert.deepEqual(kv, { total: "1", used: "0", cached: "0", hit: "0" }, "an empty conversation holds no KV block");
  });

  it("answers, then answers a follow-up with the whole history", { timeout: 2 * REPLY_TIMEOUT }, async () => {
    await ask(page, "What is the capital of France?", 0);
    const first = await waitDone(page, 0);
    assert.equal(first.error, null, `the reply failed: ${first.error}`);
    assert.ok(first.text.trim().length > 0, "the first reply is empty");
    assert.ok(first.tokens >= 1 && first.tokens <= MAX_TOKENS, `max_tokens=${MAX_TOKENS} from the URL is honoured (got ${first.tokens})`);
    assert.equal(await page.locator(byId("message-user")).count(), 1);
    assert.equal(await page.locator(byId("message-user")).first().textContent(), "What is the capital of France?");
    assert.equal((await kvStats(page)).used, "1", "the conversation holds the KV block");
    await page.screenshot({ path: join(results, "chat.png") });
    console.log(`reply 1 (${first.tokens} tokens, ${first.finish}): ${JSON.stringify(first.text)}`);

    await ask(page, "And what is the capital of Italy?", 1);
    const second = await waitDone(page, 1);
    assert.equal(second.error, null, `the follow-up failed: ${second.error}`);
    assert.ok(second.text.trim().length > 0, "the follow-up reply is empty");
    assert.ok(second.promptTokens > first.promptTokens + first.tokens,
      `the follow-up prompt (${second.promptTokens} tokens) carries the first turn (${first.promptTokens} + ${first.tokens})`);
    assert.equal(await page.locator(byId("message-user")).count(), 2);
    assert.equal(await page.locator(byId("message-assistant")).count(), 2);
    await page.screenshot({ path: join(results, "chat-follow-up.png") });
    console.log(`reply 2 (${second.tokens} tokens, ${second.finish}): ${JSON.stringify(second.text)}`);
  });

  it("starts a new conversation, renders text as text, and stops a reply", { timeout: 2 * REPLY_TIMEOUT }, async () => {
    await page.click(byId("new-conversation"));
    assert.equal(await page.locator(byId("message-user")).count(), 0);
    assert.equal(await page.locator(byId("message-assistant")).count(), 0);
    assert.equal((await kvStats(page)).used, "0");

    // A long limit, so only the stop button can end this reply early.
    await page.fill("#max-tokens", "200");
    const question = "Tell me a long story about <b>dragons</b> & knights.";
    await ask(page, question, 0);
    await page.click(byId("stop-button"));
    const reply = await waitDone(page, 0);
    assert.equal(reply.error, null, `the reply failed: ${reply.error}`);
    assert.equal(reply.finish, "abort");
    assert.ok(reply.tokens >= 1 && reply.tokens < 200, `stopped early (${reply.tokens} tokens)`);
    assert.ok(reply.text.length > 0, "the stopped reply keeps its partial text");
    const user = page.locator(byId("message-user")).first();
    assert.equal(await user.textContent(), question);
    assert.equal(await user.locator("b").count(), 0, "user text is not parsed as HTML");
    assert.equal(await page.isEnabled(byId("chat-input")), true);
    await page.screenshot({ path: join(results, "chat-stopped.png") });
    assert.deepEqual(problems.filter((p) => !/favicon/.test(p)), [], "no page errors");
  });
});

describe("chat page without WebGPU", () => {
  it("shows a clear error", { timeout: 60_000 }, async () => {
    const server = await startServer();
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: BASE_ARGS });
    try {
      const { page } = await openPage(browser, `${server.url}/`);
      const panel = await page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: 30_000 });
      assert.match(await panel.innerText(), /WebGPU/);
      assert.equal(await page.getAttribute(byId("model-progress"), "data-done"), null);
      assert.equal(await page.isDisabled(byId("send-button")), true);
      mkdirSync(results, { recursive: true });
      await page.screenshot({ path: join(results, "no-webgpu.png") });
    } finally {
      await browser.close();
      server.child.kill();
    }
  });
});
