// Browser figures for the README: `npm run bench:browser` prints one JSON line.
// Drives the npm package's API in headless Chromium (WebGPU; SwiftShader without a GPU) on the
// real model: load time (network and browser storage), prefill and decode tokens/s, and the time to
// the first token of a follow-up turn with and without the prefix cache.
// and aggregate decode tokens/s of 1, 2, 4 and 8 concurrent requests (continuous batching).
// Options (env): BENCH_PREFILL_WORDS (default 60 words ≈ 90 prompt tokens), BENCH_DECODE_TOKENS (32),
// BENCH_BATCHES ("1,2,4,8"), BENCH_BATCH_TOKENS (12), BENCH_ONLY_BATCH=1 (skip the other figures),
// BENCH_MODEL (a .gguf under models/, default SmolLM2-135M-Instruct.Q4_1.gguf) with BENCH_ONLY_SPEED=1
// (load, prefill and decode only: bench/weight_types.sh runs it once per weight type),
// BENCH_CONSTRAINED=1 (only greedy decode free and under bench/constraints/prose.lark, in
// BENCH_PAIRS (3) alternating pairs after a warm-up of each: the constrained/free ratio).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { launch, MODEL, openPage, root, startServer } from "../tests/e2e/helpers.mjs";

const prefillWords = Number(process.env.BENCH_PREFILL_WORDS || 60);
const decodeTokens = Number(process.env.BENCH_DECODE_TOKENS || 32);
const batches = (process.env.BENCH_BATCHES || "1,2,4,8").split(",").map(Number);
const batchTokens = Number(process.env.BENCH_BATCH_TOKENS || 12);
const onlyBatch = process.env.BENCH_ONLY_BATCH === "1";
const onlySpeed = process.env.BENCH_ONLY_SPEED === "1";
const modelPath = process.env.BENCH_MODEL || "SmolLM2-135M-Instruct.Q4_1.gguf";
const constrained = process.env.BENCH_CONSTRAINED === "1";
// createEngine's backend: webgpu here by default (the package's own default is auto).
const backend = process.env.BACKEND || "webgpu";
const pairs = Number(process.env.BENCH_PAIRS || 3);
const grammar = readFileSync(join(root, "bench/constraints/prose.lark"), "utf8");

if (!existsSync(join(root, "pkg/pagedlm_bg.wasm")) || !existsSync(MODEL)) {
  console.error("bench:browser needs pkg/ (bash scripts/build-web.sh) and the model (npm run fetch-model)");
  process.exit(1);
}

