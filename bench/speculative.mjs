// Speculative decoding's figures for the README (issue 40): decode tokens/s with speculation off
// and auto on one workload, natively through `pagedlm generate` and in headless Chromium through
// the npm package, with their ratio per item (runs in turn, greedy, the same machine).
//
// The workload (SmolLM2-135M by default): an editing request (correct the spelling of a paragraph
// of tests/data/alice_chapter1.txt, 371 tokens, written out whole) with drafts from prompt lookup, the same
// with the corrected paragraph as `prediction`, a rename in three functions (about 330 tokens of
// code) with prompt lookup and with the code as `prediction` (as OpenAI's guide to predicted
// outputs does for a refactoring), a rename in a small function, and three free chat prompts.
//
// Usage: node bench/speculative.mjs [native-cpu] [native-webgpu] [browser-cpu] [browser-webgpu]
// (default: native-cpu native-webgpu browser-cpu). Env: SPEC_MAX_TOKENS (300), SPEC_RUNS (2: the
// median of each; the order of off and auto alternates from run to run), SPEC_ITEMS (items whose
// id contains one of these comma-separated words, e.g. "free"), BENCH_MODEL (a .gguf under
// models/), SPEC_ARGS (more `pagedlm generate` arguments natively, e.g. "--activations int8"),
// SPEC_WASM=simd128 (the browser gets no relaxed-SIMD build, so the worker takes the SIMD128 one).
// Needs `cargo build --release` and pkg/ (bash scripts/build-web.sh) for the browser.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { launch, openPage, root, startServer } from "../tests/e2e/helpers.mjs";

const maxTokens = Number(process.env.SPEC_MAX_TOKENS || 300);
const runs = Number(process.env.SPEC_RUNS || 2);
const modelFile = process.env.BENCH_MODEL || "SmolLM2-135M-Instruct.Q4_1.gguf";
const where = process.argv.slice(2).length ? process.argv.slice(2) : ["native-cpu", "native-webgpu", "browser-cpu"];

const text = readFileSync(join(root, "tests/data/alice_chapter1.txt"), "utf8");
const paragraph = text.slice(2000, 3400);
const typos = paragraph.replace(/ the /g, (m, i) => (i % 3 === 0 ? " teh " : m)).replace(/and/g, (m, i) => (i % 2 === 0 ? "adn" : m));
const code = `function tally(items) {
  let count = 0;
  for (const item of items) {
    if (item.done) count += 1;
    else if (item.partial) count += 0.5;
  }
  console.log("count", count);
  return count;
}
`;
// About 330 tokens of code (333 in SmolLM2's vocabulary).
const longCode = `function summarize(orders, today) {
  let count = 0;
  let revenue = 0;
  const late = [];
  for (const order of orders) {
    if (order.cancelled) continue;
    count += 1;
    revenue += order.price * order.quantity;
    if (order.due < today && !order.shipped) {
      late.push(order.id);
    }
  }
  const average = count > 0 ? revenue / count : 0;
  console.log("orders", count, "revenue", revenue.toFixed(2));
  if (late.length > 0) {
    console.log("late orders:", late.join(", "));
  }
  return { count, revenue, average, late };
}

function report(groups, today) {
  const lines = [];
  for (const [name, orders] of Object.entries(groups)) {
    const summary = summarize(orders, today);
    lines.push(name + ": " + summary.count + " orders, " + summary.late.length + " late");
  }
  return lines.join("\\n");
}

function overdue(orders, today) {
  let count = 0;
  for (const order of orders) {
    if (!order.shipped && !order.cancelled && order.due < today) {
      count += 1;
    }
  }
  console.log("overdue", count);
  return count;
}
`;
const user = (content) => [{ role: "user", content }];
// SmolLM2-135M writes a text out again when asked this way (other wordings get a reply about it).
const fix = `Correct the spelling in the following text. Write out the whole corrected text.\n\nText:\n${typos}\n\nCorrected text:`;
const rename = `Rename the variable count to total in this code. Write out the whole code.\n\nCode:\n${code}\nCode with total:`;
const renameLong = `Rename the variable count to total in this code. Write out the whole code.\n\nCode:\n${longCode}\nCode with total:`;
const ALL_ITEMS = [
  { id: "edit, prompt lookup", messages: user(fix) },
  { id: "edit, prediction", messages: user(fix), prediction: { type: "content", content: paragraph } },
  { id: "rename 330, lookup", messages: user(renameLong) },
  { id: "rename 330, prediction", messages: user(renameLong), prediction: { type: "content", content: longCode } },
  { id: "rename, lookup", messages: user(rename) },
  { id: "free: a poem", messages: user("Write a short poem about the sea.") },
  { id: "free: tips", messages: user("What are three tips for staying productive when working from home?") },
  { id: "free: rainbow", messages: user("Explain how a rainbow forms.") },
];
const picked = process.env.SPEC_ITEMS?.split(",").filter(Boolean);
const ITEMS = picked ? ALL_ITEMS.filter((item) => picked.some((word) => item.id.includes(word))) : ALL_ITEMS;
if (!ITEMS.length) throw new Error(`SPEC_ITEMS=${process.env.SPEC_ITEMS} picks no item`);
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

