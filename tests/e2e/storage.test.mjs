// Big models: downloads into browser storage (OPFS) that survive a cut and resume after a reload,
// split GGUFs, the storage listing and deleting, a full disk, a truncated file, and the memory
// estimate from the header alone. Small synthetic models only; the real engine in headless
// Chromium (no wasm is mocked). The server (tests/e2e/helpers.mjs) answers ranges, cuts
// connections on demand and counts the bytes it sends per path.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { splitGguf } from "./gguf-split.mjs";
import { byId, launch, MODEL, openPage, results, root, staticServer, startServer, tinyModel } from "./helpers.mjs";

const TIMEOUT = 120_000;
const PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>pagedlm storage test</title>
<script type="module">
  import * as pagedlm from "/js/index.js";
  window.pagedlm = pagedlm;
  document.title = "ready";
</script></head><body>storage</body></html>`;

/** In the page: loads `url` (recording each progress phase), asks one short question, disposes. */
function loadAndChat(page, url, options = {}) {
  return page.evaluate(async ({ url, options }) => {
    const events = [];
    try {
      const engine = await window.pagedlm.createEngine(url, { ...options, onProgress: (p) => events.push(p) });
      const reply = await engine.chat.completions.create({ messages: [{ role: "user", content: "hi" }], max_tokens: 4, temperature: 0 });
      const stats = await engine.stats();
      const out = { load: engine.load, info: engine.info, memory: stats.memory, tokens: reply.usage.completion_tokens, events };
      await engine.dispose();
      return out;
    } catch (e) {
      return { code: e.code, message: e.message, events };
    }
  }, { url, options });
}

const listed = (page) => page.evaluate(() => window.pagedlm.listCachedModels());
/** The files in the package's OPFS folder. */
const opfsFiles = (page) => page.evaluate(async () => {
  const names = [];
  try {
    const folder = await (await navigator.storage.getDirectory()).getDirectoryHandle("pagedlm-models-v1");
    for await (const name of folder.keys()) names.push(name);
  } catch { /* no folder */ }
  return names.sort();
});

describe("model storage", () => {
  let fixtures;
  let tiny;
  let other;
  let size;
  let parts;
  let server;
  const routes = {};
  let browser;
  const contexts = [];

  before(async () => {
    fixtures = tinyModel("storage-tiny.gguf");
    tiny = join(fixtures, "storage-tiny.gguf");
    tinyModel("storage-other.gguf", ["--seed", "7", "--name", "another tiny model"]);
    other = join(fixtures, "storage-other.gguf");
    size = statSync(tiny).size;
    parts = splitGguf(tiny, join(fixtures, "storage-split"), 3);
    writeFileSync(join(results, "storage.html"), PAGE);
    routes["/storage.html"] = { file: join(results, "storage.html") };
    // The package's worker in a browser without OPFS (modules run in import order).
    writeFileSync(join(results, "no-opfs.js"), "delete StorageManager.prototype.getDirectory;\n");
    writeFileSync(join(results, "no-opfs-worker.js"), 'import "./no-opfs.js";\nimport "/js/worker.js";\n');
    routes["/no-opfs.js"] = { file: join(results, "no-opfs.js") };
    routes["/no-opfs-worker.js"] = { file: join(results, "no-opfs-worker.js") };
    parts.forEach((file, i) => { routes[`/split-0000${i + 1}-of-00003.gguf`] = { file }; });
    if (existsSync(MODEL)) routes["/smol.gguf"] = { file: MODEL };
    server = await staticServer(root, routes);
    browser = await launch();
  });

  after(async () => {
    for (const c of contexts) await c.close().catch(() => {});
    await browser?.close();
    await server?.close();
  });

  /** A fresh profile (its own OPFS) with the test page open. */
  async function site() {
    const context = await browser.newContext();
    contexts.push(context);
    const { page, problems } = await openPage(context, `${server.url}/storage.html`);
    await page.waitForFunction(() => document.title === "ready", null, { timeout: 30_000 });
    return { context, page, problems };
  }

  async function reload(page) {
    await page.reload();
    await page.waitForFunction(() => document.title === "ready", null, { timeout: 30_000 });
  }

  it("resumes a download cut half way after a reload, fetching the file about once", { timeout: TIMEOUT }, async () => {
    const cut = Math.floor(size / 2);
    routes["/cut.gguf"] = { file: tiny, cutAt: cut };
    const { page } = await site();
    const first = await loadAndChat(page, "/cut.gguf");
    assert.equal(first.code, "MODEL_DOWNLOAD", `the cut download fails: ${JSON.stringify(first)}`);
    const partial = (await listed(page)).find((m) => m.url.endsWith("/cut.gguf"));
    assert.ok(partial && !partial.complete && partial.bytes > 0 && partial.bytes <= cut, `the partial file is listed incomplete: ${JSON.stringify(partial)}`);

    await reload(page);
    const second = await loadAndChat(page, "/cut.gguf");
    assert.ok(!second.code, `the resumed load works: ${second.code} ${second.message}`);
    assert.ok(second.tokens > 0, "the engine answers");
    const resumed = second.events.find((e) => e.phase === "download");
    assert.equal(resumed?.resumed_from, partial.bytes, `the download resumes from the bytes on disk: ${JSON.stringify(resumed)}`);
    const served = server.served.get("/cut.gguf");
    assert.ok(served <= 1.05 * size, `bytes served ${served} for a file of ${size}`);
    assert.equal(second.load.source, "network");
    assert.equal(second.load.storage, "opfs");
    const phases = [...new Set(second.events.map((e) => e.phase))];
    for (const phase of ["download", "stored", "load", "upload", "ready"]) assert.ok(phases.includes(phase), `phase ${phase} in ${phases}`);

    // Complete now: the next load reads storage, not the network.
    const third = await loadAndChat(page, "/cut.gguf");
    assert.equal(third.load?.source, "cache", JSON.stringify(third));
    assert.equal(server.served.get("/cut.gguf"), served, "nothing more fetched");
    assert.ok(third.events.some((e) => e.phase === "cache"), "the cache phase is reported");
  });

  it("asks again from where it stopped when a download receives nothing, and fails after stalls in a row", { timeout: TIMEOUT }, async () => {
    const at = Math.floor(size * 0.4);
    routes["/stall.gguf"] = { file: tiny, stallAt: at };
    const { page } = await site();
    const out = await loadAndChat(page, "/stall.gguf", { downloadStallMs: 500 });
    assert.ok(!out.code, `the stalled download recovers: ${out.code} ${out.message}`);
    assert.ok(out.tokens > 0);
    const notes = out.events.filter((e) => e.note).map((e) => e.note);
    assert.ok(notes.some((n) => /received nothing for 0.5 s after [\d,]+ of [\d,]+ bytes: asked the server again from byte [\d,]+/.test(n)), `a progress note says so: ${JSON.stringify(notes)}`);
    assert.equal(server.hits.get("/stall.gguf"), 2, "one request, then one Range request");
    assert.equal(server.served.get("/stall.gguf"), size, "no byte fetched twice");
    assert.equal((await listed(page)).find((m) => m.url.endsWith("/stall.gguf"))?.complete, true);

    // A server that hangs every time: the load fails, saying so, with what it got kept.
    routes["/hangs.gguf"] = { file: tiny, stallAt: at, stallAlways: true };
    const hung = await loadAndChat(page, "/hangs.gguf", { downloadStallMs: 300 });
    assert.equal(hung.code, "MODEL_DOWNLOAD", JSON.stringify(hung));
    assert.match(hung.message, /stalled: it received nothing for 0.3 s after [\d,]+ of [\d,]+ bytes, 4 times in a row/);
    assert.equal(server.hits.get("/hangs.gguf"), 4);
    const partial = (await listed(page)).find((m) => m.url.endsWith("/hangs.gguf"));
    assert.deepEqual([partial?.complete, partial?.bytes], [false, at], "the bytes that came are kept for a resume");

    // Without OPFS (the Cache API) there is nothing to resume into: the first stall fails.
    routes["/hangs-cache.gguf"] = { file: tiny, stallAt: at };
    const cached = await loadAndChat(page, "/hangs-cache.gguf", { downloadStallMs: 300, workerUrl: "/no-opfs-worker.js" });
    assert.equal(cached.code, "MODEL_DOWNLOAD", JSON.stringify(cached));
    assert.match(cached.message, /stalled: it received nothing/);
  });

  it("loads a split GGUF from its first part's URL, lists it whole and deletes every part", { timeout: TIMEOUT }, async () => {
    const { page, problems } = await site();
    const out = await loadAndChat(page, "/split-00001-of-00003.gguf");
    assert.ok(!out.code, `the split model loads: ${out.code} ${out.message}`);
    assert.equal(out.load.files, 3);
    assert.ok(out.tokens > 0, "the engine answers");
    const total = parts.reduce((sum, p) => sum + statSync(p).size, 0);
    assert.equal(out.load.bytes, total);
    for (let i = 1; i <= 3; i++) assert.equal(server.served.get(`/split-0000${i}-of-00003.gguf`), statSync(parts[i - 1]).size, `part ${i} fetched once`);

    const models = await listed(page);
    const split = models.find((m) => m.url.endsWith("/split-00001-of-00003.gguf"));
    assert.deepEqual(split && { ...split, url: undefined }, { url: undefined, bytes: total, complete: true, storage: "opfs", parts: 3 }, JSON.stringify(models));
    assert.equal((await opfsFiles(page)).length, 6, "three parts and their sidecars");
    assert.equal(await page.evaluate(() => window.pagedlm.deleteCachedModel("/split-00002-of-00003.gguf")), true, "any part's URL names the model");
    assert.deepEqual(await listed(page), []);
    assert.deepEqual(await opfsFiles(page), []);
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
  });

  it("starts over from 0 when the server ignores Range, and still loads", { timeout: TIMEOUT }, async () => {
    routes["/norange.gguf"] = { file: tiny, cutAt: Math.floor(size / 2), noRange: true };
    const { page } = await site();
    assert.equal((await loadAndChat(page, "/norange.gguf")).code, "MODEL_DOWNLOAD");
    await reload(page);
    const out = await loadAndChat(page, "/norange.gguf");
    assert.ok(!out.code, `${out.code} ${out.message}`);
    const downloads = out.events.filter((e) => e.phase === "download");
    assert.ok(downloads.some((e) => /from the start/.test(e.note ?? "")), `a progress note says it starts over: ${JSON.stringify(downloads[0])}`);
    assert.ok(downloads.every((e) => e.resumed_from === undefined));
    assert.equal(server.served.get("/norange.gguf"), Math.floor(size / 2) + size);
    assert.ok(out.tokens > 0);
  });

  it("discards a partial download when the file changed on the server, and loads the new one", { timeout: TIMEOUT }, async () => {
    routes["/changed.gguf"] = { file: tiny, cutAt: Math.floor(size / 2) };
    const { page } = await site();
    assert.equal((await loadAndChat(page, "/changed.gguf")).code, "MODEL_DOWNLOAD");
    routes["/changed.gguf"].file = other;
    await reload(page);
    const out = await loadAndChat(page, "/changed.gguf");
    assert.ok(!out.code, `${out.code} ${out.message}`);
    assert.equal(out.info.model.name, "another tiny model", "the new file is the one loaded");
    assert.equal(out.load.bytes, statSync(other).size);
    const [entry] = await listed(page);
    assert.equal(entry.bytes, statSync(other).size);
    assert.equal(entry.complete, true);
  });

  it("rejects with QUOTA_EXCEEDED naming the sizes when storage is too small, and keeps nothing", { timeout: TIMEOUT }, async () => {
    routes["/quota.gguf"] = { file: tiny };
    const { context, page } = await site();
    const cdp = await context.newCDPSession(page);
    await cdp.send("Storage.overrideQuotaForOrigin", { origin: server.url, quotaSize: Math.floor(size / 2) });
    const out = await loadAndChat(page, "/quota.gguf");
    assert.equal(out.code, "QUOTA_EXCEEDED", JSON.stringify(out));
    assert.match(out.message, new RegExp(size.toLocaleString("en-US")), "the message names the bytes needed");
    assert.match(out.message, /(offers this site only|filled up after) [\d,]+ bytes/, "and the bytes there were room for");
    assert.deepEqual(await listed(page), []);
    assert.deepEqual(await opfsFiles(page), []);
  });

  it("never takes a file the server truncates (fewer bytes than promised) as a model", { timeout: TIMEOUT }, async () => {
    routes["/truncated.gguf"] = { file: tiny, truncateAt: Math.floor(size * 0.7) };
    const { page } = await site();
    const first = await loadAndChat(page, "/truncated.gguf");
    assert.equal(first.code, "MODEL_DOWNLOAD", JSON.stringify(first));
    await reload(page);
    const second = await loadAndChat(page, "/truncated.gguf");
    assert.equal(second.code, "MODEL_DOWNLOAD", `a resume that cannot complete fails too: ${JSON.stringify(second)}`);
    assert.ok(!second.events.some((e) => e.phase === "load"), "nothing reaches the engine");
    const [entry] = await listed(page);
    assert.equal(entry.complete, false);
    assert.equal(entry.bytes, Math.floor(size * 0.7));
  });

  it("falls back to the Cache API without OPFS, and stores nothing with cache: false", { timeout: TIMEOUT }, async () => {
    routes["/fallback.gguf"] = { file: tiny };
    const { page } = await site();
    const first = await loadAndChat(page, "/fallback.gguf", { workerUrl: "/no-opfs-worker.js" });
    assert.ok(!first.code, `${first.code} ${first.message}`);
    assert.deepEqual([first.load.source, first.load.storage], ["network", "cache"]);
    const again = await loadAndChat(page, "/fallback.gguf", { workerUrl: "/no-opfs-worker.js" });
    assert.deepEqual([again.load.source, again.load.storage], ["cache", "cache"]);
    assert.equal(server.served.get("/fallback.gguf"), size, "downloaded once");
    const [entry] = await listed(page);
    assert.deepEqual({ ...entry, url: entry.url.replace(server.url, "") }, { url: "/fallback.gguf", bytes: size, complete: true, storage: "cache", parts: 1 });
    assert.equal(await page.evaluate(() => window.pagedlm.deleteCachedModel("/fallback.gguf")), true);
    assert.deepEqual(await listed(page), []);

    const uncached = await loadAndChat(page, "/fallback.gguf", { cache: false });
    assert.ok(!uncached.code, `${uncached.code} ${uncached.message}`);
    assert.deepEqual([uncached.load.source, uncached.load.storage], ["network", null]);
    assert.deepEqual(await listed(page), []);
    assert.deepEqual(await opfsFiles(page), []);
  });

  it("estimates the memory from the header: fits, matches the load on WebGPU, and says why not under a small budget", { timeout: TIMEOUT }, async () => {
    routes["/estimate.gguf"] = { file: tiny };
    const { page } = await site();
    const estimate = await page.evaluate(() => window.pagedlm.estimateMemory("/estimate.gguf", { backend: "webgpu" }));
    assert.equal(estimate.complete, true);
    assert.equal(estimate.fits, true, JSON.stringify(estimate));
    assert.equal(estimate.backend, "webgpu");
    assert.deepEqual(estimate.reasons, []);
    const out = await loadAndChat(page, "/estimate.gguf", { backend: "webgpu" });
    assert.ok(!out.code, `${out.code} ${out.message}`);
    const weights = out.memory.weights_bytes;
    assert.ok(Math.abs(estimate.weights_bytes.webgpu - weights) <= 0.05 * weights, `estimated ${estimate.weights_bytes.webgpu} vs ${weights} weight bytes on the GPU`);

    const budget = Math.floor(estimate.total_bytes.webgpu / 2);
    const small = await page.evaluate((b) => window.pagedlm.estimateMemory("/estimate.gguf", { backend: "webgpu", maxMemoryBytes: b }), budget);
    assert.equal(small.fits, false, JSON.stringify(small));
    assert.ok(small.reasons.length > 0 && small.reasons.every((r) => typeof r === "string" && r.length > 0), JSON.stringify(small.reasons));

    // From a File, a slice: the same figures.
    const fromFile = await page.evaluate(async () => {
      const blob = await (await fetch("/estimate.gguf")).blob();
      return window.pagedlm.estimateMemory(new File([blob], "tiny.gguf"), { backend: "webgpu" });
    });
    assert.deepEqual(fromFile.weights_bytes, estimate.weights_bytes);
  });

  it("estimates a 98 MB model from its first 4 MiB", { timeout: TIMEOUT, skip: !existsSync(MODEL) && "the model is missing (npm run fetch-model)" }, async () => {
    const { page } = await site();
    const estimate = await page.evaluate(() => window.pagedlm.estimateMemory("/smol.gguf", { backend: "webgpu" }));
    assert.equal(estimate.complete, true);
    assert.ok(estimate.weights_bytes.webgpu > 50e6, JSON.stringify(estimate.weights_bytes));
    const served = server.served.get("/smol.gguf");
    assert.ok(served <= 4 << 20, `only the header's range was fetched: ${served} bytes`);
  });

  it("the chat page shows the estimate and does not load a model that does not fit", { timeout: TIMEOUT }, async () => {
    // The picker's default file, played by the tiny model.
    writeFileSync(join(fixtures, "SmolLM2-135M-Instruct.Q4_1.gguf"), readFileSync(tiny));
    const chat = await startServer({ PAGEDLM_MODELS_DIR: fixtures });
    try {
      const context = await browser.newContext();
      contexts.push(context);
      const { page: fits } = await openPage(context, `${chat.url}/?max_tokens=4`);
      await fits.waitForSelector(`${byId("model-estimate")}[data-fits="true"]`, { timeout: 60_000 });
      assert.match(await fits.locator(byId("model-estimate")).innerText(), /needs .* \(weights .* \+ KV .*\)/);
      await fits.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: 60_000 });

      const { page: small } = await openPage(context, `${chat.url}/?max_memory_bytes=1000`);
      await small.waitForSelector(`${byId("model-estimate")}[data-fits="false"]`, { timeout: 60_000 });
      const text = await small.locator(byId("model-estimate")).innerText();
      assert.match(text, /does not fit/i, text);
      await small.waitForTimeout(500);
      assert.equal(await small.getAttribute(byId("model-progress"), "data-done"), null, "no load starts");
    } finally {
      chat.close();
    }
  });
});
