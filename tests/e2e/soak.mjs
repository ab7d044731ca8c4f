// The soak run: many requests through the package, 4 streams at a time over a small KV pool (so
// that blocks are evicted and requests preempted), with random prompts, lengths, sampling
// settings and every way of stopping one (an AbortSignal, `break` out of a stream, disposing the
// engine mid-stream, losing its GPU device mid-stream and restarting it). After every request the
// pool's invariants must hold; at the end every
// block is free or cached, and resetting the cache frees all; the page's JS heap, the wasm
// engine's memory and the GPU bytes it holds are sampled after every request, so that growth
// between the first and the last 50 shows. tests/e2e/soak.test.mjs runs a short one;
// scripts/soak.mjs the long ones (README "Reliability").
import assert from "node:assert/strict";
import { launch, openPage, startServer } from "./helpers.mjs";

/** Chromium flags the memory figures need: precise `performance.memory` and `gc()`. */
export const SOAK_ARGS = ["--enable-precise-memory-info", "--js-flags=--expose-gc"];

/**
 * Runs a soak of `requests` requests on `model` (a URL under the server) in a blank page of
 * `browser` and returns its summary (see `soakPage`).
 */
export async function soak(browser, url, options) {
  const { page, problems } = await openPage(browser, `${url}/blank`);
  try {
    const summary = await page.evaluate(soakPage, options);
    return { ...summary, problems: problems.filter((p) => !/Failed to load resource|favicon/.test(p)) };
  } finally {
    await page.close();
  }
}

/** Starts the chat page's server over `modelsDir` and a Chromium with the soak's flags. */
export async function soakSetup(modelsDir) {
  const server = await startServer(modelsDir ? { PAGEDLM_MODELS_DIR: modelsDir } : {});
  const browser = await launch({ args: SOAK_ARGS });
  return { server, browser, close: async () => { await browser.close(); server.close(); } };
}

/** The mean of `xs`. */
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

/**
 * Each memory figure's mean over the first and over the last `window` requests, and whether the
 * last is within `ratio` of the first plus `slack` bytes (the page's heap moves by a few hundred
 * KB with what the collector left; the engine's figures must not move at all beyond `ratio`).
 */
export function memoryGrowth(samples, window = 50, ratio = 1.1) {
  const first = samples.slice(0, window);
  const last = samples.slice(-window);
  const figure = (key, slack) => {
    const f = { first: mean(first.map((s) => s[key])), last: mean(last.map((s) => s[key])) };
    return { ...f, grows: f.last > f.first * ratio + slack };
  };
  return { heap: figure("heap", 1 << 20), wasm: figure("wasm", 0), gpu: figure("gpu", 0) };
}

