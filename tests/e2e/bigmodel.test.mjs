// Models of gigabytes load by streaming (issue 39): a 2.4 GB and a 3.5 GB synthetic llama
// (examples/write_tiny_model --target-bytes: an F32 embedding over a large filler vocabulary,
// written from a seed into a temp dir, deleted after) load in headless Chromium through the npm
// package, on WebGPU (SwiftShader) and on the CPU backend, from a URL and from a disk-backed
// File, and answer a short chat turn. Four loads cover each size x backend and each source x
// backend. The wasm memory (`stats().wasm_bytes`; linear memory only grows, so after the load it
// is the load's peak) stays within 512 MiB on WebGPU and within the weights + 512 MiB on the CPU
// backend. Prints each load's time and rate as a `# ` line.
//
// A URL is loaded as a user's page loads it: downloaded into browser storage (OPFS), then read
// from there; the stored copy is deleted after. Needs ~15 GB of free disk (the two files, a
// stored copy of one in the browser's profile); with less it is skipped and says so
// (`# skipped: ...`), which is not a pass.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, statfsSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BASE_ARGS, openPage, root, staticServer } from "./helpers.mjs";

const MiB = 1 << 20;
const WASM_HEADROOM = 512 * MiB;
const NEEDED_FREE_BYTES = 15e9;
const SEED = "39";
const MODELS = { "2.4GB": 2_400_000_000, "3.5GB": 3_500_000_000 };
// One load: generous for 2 cores (a 3.5 GB read, checked and uploaded, then a chat turn).
const LOAD_TIMEOUT = 15 * 60_000;
// A load that reports nothing new (a phase, 5% more bytes) for this long has stalled: the test
// fails then, naming the phase, instead of waiting out LOAD_TIMEOUT.
const STALL_MS = 6 * 60_000;
const LOADS = [
  { backend: "webgpu", size: "3.5GB", source: "url" },
  { backend: "webgpu", size: "2.4GB", source: "file" },
  { backend: "cpu", size: "2.4GB", source: "url" },
  { backend: "cpu", size: "3.5GB", source: "file" },
];
const SITE_PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>pagedlm big models</title><link rel="icon" href="data:,">
<script type="importmap">{"imports": {"pagedlm": "./node_modules/pagedlm/js/index.js"}}</script>
<script type="module">
  import * as pagedlm from "pagedlm";
  window.pagedlm = pagedlm;
  document.title = "ready";
