// The browser twin of `pagedlm profile`: `npm run bench:profile-browser -- [--prompt-tokens 512]
// [--json | --table] [--no-timestamps] [--model FILE.gguf]`. Loads the real model through the npm
// package in headless Chromium (WebGPU; SwiftShader without a GPU), runs `engine.profile` (one
// prefill and one steady-state decode step, per-kernel GPU times from timestamp queries where
// Chromium offers them) and prints the same JSON object as the CLI, or the same table.
//
// Chromium quantizes WebGPU timestamps to 100 µs for web pages, but not under
// --enable-unsafe-webgpu, which headless Chromium needs for WebGPU anyway (SwiftShader offers
// `timestamp-query` there, at sub-microsecond resolution). PROFILE_CHROMIUM_ARGS adds flags
// (space-separated), e.g. for a real GPU.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BASE_ARGS, openPage, root, startServer } from "../tests/e2e/helpers.mjs";

function parseArgs(argv) {
  const out = { promptTokens: 512, json: true, timestamps: true, model: "SmolLM2-135M-Instruct.Q4_1.gguf" };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    if (a === "--prompt-tokens") out.promptTokens = Number(value());
    else if (a === "--model") out.model = value();
    else if (a === "--json") out.json = true;
    else if (a === "--table") out.json = false;
    else if (a === "--no-timestamps") out.timestamps = false;
    else throw new Error(`unknown option ${a} (known: --prompt-tokens N, --model FILE, --json, --table, --no-timestamps)`);
  }
  if (!Number.isInteger(out.promptTokens) || out.promptTokens < 1) throw new Error("--prompt-tokens takes a positive whole number");
  return out;
}

/** The profile as the CLI's `--table` prints it. */
function table(p) {
  const pf = p.prefill;
  const d = p.decode;
  const method = p.method === "timestamps"
    ? "GPU timestamps around each dispatch of one submission"
    : "the host clock, each kernel submitted and waited for alone";
  const lines = [`pagedlm profile on ${p.adapter}`, `per-kernel times from ${method}`, ""];
  const row = (name, a, b, digits) => lines.push(name.padEnd(26) + a.toFixed(digits).padStart(16) + b.toFixed(digits).padStart(16));
  lines.push("".padEnd(26) + `prefill ${pf.tokens}`.padStart(16) + `decode @${d.context}`.padStart(16));
  row("wall ms", pf.wall_ms, d.wall_ms, 2);
  row("GPU ms (sum of kernels)", pf.gpu_ms, d.gpu_ms, 2);
  const span = (s) => (s.gpu_span_ms == null ? "n/a" : s.gpu_span_ms.toFixed(2));
  lines.push("GPU span ms (first..last)".padEnd(26) + span(pf).padStart(16) + span(d).padStart(16));
  row("host ms (record+submit)", pf.host_ms, d.host_ms, 3);
  row("dispatches", pf.dispatches, d.dispatches, 0);
  row("submits", pf.submits, d.submits, 0);
  row("readbacks", pf.readbacks, d.readbacks, 0);
  row("blocking readbacks", pf.blocking_readbacks, d.blocking_readbacks, 0);
  row("bytes read back / token", pf.bytes_read_back_per_token, d.bytes_read_back_per_token, 1);
  row("buffers created", pf.buffers_created, d.buffers_created, 0);
  row("bind groups created", pf.bind_groups_created, d.bind_groups_created, 0);
  row("tokens/s (wall)", (pf.tokens * 1000) / pf.wall_ms, 1000 / d.wall_ms, 1);
  const c = p.prefill_cold;
  lines.push(`first prefill: ${c.wall_ms.toFixed(1)} ms wall, ${c.buffers_created} buffers (${(c.buffer_bytes_created / 2 ** 20).toFixed(1)} MiB), ` +
    `${c.bind_groups_created} bind groups, ${c.pipelines_compiled} pipelines compiled`);
  for (const [what, step] of [["prefill", pf], ["decode", d]]) {
    lines.push("", `${what} kernel`.padEnd(32) + "ms".padStart(12) + "calls".padStart(8) + "share".padStart(8));
    for (const k of step.kernels) {
      const share = step.gpu_ms > 0 ? (100 * k.ms) / step.gpu_ms : 0;
      lines.push(k.name.padEnd(32) + k.ms.toFixed(3).padStart(12) + String(k.dispatches).padStart(8) + `${share.toFixed(1)}%`.padStart(8));
    }
  }
  return `${lines.join("\n")}\n`;
}

let options;
try {
  options = parseArgs(process.argv.slice(2));
} catch (e) {
  console.error(`profile-browser: ${e.message}`);
  process.exit(2);
}
if (!existsSync(join(root, "pkg/pagedlm_bg.wasm")) || !existsSync(join(root, "models", options.model))) {
  console.error(`profile-browser needs pkg/ (bash scripts/build-web.sh) and models/${options.model} (npm run fetch-model)`);
  process.exit(1);
}

const flags = [...BASE_ARGS, "--enable-unsafe-webgpu"];
if (process.env.PROFILE_CHROMIUM_ARGS) flags.push(...process.env.PROFILE_CHROMIUM_ARGS.split(" ").filter(Boolean));
const server = await startServer();
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: flags });
try {
  const { page, problems } = await openPage(browser, `${server.url}/bench-blank`);
  const profile = await page.evaluate(async ({ promptTokens, timestamps, model }) => {
    const { createEngine } = await import("/js/index.js");
    const engine = await createEngine(`/models/${model}`, { cacheName: "pagedlm-bench", maxContext: promptTokens + 64 });
    try {
      return await engine.profile(promptTokens, { timestamps });
    } finally {
      await engine.dispose();
      await caches.delete("pagedlm-bench");
    }
  }, options);
  profile.chromium_flags = flags.filter((f) => !BASE_ARGS.includes(f));
  const errors = problems.filter((p) => !/404|Not Found/.test(p));
  if (errors.length) profile.page_errors = errors;
  if (options.json) console.log(JSON.stringify(profile));
  else process.stdout.write(table(profile));
} finally {
  await browser.close();
  server.close();
}