const server = await startServer();
const browser = await launch();
try {
  const { page, problems } = await openPage(browser, `${server.url}/bench-blank`);
  const figures = await page.evaluate(async ({ prefillWords, decodeTokens, batches, batchTokens, onlyBatch, onlySpeed, modelPath, constrained, pairs, grammar, backend }) => {
    const { createEngine, deleteCachedModel } = await import("/js/index.js");
    const MODEL_URL = `/models/${modelPath}`;
    const user = (content) => ({ role: "user", content });
    const greedy = { temperature: 0 };
    const out = {};

    // Aggregate decode of n concurrent streams: tokens counted from the moment every stream has
    // its first token to the moment the first one ends.
    const aggregate = async (e, n) => {
      const topics = ["dragons", "rivers", "castles", "robots", "gardens", "comets", "ships", "owls", "forests", "bridges", "clocks", "islands", "storms", "lanterns", "foxes", "mountains"];
      const state = { started: 0, t0: 0, t1: 0, tokens: 0 };
      await Promise.all(Array.from({ length: n }, async (_, i) => {
        const stream = await e.chat.completions.create({ messages: [user(`Tell a story about ${topics[i % topics.length]}.`)], max_tokens: batchTokens, stream: true, ...greedy });
        let first = true;
        for await (const chunk of stream) {
          if (!chunk.choices?.[0]?.delta?.content) continue;
          if (first) {
            first = false;
            state.started += 1;
            if (state.started === n) state.t0 = performance.now();
          } else if (state.t0 && !state.t1) {
            state.tokens += 1;
          }
        }
        if (!state.t1 && state.t0) state.t1 = performance.now();
      }));
      return state.t1 > state.t0 ? state.tokens / ((state.t1 - state.t0) / 1000) : 0;
    };
    if (constrained) {
      // The same prompt each time (its K/V come from the prefix cache): decode only.
      const engine = await createEngine(MODEL_URL, { backend, cacheName: "pagedlm-bench" });
      const run = async (extra) => {
        const r = await engine.chat.completions.create({ messages: [user("Write a long story about a dragon who learns to paint.")], max_tokens: decodeTokens, ...greedy, ...extra });
        return { tok_s: (r.usage.completion_tokens - 1) / (r.pagedlm.decode_ms / 1000), tokens: r.usage.completion_tokens };
      };
      await run({});
      await run({ grammar });
      const free = [], bound = [];
      for (let i = 0; i < pairs; i++) {
        free.push(await run({}));
        bound.push(await run({ grammar }));
      }
      const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
      out.free_decode_tok_s = median(free.map((r) => r.tok_s));
      out.constrained_decode_tok_s = median(bound.map((r) => r.tok_s));
      out.ratios = free.map((f, i) => bound[i].tok_s / f.tok_s);
      out.ratio_median = median(out.ratios);
      out.tokens = { free: free.map((r) => r.tokens), constrained: bound.map((r) => r.tokens) };
      out.adapter = engine.info.adapter;
      await engine.dispose();
      return out;
    }
    if (onlyBatch) {
      const engine = await createEngine(MODEL_URL, { backend, cacheName: "pagedlm-bench", prefixCache: false, maxBatch: Math.max(...batches) });
      await aggregate(engine, 1);
      out.aggregate_decode_tok_s = {};
      for (const n of batches) out.aggregate_decode_tok_s[n] = await aggregate(engine, n);
      await engine.dispose();
      return out;
    }

    let t0 = performance.now();
    let engine = await createEngine(MODEL_URL, { backend, cacheName: "pagedlm-bench" });
    out.load_ms = performance.now() - t0;
    out.load_download_ms = engine.load.download_ms;
    out.load_engine_ms = engine.load.engine_ms;
    out.adapter = engine.info.adapter;
    await engine.dispose();
    t0 = performance.now();
    engine = await createEngine(MODEL_URL, { backend, cacheName: "pagedlm-bench" });
    out.load_from_cache_ms = performance.now() - t0;
    out.load_source_second = engine.load.source;
    await deleteCachedModel(MODEL_URL, { cacheName: "pagedlm-bench" });

    // A chat model is asked through chat, a base model (no chat template) through completions.
    const ask = (text, max_tokens) =>
      engine.info.model.chat_template
        ? engine.chat.completions.create({ messages: [user(text)], max_tokens, ...greedy })
        : engine.completions.create({ prompt: text, max_tokens, ...greedy });
    // The first request compiles the pipelines; time it apart from the steady state.
    t0 = performance.now();
    await ask("Hi", 2);
    out.first_request_ms = performance.now() - t0;

    const words = "the quick brown fox jumps over the lazy dog near a quiet river bank".split(" ");
    const long = Array.from({ length: prefillWords }, (_, i) => words[i % words.length]).join(" ");
    const prefill = await ask(`Summarize: ${long}`, 1);
    out.prefill_tokens = prefill.pagedlm.prefill_tokens;
    out.prefill_tok_s = prefill.pagedlm.prefill_tokens / (prefill.pagedlm.prefill_ms / 1000);

    const decode = await ask("Write a long story about a dragon who learns to paint.", decodeTokens);
    out.decode_tokens = decode.usage.completion_tokens;
    out.decode_tok_s = (decode.usage.completion_tokens - 1) / (decode.pagedlm.decode_ms / 1000);
    if (onlySpeed) {
      out.model = modelPath;
      out.weight_types = engine.info.model.weight_types;
      await engine.dispose();
      return out;
    }

    // A follow-up turn: the same conversation, one question more. Each engine runs it twice and
    // the second run counts: the first compiles the pipelines these prompt lengths need.
    const followUp = async (e) => {
      const first = [user("What is the capital of France?")];
      const reply = await e.chat.completions.create({ messages: first, max_tokens: 16, ...greedy });
      const second = await e.chat.completions.create({
        messages: [...first, reply.choices[0].message, user("And what is the capital of Italy?")], max_tokens: 2, ...greedy,
      });
      return { ttft_ms: second.pagedlm.ttft_ms, prompt_tokens: second.usage.prompt_tokens, prefix_hit_tokens: second.usage.prefix_hit_tokens };
    };
    await followUp(engine);
    await engine.resetCache();
    out.follow_up_cached = await followUp(engine);
    await engine.dispose();
    const uncached = await createEngine(MODEL_URL, { backend, prefixCache: false, cache: false });
    await followUp(uncached);
    out.follow_up_uncached = await followUp(uncached);
    await uncached.dispose();
    return out;
  }, { prefillWords, decodeTokens, batches, batchTokens, onlyBatch, onlySpeed, modelPath, constrained, pairs, grammar, backend });
  const round = (x) => (typeof x === "number" ? Math.round(x * 100) / 100 : x);
  const roundAll = (v) => (Array.isArray(v) ? v.map(roundAll) : v && typeof v === "object" ? Object.fromEntries(Object.entries(v).map(([a, b]) => [a, roundAll(b)])) : round(v));
  const result = roundAll(figures);
  if (figures.follow_up_cached) result.follow_up_ttft_speedup = round(figures.follow_up_uncached.ttft_ms / figures.follow_up_cached.ttft_ms);
  const errors = problems.filter((p) => !/404|Not Found/.test(p));
  if (errors.length) result.page_errors = errors;
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
  server.close();
}
