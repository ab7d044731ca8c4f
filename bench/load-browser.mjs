// Browser load figures (issue 39): wasm memory and time of one `createEngine` through the package
// in headless Chromium, from the network without storage (`cache: false`) and again from browser
// storage, for the model at MODEL (a path under models/ or PAGEDLM_MODELS_DIR). Compare builds by
// running it from two checkouts (ROOT = the checkout whose scripts/serve.mjs, js/ and pkg/ serve).
// Usage: node bench/load-browser.mjs [MODEL_FILE] [webgpu|cpu]
//   env: ROOT (default: this checkout), PAGEDLM_MODELS_DIR (default: ROOT/models)
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { freePort } from "../tests/e2e/helpers.mjs";

const here = fileURLToPath(new URL("..", import.meta.url));
const root = process.env.ROOT || here;
const [file = "SmolLM2-135M-Instruct.Q4_1.gguf", backend = "webgpu"] = process.argv.slice(2);
const port = await freePort();
const server = spawn(process.execPath, [`${root}/scripts/serve.mjs`], {
  env: { ...process.env, PORT: String(port), PAGEDLM_MODELS_DIR: process.env.PAGEDLM_MODELS_DIR || `${root}/models` },
  stdio: ["ignore", "pipe", "inherit"],
});
await new Promise((resolve) => server.stdout.on("data", (d) => String(d).includes("serving") && resolve()));
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox", "--enable-unsafe-webgpu"] });
try {
  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${port}/js/index.js`);
  const out = await page.evaluate(async ({ file, backend }) => {
    const { createEngine } = await import("/js/index.js");
    const once = async (options) => {
      const t0 = performance.now();
      try {
        const engine = await createEngine(`/models/${file}`, { backend, ...options });
        const ms = performance.now() - t0;
        const stats = await engine.stats();
        await engine.dispose();
        return { ms: Math.round(ms), wasm_bytes: stats.wasm_bytes, weights_bytes: stats.memory.weights_bytes };
      } catch (e) {
        return { error: `${e?.code}: ${String(e?.message).slice(0, 200)}` };
      }
    };
    const network = await once({ cache: false });
    await once({});
    const storage = await once({});
    return { network, storage };
  }, { file, backend });
  console.log(JSON.stringify({ root, file, backend, ...out }));
} finally {
  await browser.close();
  server.kill();
}