/** Per item: {tok_s, tokens, accepted, rejected} of each run, natively. */
function native(backend, speculative) {
  const dir = mkdtempSync(join(tmpdir(), "pagedlm-spec-"));
  const input = join(dir, "items.json");
  writeFileSync(input, JSON.stringify(ITEMS));
  const args = ["generate", "--model", join(root, "models", modelFile), "--backend", backend, "--max-tokens", String(maxTokens), "--speculative", speculative, "--input", input, ...(process.env.SPEC_ARGS?.split(" ").filter(Boolean) ?? [])];
  const lines = execFileSync(join(root, "target/release/pagedlm"), args, { encoding: "utf8", maxBuffer: 1 << 26 }).trim().split("\n").map((l) => JSON.parse(l));
  return lines.map((g) => ({ tokens: g.tokens, n: g.tokens.length, tok_s: (g.tokens.length - 1) / (g.decode_ms / 1000), accepted: g.accepted_prediction_tokens, rejected: g.rejected_prediction_tokens }));
}

/** The same in Chromium, through the package: one engine per mode, the items in turn. */
async function inBrowser(page, backend, speculative) {
  return page.evaluate(async ({ items, backend, speculative, maxTokens, modelFile }) => {
    const { createEngine } = await import("/js/index.js");
    const engine = await createEngine(`/models/${modelFile}`, { backend, speculative, cacheName: "pagedlm-bench" });
    const out = [];
    for (const item of items) {
      const { id, ...params } = item;
      let tokens = [];
      const r = await engine.chat.completions.create({ ...params, max_tokens: maxTokens, temperature: 0 });
      tokens = r.choices[0].message.content;
      const d = r.usage.completion_tokens_details;
      out.push({ tokens, n: r.usage.completion_tokens, tok_s: (r.usage.completion_tokens - 1) / (r.pagedlm.decode_ms / 1000), accepted: d.accepted_prediction_tokens, rejected: d.rejected_prediction_tokens, variant: engine.info.variant });
    }
    await engine.dispose();
    return out;
  }, { items: ITEMS, backend, speculative, maxTokens, modelFile });
}

const figures = {};
let server;
let browser;
let page;
try {
  for (const w of where) {
    const [kind, backend] = w.split("-");
    if (kind === "browser" && !page) {
      server = await startServer();
      browser = await launch();
      ({ page } = await openPage(browser));
      if (process.env.SPEC_WASM === "simd128") await page.route("**/pagedlm_relaxed_bg.wasm", (r) => r.fulfill({ status: 404 }));
      await page.goto(`${server.url}/bench-blank`);
    }
    const rows = { off: [], auto: [] };
    for (let r = 0; r < runs; r++) {
      for (const mode of r % 2 ? ["auto", "off"] : ["off", "auto"]) rows[mode].push(kind === "native" ? native(backend, mode) : await inBrowser(page, backend, mode));
    }
    figures[w] = ITEMS.map((item, i) => {
      const off = median(rows.off.map((run) => run[i].tok_s));
      const auto = median(rows.auto.map((run) => run[i].tok_s));
      const last = rows.auto.at(-1)[i];
      const same = JSON.stringify(rows.off.at(-1)[i].tokens) === JSON.stringify(last.tokens);
      return { item: item.id, tokens: last.n, off_tok_s: +off.toFixed(1), auto_tok_s: +auto.toFixed(1), ratio: +(auto / off).toFixed(2), accepted: last.accepted, rejected: last.rejected, same_output: same };
    });
    if (kind === "browser") console.log(`${w}: ${rows.auto.at(-1)[0].variant}`);
    for (const f of figures[w]) console.log(`${w.padEnd(15)} ${f.item.padEnd(20)} ${String(f.tokens).padStart(4)} tokens  off ${String(f.off_tok_s).padStart(6)}  auto ${String(f.auto_tok_s).padStart(6)}  ×${f.ratio}  drafts ${f.accepted}/${f.accepted + f.rejected}${f.same_output ? "" : "  OUTPUT DIFFERS"}`);
  }
} finally {
  await browser?.close();
  await server?.close();
}
console.log(JSON.stringify({ model: modelFile, max_tokens: maxTokens, runs, figures }));
