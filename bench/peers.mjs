// pagedlm against its peers on the same GGUF and machine, side by side in one run (issue 16's
// figures). Run it through `bash bench/peers.sh` (it builds what is stale and finds the peers);
// options are in its header. Per figure the runs alternate, pagedlm then the peer(s), PAIRS times,
// and one JSON line comes out:
//   {"figure", "pagedlm": tok/s, "peer": tok/s, "peer_name", "ratio", "pairs", ...}
// with medians over the pairs and "ratio" the median of the pairs' pagedlm/peer ratios (a pair is
// two runs minutes apart, so a machine that slows down between pairs moves both). Extra keys: every
// run's figure ("runs"), the token counts behind it, and why a peer is missing ("peer_note").
//
// Native: `pagedlm bench` and bench/llamacpp_peer.py get the same flags, so the same token ids;
// each run is a fresh process (load, a small warm-up, then the measured part).
// Browser: one headless Chromium page (WebGPU; SwiftShader without a GPU) holds pagedlm (the npm
// package) and wllama 2.x and 3.x (llama.cpp in wasm, CPU, THREADS threads, served from
// node_modules); all of them get the same text, which each tokenizes with the GGUF's own tokenizer
// into the same ids (the counts are in the line). Of the wllama lines the faster is the peer, as the
// issue asks; the other's median is in "other_peers".
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { launch, openPage, root, startServer } from "../tests/e2e/helpers.mjs";

const env = process.env;
const side = process.argv[2] || "all";
const MODEL = resolve(root, env.MODEL || "models/SmolLM2-135M-Instruct.Q4_1.gguf");
const PAIRS = Number(env.PAIRS || 3);
const GEN = Number(env.GEN || 64);
const PREFILL = Number(env.PREFILL || 512);
const CONTEXTS = (env.CONTEXTS || "128 4096").split(/[ ,]+/).filter(Boolean).map(Number);
const BATCH = Number(env.BATCH || 8);
const BATCH_CONTEXT = Number(env.BATCH_CONTEXT || 128);
const THREADS = Number(env.THREADS || 2);
const FIGURES = (env.FIGURES || "").split(/[ ,]+/).filter(Boolean);
const WLLAMA = (env.WLLAMA || "2 3").split(/[ ,]+/).filter(Boolean);
const PEER_PYTHON = env.PEER_PYTHON || "python3";
const PAGEDLM_ARGS = (env.PAGEDLM_ARGS || "").split(/\s+/).filter(Boolean);
// pagedlm's backend, natively (`--backend`) and in the browser (createEngine's `backend`): webgpu
// (this script's default: issue 16's figures are the WebGPU backend's), cpu or auto.
const BACKEND = env.BACKEND || "webgpu";

if (!["all", "native", "browser"].includes(side)) {
  console.error(`usage: node bench/peers.mjs [all|native|browser] (got ${side})`);
  process.exit(2);
}
if (!existsSync(MODEL)) {
  console.error(`no model at ${MODEL} (npm run fetch-model, or MODEL=path/to/file.gguf)`);
  process.exit(1);
}
if (!(PAIRS >= 1 && GEN >= 4 && PREFILL >= 1 && BATCH >= 2)) {
  console.error("PAIRS must be >= 1, GEN >= 4, PREFILL >= 1, BATCH >= 2");
  process.exit(2);
}