</script></head><body><input type="file" id="model-file"></body></html>`;

function freeBytes(dir) {
  const { bavail, bsize } = statfsSync(dir);
  return bavail * bsize;
}

/**
 * Writes the page cache's dirty pages to disk (`sync`) and logs how long it took. The test writes
 * 5.9 GB of models and each URL load stores up to 3.5 GB more: on a slow disk the kernel throttles
 * a writer past its dirty-page limit, which blocks a worker's storage writes. Flushed before each
 * load, that time goes to the setup and the log says how slow the disk is (in the CI run that
 * stalled after this was added, 0-1.2 s: the disk was not why).
 */
function flushPageCache(when) {
  const t0 = Date.now();
  execFileSync("sync");
  const ms = Date.now() - t0;
  console.log(`flushed the page cache ${when} in ${(ms / 1000).toFixed(1)} s`);
}

/** Writes the big model of `bytes` to `out` with the same writer binary the other tests use. */
function writeBigModel(out, bytes) {
  const args = ["--target-bytes", String(bytes), "--seed", SEED, "--out", out];
  const writer = process.env.PAGEDLM_TINY_MODEL_WRITER;
  const stdout = writer
    ? execFileSync(join(root, writer), args, { stdio: ["ignore", "pipe", "inherit"] })
    : execFileSync("cargo", ["run", "--quiet", "--features", "testing", "--example", "write_tiny_model", "--", ...args], { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
  return JSON.parse(stdout.toString());
}

const free = freeBytes(tmpdir());
const skip = free < NEEDED_FREE_BYTES ? `${(free / 1e9).toFixed(1)} GB free in ${tmpdir()}, the big-model test needs ${NEEDED_FREE_BYTES / 1e9} GB` : false;
if (skip) console.log(`skipped: ${skip}`);

describe("big models load by streaming", { skip }, () => {
  let dir;
  let site;
  let server;
  let context;
  const files = {};
  const started = Date.now();

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "pagedlm-big-"));
    for (const [name, bytes] of Object.entries(MODELS)) {
      files[name] = join(dir, `big-${name}.gguf`);
      const written = writeBigModel(files[name], bytes);
      console.log(`wrote ${name}: ${written.bytes} bytes, vocab ${written.vocab}, hidden ${written.hidden}, in ${written.write_s.toFixed(1)} s`);
    }
    flushPageCache("after writing the models");
    site = join(dir, "site");
    execFileSync("mkdir", ["-p", site]);
    // prepack builds pkg/ if a source changed.
    execFileSync("npm", ["pack", "--silent", "--pack-destination", site], { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
    const tarball = readdirSync(site).find((f) => f.endsWith(".tgz"));
    writeFileSync(join(site, "package.json"), JSON.stringify({ name: "site", private: true, type: "module" }));
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent", `./${tarball}`], { cwd: site, stdio: ["ignore", "pipe", "inherit"] });
    writeFileSync(join(site, "index.html"), SITE_PAGE);
    const routes = Object.fromEntries(Object.entries(files).map(([name, file]) => [`/${name}.gguf`, { file }]));
    server = await staticServer(site, routes);
    // A profile on disk, as a user's: an incognito context (playwright's default) gives a site
    // about 1.5 GB of storage, too little to store the 3.5 GB model.
    context = await chromium.launchPersistentContext(join(dir, "profile"), {
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: [...BASE_ARGS, "--enable-unsafe-webgpu"],
    });
  });

  after(async () => {
    await context?.close();
    await server?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
    console.log(`bigmodel wall time: ${((Date.now() - started) / 1000).toFixed(0)} s (writing, packing and ${LOADS.length} loads)`);
  });

  for (const { backend, size, source } of LOADS) {
    it(`${size} on ${backend} from a ${source === "url" ? "URL" : "File"}: loads, answers, within its wasm memory`, { timeout: LOAD_TIMEOUT }, async (t) => {
      flushPageCache(`before the ${size} ${backend} load`);
      // A load silent for STALL_MS is a stall. Three of the last six CI runs had one, each in the
      // first loads, at 0%, 15% or 90% of the download, with no note from the package (whose own
      // timer would have said so after 30 s of network silence): the worker or the page stopped
      // answering. A user would reload, and a reload resumes the download from browser storage;
      // the test does that once, saying so loudly, and fails on a second stall.
      let page;
      let problems;
      let watchdog;
      let out;
      for (let attempt = 1; ; attempt++) {
        ({ page, problems } = await openPage(context, `${server.url}/`));
        // Each phase as it starts (and every 5% of the bytes), so that a load that stalls says
        // where in the log.
        let last = { what: "opening the page", at: Date.now() };
        page.on("console", (m) => {
          if (!m.text().startsWith("bigmodel:")) return;
          last = { what: m.text().slice(10), at: Date.now() };
          console.log(`${size} ${backend} ${source}: ${last.what}`);
        });
        const stalled = new Promise((_, reject) => {
          watchdog = setInterval(() => {
            const silent = Date.now() - last.at;
            if (silent > STALL_MS) reject(new Error(`stalled: nothing new for ${(silent / 1000).toFixed(0)} s after "${last.what}"`));
          }, 5_000);
        });
        try {
          await page.waitForFunction(() => document.title === "ready", null, { timeout: 30_000 });
          if (source === "file") await page.setInputFiles("#model-file", files[size]);
          out = await Promise.race([page.evaluate(loadAndChat, { backend, source, url: `/${size}.gguf` }), stalled]);
          break;
        } catch (e) {
          clearInterval(watchdog);
          if (attempt > 1 || !String(e?.message).startsWith("stalled:")) {
            await page.close().catch(() => {});
            throw e;
          }
          // Whether the page's main thread still answers says which side stopped.
          const answers = await Promise.race([page.evaluate(() => "yes"), new Promise((r) => setTimeout(() => r("no (5 s)"), 5_000))]).catch((err) => `error: ${err.message}`);
          const what = `STALLED, reloading once: ${e.message}; the page's main thread answers: ${answers}`;
          console.log(`${size} ${backend} ${source}: ${what}`);
          t.diagnostic(what);
          await page.close();
        }
      }
      try {
        const fileBytes = statSync(files[size]).size;
        const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;
        const rate = (ms) => `${(fileBytes / 1e6 / (ms / 1000)).toFixed(0)} MB/s`;
        const { download_ms: downloadMs, engine_ms: engineMs } = out.load;
        const read = source === "url" ? `download ${secs(downloadMs)} (${rate(downloadMs)}), from storage ${secs(engineMs)} (${rate(engineMs)})` : `from the File ${secs(engineMs)} (${rate(engineMs)})`;
        t.diagnostic(
          `bigmodel ${size} ${backend} ${source}: createEngine ${secs(out.loadMs)}: ${read}; chat turn ${secs(out.chatMs)} for ${out.usage.prompt_tokens} + ${out.usage.completion_tokens} tokens; ` +
          `wasm ${(out.stats.wasm_bytes / MiB).toFixed(0)} MiB after the load, ${(out.after.wasm_bytes / MiB).toFixed(0)} MiB after the turn; ` +
          `weights ${(out.stats.memory.weights_bytes / MiB).toFixed(0)} MiB`,
        );
        assert.equal(out.load.source, source === "url" ? "network" : "file");
        assert.equal(out.info.backend, backend, out.info.backend_reason);
        assert.ok(["stop", "length"].includes(out.finish), `finish_reason ${out.finish}`);
        assert.ok(out.usage.completion_tokens >= 1 && out.usage.completion_tokens <= 3, JSON.stringify(out.usage));
        const limit = backend === "webgpu" ? WASM_HEADROOM : out.after.memory.weights_bytes + WASM_HEADROOM;
        for (const [when, stats] of [["after the load", out.stats], ["after the chat turn", out.after]]) {
          assert.ok(stats.wasm_bytes <= limit, `wasm memory ${when}: ${stats.wasm_bytes} bytes, over ${limit}`);
        }
        if (backend === "cpu") assert.ok(out.after.memory.weights_bytes > 0.9 * fileBytes, `the CPU backend holds the weights (${out.after.memory.weights_bytes} bytes)`);
        // The estimate from the header: fits; the weights and the KV pool what the engine then
        // holds, its graphs within the estimate's activations (the largest step's: a 512-row
        // prefill chunk, which a 3-token turn does not reach; tests/streaming.rs checks the whole
        // total within 5% after such a chunk).
        const held = out.after.memory;
        const { estimate } = out;
        assert.ok(estimate.fits, `estimateMemory: ${JSON.stringify(estimate.reasons)}`);
        const kind = backend === "webgpu" ? "webgpu" : "cpu";
        assert.equal(estimate.weights_bytes[kind], held.weights_bytes, "the estimate's weights");
        assert.equal(estimate.kv_bytes.f32, held.kv_bytes, "the estimate's KV pool");
        if (backend === "webgpu") assert.ok(held.graph_bytes <= estimate.activations_bytes.webgpu, `graphs ${held.graph_bytes} over the estimate's ${estimate.activations_bytes.webgpu}`);
        assert.deepEqual(problems.filter((p) => !/GPU stall|powerPreference/.test(p)), []);
      } finally {
        clearInterval(watchdog);
        await page.close();
      }
    });
  }
});

