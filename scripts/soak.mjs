// The long soak runs (README "Reliability"), outside `npm test`: the package in headless Chromium,
// 4 streams at a time over a small pool, with random prompts, lengths, sampling settings, aborts,
// breaks, disposes and lost GPU devices (tests/e2e/soak.mjs). First the tiny synthetic model, many requests
// (SOAK_TINY, default 400), then the real SmolLM2, fewer (SOAK_REAL, default 60; 0 skips it).
// Prints one JSON line per run and fails if a run loses anything or grows.
//   npm run soak            (needs pkg/ and models/: `npm run build`, `npm run fetch-model`)
import { existsSync } from "node:fs";
import { join } from "node:path";
import { root, tinyModel } from "../tests/e2e/helpers.mjs";
import { checkSoak, soak, soakSetup } from "../tests/e2e/soak.mjs";

const runs = [
  { name: "tiny synthetic model", requests: Number(process.env.SOAK_TINY ?? 400), dir: () => tinyModel("tiny.gguf"), model: "/models/tiny.gguf",
    engineOptions: { maxContext: 512, poolTokens: 640, blockSize: 16, maxBatch: 4 }, maxTokens: 40, disposeEvery: 100, loseEvery: 75 },
  { name: "SmolLM2-135M-Instruct Q4_1", requests: Number(process.env.SOAK_REAL ?? 60), dir: () => null, model: "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    engineOptions: { maxContext: 256, poolTokens: 384, blockSize: 16, maxBatch: 4 }, maxTokens: 12, disposeEvery: 30, loseEvery: 25 },
];

if (!existsSync(join(root, "pkg/pagedlm_bg.wasm"))) {
  console.error("soak: pkg/ is missing: run `npm run build` first");
  process.exit(1);
}
let failed = false;
for (const run of runs.filter((r) => r.requests > 0)) {
  const setup = await soakSetup(run.dir());
  try {
    const out = await soak(setup.browser, setup.server.url, { model: run.model, requests: run.requests, seed: 20261204, engineOptions: run.engineOptions, maxTokens: run.maxTokens, disposeEvery: run.disposeEvery, loseEvery: run.loseEvery });
    const window = Math.min(50, Math.floor(run.requests / 3));
    let verdict = "ok";
    let memory = null;
    try {
      memory = checkSoak(out, { window });
    } catch (e) {
      verdict = e.message.split("\n")[0];
      failed = true;
    }
    console.log(JSON.stringify({
      run: run.name, verdict, requests: out.requests, seconds: Math.round(out.ms / 1000), engines: out.engines, device_losses: out.losses, outcomes: out.outcomes,
      failures: out.failures.length, integrity_failures: out.integrity.length, preemptions: out.final.sched.preemptions, evictions: out.final.prefix.evictions,
      final_pool: out.final.pool, window, memory,
    }));
  } finally {
    await setup.close();
  }
}
process.exit(failed ? 1 : 0);