const log = (msg) => console.error(`peers: ${msg}`);
const wanted = (figure) => FIGURES.length === 0 || FIGURES.some((f) => figure.includes(f));
const round = (x, digits = 2) => (typeof x === "number" && Number.isFinite(x) ? Number(x.toFixed(digits)) : null);
function median(xs) {
  const s = xs.filter((x) => typeof x === "number" && Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return null;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/**
 * One figure's line. `ours`: pagedlm's run figures; `peers`: {name: [run figures]} measured in the
 * same pairs (a failed run is null); the peer with the higher median is the one compared.
 */
function line(figure, ours, peers, extra = {}) {
  const medians = Object.entries(peers).map(([name, runs]) => [name, median(runs)]).filter(([, m]) => m !== null);
  medians.sort((a, b) => b[1] - a[1]);
  const [peerName, peerMedian] = medians[0] ?? [null, null];
  const theirs = peerName ? peers[peerName] : [];
  const ratios = ours.map((x, i) => (x > 0 && theirs[i] > 0 ? x / theirs[i] : null)).filter((r) => r !== null);
  const out = {
    figure,
    pagedlm: round(median(ours)),
    peer: round(peerMedian),
    peer_name: peerName,
    ratio: round(median(ratios), 3),
    pairs: ratios.length,
    runs: { pagedlm: ours.map((x) => round(x)), ...Object.fromEntries(Object.entries(peers).map(([n, r]) => [n, r.map((x) => round(x))])) },
  };
  if (medians.length > 1) out.other_peers = Object.fromEntries(medians.slice(1).map(([n, m]) => [n, round(m)]));
  return { ...out, ...extra };
}

// ---------------------------------------------------------------- native

/** Runs a command that prints JSON lines; returns its last one. */
function runJson(cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, encoding: "utf8", maxBuffer: 1 << 26 });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} exited with ${r.status}:\n${(r.stderr || "").slice(-3000)}`);
  const last = r.stdout.trim().split("\n").filter((l) => l.startsWith("{")).pop();
  if (!last) throw new Error(`${cmd} ${args.join(" ")} printed no JSON line:\n${r.stdout.slice(-2000)}`);
  return JSON.parse(last);
}

function llamaCppVersion() {
  const r = spawnSync(PEER_PYTHON, ["-c", "import llama_cpp; print(llama_cpp.__version__)"], { encoding: "utf8" });
  return r.status === 0 ? r.stdout.trim() : null;
}

function nativeSide() {
  const bin = join(root, "target/release/pagedlm");
  if (!existsSync(bin)) throw new Error("no target/release/pagedlm (cargo build --release)");
  const version = llamaCppVersion();
  const peerName = version && `llama.cpp ${version} (${THREADS} threads)`;
  const peerNote = version ? undefined
    : `llama.cpp not found by ${PEER_PYTHON}: python3 -m venv .cache/peer && .cache/peer/bin/pip install llama-cpp-python==0.3.36 (bench/llamacpp_peer.py says more)`;
  if (!version) log(peerNote);
  const figures = [
    ...CONTEXTS.map((c) => ({ figure: `native_decode_ctx${c}`, key: "decode_tok_s", flags: ["--prompt-tokens", 16, "--context", c, "--gen-tokens", GEN] })),
    { figure: `native_prefill_${PREFILL}`, key: "prefill_tok_s", flags: ["--prompt-tokens", PREFILL, "--context", 16, "--gen-tokens", 2] },
    { figure: `native_decode_batch${BATCH}`, key: "decode_tok_s", flags: ["--prompt-tokens", 16, "--context", BATCH_CONTEXT, "--batch", BATCH, "--gen-tokens", GEN] },
  ];
  for (const { figure, key, flags } of figures.filter((f) => wanted(f.figure))) {
    const args = flags.map(String);
    const ours = [];
    const theirs = [];
    let adapter = null;
    for (let i = 0; i < PAIRS; i++) {
      log(`${figure}: pair ${i + 1}/${PAIRS}, pagedlm`);
      const a = runJson(bin, ["bench", "--model", MODEL, "--backend", BACKEND, ...args, ...PAGEDLM_ARGS]);
      adapter = a.adapter;
      ours.push(a[key]);
      if (!version) continue;
      log(`${figure}: pair ${i + 1}/${PAIRS}, ${peerName}`);
      const b = runJson(PEER_PYTHON, [join(root, "bench/llamacpp_peer.py"), "--model", MODEL, ...args, "--reps", "1", "--threads", String(THREADS)]);
      theirs.push(b[key]);
    }
    const peers = version ? { [peerName]: theirs } : {};
    console.log(JSON.stringify(line(figure, ours, peers, { model: basename(MODEL), adapter, flags: args.join(" "), ...(peerNote && { peer_note: peerNote }) })));
  }
}

// ---------------------------------------------------------------- browser

/**
 * Installed into the page: `window.peers`, one interface over the three runtimes. Every measure
 * returns {tok_s, tokens, prompt_tokens}: decode counts the tokens after the first over the time
 * after the first (as `pagedlm bench` does), prefill the prompt tokens over the prompt's time, both
 * as each runtime reports them (pagedlm's prefill_ms/decode_ms, llama.cpp's timings in wllama 3.x,
 * wall clock around the calls in wllama 2.x, which reports none); aggregate decode is wall clock
 * for all of them (see `aggregate`).
 */
async function install({ modelUrl, wllama, threads, backend }) {
  const { createEngine } = await import("/js/index.js");
  const abs = (path) => new URL(path, location.origin).href;
  const now = () => performance.now();
  const modelFile = new File([await (await fetch(modelUrl)).blob()], modelUrl.split("/").pop());
  const Wllama = {};
  for (const v of wllama) Wllama[v] = (await import(abs(`/peers/wllama-${v}/index.js`))).Wllama;
  const engines = {};

  // kind -> {open(o), prefill(h, text), decode(h, text, gen), complete(h, text, n), close(h)}; o: {n_ctx, batch, prefixCache}
  const kinds = {
    pagedlm: {
      async open(o) {
        const options = { cache: false, maxContext: o.n_ctx, prefixCache: o.prefixCache, backend };
        if (o.batch > 1) Object.assign(options, { maxBatch: o.batch, poolTokens: o.n_ctx * o.batch });
        const engine = await createEngine(modelUrl, options);
        return { engine, info: { adapter: engine.info.adapter } };
      },
      async prefill({ engine }, text) {
        const r = await engine.completions.create({ prompt: text, max_tokens: 1, temperature: 0 });
        return { tok_s: r.pagedlm.prefill_tokens / (r.pagedlm.prefill_ms / 1000), tokens: r.pagedlm.prefill_tokens, prompt_tokens: r.usage.prompt_tokens };
      },
      async decode({ engine }, text, gen) {
        const r = await engine.completions.create({ prompt: text, max_tokens: gen, temperature: 0 });
        const n = r.usage.completion_tokens - 1;
        return { tok_s: n / (r.pagedlm.decode_ms / 1000), tokens: n, prompt_tokens: r.usage.prompt_tokens, prefix_hit_tokens: r.usage.prefix_hit_tokens };
      },
      async complete({ engine }, text, n) {
        return (await engine.completions.create({ prompt: text, max_tokens: n, temperature: 0 })).usage.completion_tokens;
      },
      async close({ engine }) { await engine.dispose(); },
    },
    "wllama-2": {
      async open(o) {
        if (o.batch > 1) throw new Error("wllama 2.x decodes one sequence at a time (no batched API)");
        const w = new Wllama["2"]({
          "single-thread/wllama.wasm": abs("/peers/wllama-2/single-thread/wllama.wasm"),
          "multi-thread/wllama.wasm": abs("/peers/wllama-2/multi-thread/wllama.wasm"),
        }, { suppressNativeLog: true });
        await w.loadModel([modelFile], { n_threads: threads, n_ctx: o.n_ctx, n_batch: 512 });
        return { w, cached: null, info: { threads: w.getNumThreads(), multithread: w.isMultithread() } };
      },
      async tokens(h, text) {
        const ids = await h.w.tokenize(text, true);
        if (h.w.mustAddBosToken() && ids[0] !== h.w.getBOS()) ids.unshift(h.w.getBOS());
        return ids;
      },
      async prefill(h, text) {
        const ids = await this.tokens(h, text);
        await h.w.kvClear();
        h.cached = null;
        const t0 = now();
        await h.w.decode(ids, {});
        return { tok_s: ids.length / ((now() - t0) / 1000), tokens: ids.length, prompt_tokens: ids.length };
      },
      // createCompletion's own loop (sample, accept, decode), without its stop at end-of-generation;
      // a prompt the cache already holds is kept but for its last token (as createCompletion's useCache).
      async decode(h, text, gen) {
        const ids = await this.tokens(h, text);
        await h.w.samplingInit({ temp: 0 });
        if (h.cached && h.cached.length === ids.length && h.cached.every((t, i) => t === ids[i])) {
          await h.w.kvRemove(ids.length - 1, -1);
          await h.w.decode(ids.slice(-1), {});
        } else {
          await h.w.kvClear();
          await h.w.decode(ids, {});
        }
        h.cached = ids;
        await h.w.samplingAccept(ids);
        let { token } = await h.w.samplingSample();
        const t0 = now();
        for (let i = 1; i < gen; i++) {
          await h.w.samplingAccept([token]);
          await h.w.decode([token], {});
          ({ token } = await h.w.samplingSample());
        }
        return { tok_s: (gen - 1) / ((now() - t0) / 1000), tokens: gen - 1, prompt_tokens: ids.length };
      },
      async close(h) { await h.w.exit(); },
    },
    "wllama-3": {
      async open(o) {
        const w = new Wllama["3"]({ default: abs("/peers/wllama-3/wasm/wllama.wasm") }, { suppressNativeLog: true });
        // n_gpu_layers 0: llama.cpp's CPU backend (3.x would take WebGPU otherwise). Sequences of a
        // batch share nothing, so each gets its own KV (llama.h: faster than a unified buffer then).
        await w.loadModel([modelFile], {
          n_threads: threads, n_ctx: o.n_ctx * Math.max(o.batch, 1), n_batch: 512, n_gpu_layers: 0,
          n_parallel: Math.max(o.batch, 1), kv_unified: o.batch > 1 ? false : undefined,
        });
        return { w, info: { threads: w.getNumThreads(), multithread: w.isMultithread() } };
      },
      async prefill({ w }, text) {
        const r = await w.createCompletion({ prompt: text, max_tokens: 1, temperature: 0, cache_prompt: false });
        const t = r.timings;
        return { tok_s: t.prompt_n / (t.prompt_ms / 1000), tokens: t.prompt_n, prompt_tokens: r.usage.prompt_tokens };
      },
      async decode({ w }, text, gen) {
        const r = await w.createCompletion({ prompt: text, max_tokens: gen, temperature: 0, ignore_eos: true });
        const t = r.timings;
        // predicted_ms runs from the end of the prompt: its first token is sampled at ~0 ms.
        return { tok_s: (t.predicted_n - 1) / (t.predicted_ms / 1000), tokens: t.predicted_n - 1, prompt_tokens: r.usage.prompt_tokens, prefix_hit_tokens: t.cache_n };
      },
      async complete({ w }, text, n) {
        return (await w.createCompletion({ prompt: text, max_tokens: n, temperature: 0, ignore_eos: true, cache_prompt: false })).usage.completion_tokens;
      },
      async close({ w }) { await w.exit(); },
    },
  };

  window.peers = {
    isolated: self.crossOriginIsolated,
    async open(kind, o) {
      const handle = await kinds[kind].open(o);
      engines[kind] = handle;
      return handle.info;
    },
    async close(kind) {
      if (engines[kind]) await kinds[kind].close(engines[kind]);
      delete engines[kind];
    },
    prefill: (kind, text) => kinds[kind].prefill(engines[kind], text),
    decode: (kind, text, gen) => kinds[kind].decode(engines[kind], text, gen),
    // Aggregate decode of n sequences at once, by difference: n requests of `gen` tokens at once
    // less n (other) requests of 2 tokens, each timed by the wall clock from submission to the
    // last reply, so prefill and start-up cancel and what is left is (gen - 2) decode steps of all
    // n together. (Streams would not do: wllama 3.x hands its chunks over in bursts.)
    async aggregate(kind, shortTexts, longTexts, gen) {
      const batch = async (texts, n) => {
        const t0 = now();
        const counts = await Promise.all(texts.map((t) => kinds[kind].complete(engines[kind], t, n)));
        return { ms: now() - t0, tokens: counts.reduce((a, b) => a + b, 0) };
      };
      const short = await batch(shortTexts, 2);
      const long = await batch(longTexts, gen);
      const tokens = long.tokens - short.tokens;
      return { tok_s: tokens / ((long.ms - short.ms) / 1000), tokens, prompt_tokens: null };
    },
  };
  return { isolated: self.crossOriginIsolated };
}

/**
 * n words, "the" then a seeded draw from 40 words that are one token each after a space in
 * SmolLM2's and Gemma 3's vocabularies: n ids (n + 1 with Gemma's BOS; each line says the counts).
 * Different seeds give prompts that share no prefix beyond "the".
 */
function text(n, seed = 0) {
  const words = ("the quick brown fox jumps over lazy dog near a quiet river bank old man walks with his small cat under "
    + "tall green trees on warm summer day while birds sing and children play in open field by blue lake").split(" ");
  let state = (Math.imul(seed + 1, 0x9e3779b1) ^ 0x5bd1e995) >>> 0;
  const out = ["the"];
  for (let i = 1; i < n; i++) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    out.push(words[(state >>> 16) % words.length]);
  }
  return out.join(" ");
}

function packageVersion(dir) {
  return JSON.parse(readFileSync(join(root, "node_modules", dir, "package.json"), "utf8")).version;
}

async function browserSide() {
  if (!existsSync(join(root, "pkg/pagedlm_bg.wasm"))) throw new Error("no pkg/ (bash scripts/build-web.sh)");
  const wllamaDirs = { 2: "wllama-v2", 3: "@wllama/wllama" };
  const wllama = WLLAMA.filter((v) => {
    if (!wllamaDirs[v]) { log(`WLLAMA=${v}: only 2 and 3 exist here`); return false; }
    if (!existsSync(join(root, "node_modules", wllamaDirs[v], "package.json"))) { log(`wllama ${v}.x not in node_modules (npm ci)`); return false; }
    return true;
  });
  const peerName = (v) => `wllama ${packageVersion(wllamaDirs[v])} (${THREADS} threads)`;
  const server = await startServer({ PAGEDLM_SERVE_PEERS: "1", PAGEDLM_MODELS_DIR: dirname(MODEL) });
  const browser = await launch();
  const external = [];
  try {
    const { page, problems } = await openPage(browser, `${server.url}/bench-peers`);
    page.context().on("request", (r) => { if (/^https?:/.test(r.url()) && !r.url().startsWith(server.url)) external.push(r.url()); });
    const setup = await page.evaluate(install, { modelUrl: `/models/${basename(MODEL)}`, wllama, threads: THREADS, backend: BACKEND });
    if (!setup.isolated) log("the page is not cross-origin isolated: wllama runs single-threaded");

    const figures = [
      ...CONTEXTS.map((c) => ({ figure: `browser_decode_ctx${c}`, open: { n_ctx: c + GEN + 64, batch: 1, prefixCache: true }, mode: "decode", ctx: c })),
      { figure: `browser_prefill_${PREFILL}`, open: { n_ctx: PREFILL + 64, batch: 1, prefixCache: false }, mode: "prefill" },
      { figure: `browser_decode_batch${BATCH}`, open: { n_ctx: BATCH_CONTEXT + GEN + 64, batch: BATCH, prefixCache: false }, mode: "aggregate" },
    ];
    for (const fig of figures.filter((f) => wanted(f.figure))) {
      // decode: the same prompt every run, so after the warm-up its K/V come from each runtime's
      // prompt cache and only the decode costs time (it alone is measured). prefill and aggregate:
      // new prompts every run (and no prompt caches), so nothing is reused.
      let run = 0;
      const measure = (kind, warm = false) => {
        const r = warm ? 0 : ++run;
        if (fig.mode === "decode") return page.evaluate(([k, t, g]) => window.peers.decode(k, t, g), [kind, text(fig.ctx), warm ? 3 : GEN]);
        if (fig.mode === "prefill") return page.evaluate(([k, t]) => window.peers.prefill(k, t), [kind, text(PREFILL, 100 + r)]);
        const texts = (from) => Array.from({ length: BATCH }, (_, i) => text(BATCH_CONTEXT, from + i));
        const from = 1000 + r * 2 * BATCH;
        return page.evaluate(([k, a, b, g]) => window.peers.aggregate(k, a, b, g), [kind, texts(from), texts(from + BATCH), warm ? 4 : GEN]);
      };
      const kinds = ["pagedlm", ...wllama.map((v) => `wllama-${v}`)];
      const open = {};
      const notes = {};
      for (const kind of kinds) {
        try {
          log(`${fig.figure}: loading ${kind}`);
          open[kind] = await page.evaluate(([k, o]) => window.peers.open(k, o), [kind, fig.open]);
          await measure(kind, true); // compiles pipelines, fills the prompt cache
        } catch (e) {
          if (kind === "pagedlm") throw e;
          notes[kind] = String(e.message || e).split("\n")[0].replace(/^page\.evaluate: (Error: )?/, "");
          log(`${fig.figure}: ${kind} left out: ${notes[kind]}`);
          await page.evaluate((k) => window.peers.close(k), kind).catch(() => {});
        }
      }
      const runs = Object.fromEntries(kinds.filter((k) => open[k]).map((k) => [k, []]));
      const details = Object.fromEntries(kinds.filter((k) => open[k]).map((k) => [k, []]));
      for (let i = 0; i < PAIRS; i++) {
        for (const kind of Object.keys(runs)) {
          log(`${fig.figure}: pair ${i + 1}/${PAIRS}, ${kind}`);
          const r = await measure(kind);
          runs[kind].push(r.tok_s);
          details[kind].push(r);
        }
      }
      for (const kind of kinds) await page.evaluate((k) => window.peers.close(k), kind);
      const peers = Object.fromEntries(wllama.filter((v) => runs[`wllama-${v}`]).map((v) => [peerName(v), runs[`wllama-${v}`]]));
      const counts = (kind) => details[kind]?.[0] && { tokens: details[kind][0].tokens, prompt_tokens: details[kind][0].prompt_tokens };
      const extra = {
        model: basename(MODEL),
        adapter: open.pagedlm.adapter,
        tokens: Object.fromEntries(Object.keys(details).map((k) => [k, counts(k)])),
        wllama_threads: Object.fromEntries(wllama.filter((v) => open[`wllama-${v}`]).map((v) => [v, open[`wllama-${v}`].threads])),
      };
      if (Object.keys(notes).length) extra.peer_note = notes;
      console.log(JSON.stringify(line(fig.figure, runs.pagedlm, peers, extra)));
    }
    const errors = problems.filter((p) => !/404|Not Found/.test(p));
    if (errors.length) log(`page errors: ${errors.join(" | ")}`);
    if (external.length) log(`requests left the machine: ${[...new Set(external)].join(", ")}`);
  } finally {
    await browser.close();
    server.close();
  }
}

if (side !== "browser") nativeSide();
if (side !== "native") await browserSide();