/**
 * In the page: loads the model with the package as a user would (a URL is downloaded into browser
 * storage, then read from there), asks one short question, disposes, deletes the stored copy.
 */
async function loadAndChat({ backend, source, url }) {
  const { createEngine, deleteCachedModel, estimateMemory } = window.pagedlm;
  const model = source === "file" ? document.querySelector("#model-file").files[0] : url;
  // From the header alone, before anything is downloaded.
  const step = (what) => console.log(`bigmodel: ${what} at ${Math.round(performance.now())} ms`);
  step("estimate");
  const estimate = await estimateMemory(model, { backend });
  const phases = {};
  const t0 = performance.now();
  let reported = "";
  const onProgress = (p) => {
    if (phases[p.phase] === undefined) step(p.phase);
    phases[p.phase] ??= performance.now() - t0;
    const share = `${p.phase} ${p.total ? Math.floor((20 * p.loaded) / p.total) * 5 : 0}%`;
    if (share !== reported) step(share);
    reported = share;
    // A stall the package recovered from, or storage that is slow to write.
    if (p.note) step(`${p.phase} note: ${p.note}`);
  };
  const engine = await createEngine(model, { backend, onProgress });
  step("chat turn");
  const loadMs = performance.now() - t0;
  try {
    const stats = await engine.stats();
    const t1 = performance.now();
    const reply = await engine.chat.completions.create({
      // A short prompt (a system message of its own replaces the template's long default one):
      // a 3.5 GB model's prefill on SwiftShader costs about a second per row.
      messages: [{ role: "system", content: "." }, { role: "user", content: "Hi" }],
      max_tokens: 3,
      temperature: 0,
    });
    const chatMs = performance.now() - t1;
    const after = await engine.stats();
    const pick = (s) => ({ wasm_bytes: s.wasm_bytes, memory: s.memory });
    return { estimate, loadMs, chatMs, phases, load: engine.load, stats: pick(stats), after: pick(after), info: engine.info, usage: reply.usage, finish: reply.choices[0].finish_reason };
  } finally {
    await engine.dispose();
    // The stored copy is gigabytes: gone before the next load.
    if (source === "url") await deleteCachedModel(url);
  }
}