/** In the page. Returns {requests, ms, outcomes, failures, integrity, engines, final, reset, samples}. */
export async function soakPage({ model, requests, seed, engineOptions, maxTokens = 40, disposeEvery = 60, loseEvery = 0 }) {
  const { createEngine, PagedlmError } = await import("/js/index.js");
  let state = seed >>> 0;
  const rand = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const WORDS = "the a sea ship wind light river stone city night morning road story song bird tree cloud fire water bread king garden".split(" ");
  const sentence = (n) => Array.from({ length: n }, () => pick(WORDS)).join(" ");
  const messages = () => {
    const turns = [];
    if (rand() < 0.3) turns.push({ role: "system", content: sentence(3 + Math.floor(rand() * 8)) });
    for (let t = Math.floor(rand() * 3); t > 0; t--) turns.push({ role: "user", content: sentence(1 + Math.floor(rand() * 8)) }, { role: "assistant", content: sentence(1 + Math.floor(rand() * 6)) });
    turns.push({ role: "user", content: sentence(1 + Math.floor(rand() * 20)) });
    return turns;
  };

  let engine = await createEngine(model, engineOptions);
  let engines = 1;
  let losses = 0;
  let swapping = null;
  const outcomes = {};
  const failures = [];
  const integrity = [];
  const samples = [];
  const count = (key) => { outcomes[key] = (outcomes[key] ?? 0) + 1; };

  /** Disposes the engine while its requests run and loads a new one; the others wait for it. */
  const swap = async (old) => {
    if (swapping || old !== engine) return swapping;
    swapping = (async () => {
      await old.dispose();
      engine = await createEngine(model, engineOptions);
      engines += 1;
    })();
    await swapping;
    swapping = null;
  };

  /** Loses the engine's GPU device while its requests run, and restarts it; the others wait. */
  const lose = async (old) => {
    if (swapping || old !== engine) return swapping;
    swapping = (async () => {
      await old.simulateDeviceLoss();
      await old.restart();
      losses += 1;
    })();
    await swapping;
    swapping = null;
  };

  const one = async (i) => {
    while (swapping) await swapping;
    const mine = engine;
    // Every `disposeEvery`-th request disposes the engine at its first chunk (a new one loads);
    // every `loseEvery`-th loses its GPU device there (the engine restarts).
    const disposes = i > 0 && i % disposeEvery === 0;
    const loses = loseEvery > 0 && i > 0 && i % loseEvery === 0 && !disposes;
    const stream = disposes || loses || rand() < 0.7;
    const stop = rand();
    const controller = new AbortController();
    const params = {
      messages: messages(),
      max_tokens: disposes || loses ? maxTokens : 1 + Math.floor(rand() * maxTokens),
      temperature: pick([0, 0, 0.7, 1.0]),
      top_p: pick([undefined, 0.9]),
      top_k: pick([undefined, 20]),
      seed: pick([undefined, i]),
      repetition_penalty: pick([undefined, 1.1]),
      stream,
      signal: controller.signal,
    };
    let timer = 0;
    try {
      // 8%: aborted by its signal after a random while; 8% of streams: `break` after a few chunks.
      const plain = !disposes && !loses;
      if (stop < 0.08 && plain) timer = setTimeout(() => controller.abort(), Math.floor(rand() * 400));
      const result = await mine.chat.completions.create(params);
      if (stream) {
        let n = 0;
        const breakAt = stop > 0.08 && stop < 0.16 && plain ? 1 + Math.floor(rand() * 4) : Infinity;
        for await (const chunk of result) {
          n += 1;
          if (disposes && n === 1) swap(mine);
          if (loses && n === 1) lose(mine);
          if (n >= breakAt) break;
          if (chunk.choices?.[0]?.delta === undefined) throw new Error("a chunk without a delta");
        }
        count(n >= breakAt ? "break" : "ok");
      } else {
        if (typeof result?.choices?.[0]?.message?.content !== "string") throw new Error("a completion without text");
        count("ok");
      }
    } catch (e) {
      const code = e instanceof PagedlmError ? e.code : `${e?.name}: ${e?.message}`;
      count(code);
      if (!["ABORTED", "DISPOSED", "DEVICE_LOST"].includes(code)) failures.push({ i, code, message: String(e?.message).slice(0, 300) });
    } finally {
      clearTimeout(timer);
    }
    // The pool after this request: its invariants, and the memory figures.
    while (swapping) await swapping;
    try {
      const stats = await engine.stats();
      if (stats.integrity !== null) integrity.push({ i, integrity: stats.integrity });
      globalThis.gc?.();
      const m = stats.memory;
      samples.push({ i, heap: performance.memory?.usedJSHeapSize ?? 0, wasm: stats.wasm_bytes, gpu: m.weights_bytes + m.kv_bytes + m.graph_bytes, graph: m.graph_bytes });
    } catch (e) {
      if (e?.code !== "DISPOSED") failures.push({ i, code: e?.code ?? e?.name, message: `stats: ${e?.message}` });
    }
  };

  const t0 = performance.now();
  let next = 0;
  await Promise.all([0, 1, 2, 3].map(async () => {
    while (next < requests) await one(next++);
  }));
  const ms = performance.now() - t0;
  const final = await engine.stats();
  const reset = await engine.resetCache();
  await engine.dispose();
  return {
    requests, ms, outcomes, failures, integrity, engines, losses, samples,
    final: { pool: final.pool, sequences: final.sequences.length, sched: final.sched, prefix: final.prefix },
    reset: { pool: reset.pool },
  };
}

/** What a soak run must show, whatever its length (scripts/soak.mjs checks the same). */
export function checkSoak(out, { window = 50 } = {}) {
  assert.deepEqual(out.failures.slice(0, 5), [], `requests that failed other than by an abort or a dispose (${out.failures.length})`);
  assert.deepEqual(out.integrity.slice(0, 5), [], "the pool's invariants hold after every request");
  assert.ok((out.outcomes.ok ?? 0) > out.requests / 2, `most requests finish (${JSON.stringify(out.outcomes)})`);
  const stops = ["ABORTED", "break", "DISPOSED", ...(out.losses > 0 ? ["DEVICE_LOST"] : [])];
  for (const stop of stops) assert.ok(out.outcomes[stop] > 0, `some requests end by ${stop} (${JSON.stringify(out.outcomes)})`);
  assert.ok(out.final.sched.preemptions > 0 || out.final.prefix.evictions > 0, `the small pool preempts or evicts (${JSON.stringify(out.final)})`);
  const { pool } = out.final;
  assert.equal(out.final.sequences, 0, "no sequence is left when every request has ended");
  assert.equal(pool.blocks_free + pool.blocks_cached, pool.blocks_total, `every block is free or cached at the end: ${JSON.stringify(pool)}`);
  assert.equal(out.reset.pool.blocks_free, out.reset.pool.blocks_total, "resetting the cache frees every block");
  const g = memoryGrowth(out.samples, window);
  for (const [what, f] of Object.entries(g)) assert.ok(!f.grows, `${what} grows from ${f.first.toFixed(0)} to ${f.last.toFixed(0)} bytes between the first and the last ${window} requests`);
  assert.deepEqual(out.problems, [], "no page errors");
  return g;
}
