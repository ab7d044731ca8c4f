// End-to-end: a short soak run through the package on the tiny synthetic model (tests/e2e/soak.mjs;
// the long runs are scripts/soak.mjs, `npm run soak`).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { root, tinyModel } from "./helpers.mjs";
import { checkSoak, soak, soakSetup } from "./soak.mjs";

const REQUESTS = Number(process.env.PAGEDLM_SOAK_REQUESTS || 80);

describe("soak", () => {
  let setup;
  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    setup = await soakSetup(tinyModel("tiny.gguf"));
  });
  after(async () => setup?.close());

  it(`${REQUESTS} requests, 4 at a time over a small pool, with aborts, breaks, disposes and a lost device: nothing lost, nothing grows`, { timeout: 900_000 }, async () => {
    const out = await soak(setup.browser, setup.server.url, {
      model: "/models/tiny.gguf", requests: REQUESTS, seed: 7, disposeEvery: 70, loseEvery: 40,
      // WebGPU: the lost devices are its (the default, auto, takes the CPU backend on SwiftShader).
      engineOptions: { maxContext: 512, poolTokens: 640, blockSize: 16, maxBatch: 4, backend: "webgpu" },
    });
    const g = checkSoak(out, { window: Math.min(50, Math.floor(REQUESTS / 3)) });
    const mb = (b) => (b / 1e6).toFixed(1);
    assert.equal(out.losses, Math.floor((REQUESTS - 1) / 40) - Math.floor((REQUESTS - 1) / 280), "the device losses happened and were recovered from");
    console.log(`soak: ${out.requests} requests in ${(out.ms / 1000).toFixed(0)} s on ${out.engines} engines, ${out.losses} device losses: ${JSON.stringify(out.outcomes)}; `
      + `preemptions ${out.final.sched.preemptions}, evictions ${out.final.prefix.evictions}; heap ${mb(g.heap.first)} -> ${mb(g.heap.last)} MB, `
      + `wasm ${mb(g.wasm.first)} -> ${mb(g.wasm.last)} MB, GPU ${mb(g.gpu.first)} -> ${mb(g.gpu.last)} MB`);
  });
});
