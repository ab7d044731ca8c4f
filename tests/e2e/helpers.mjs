// Shared by the end-to-end tests and the browser benchmark: static servers, Chromium with
// WebGPU (SwiftShader when there is no GPU), and pages that report their errors.
import { execFileSync, spawn } from "node:child_process";
import { createReadStream, mkdirSync, statSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { writeHead } from "../../scripts/range.mjs";

export const root = fileURLToPath(new URL("../..", import.meta.url));
export const results = join(root, "test-results");
export const MODEL = join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
export const BASE_ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];

export const byId = (id) => `[data-testid="${id}"]`;

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Starts scripts/serve.mjs (the chat page) with `env` added; resolves once it listens. */
export async function startServer(env = {}) {
  const port = await freePort();
  const child = spawn(process.execPath, [join(root, "scripts/serve.mjs")], {
    env: { ...process.env, ...env, PORT: String(port) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve.mjs did not start in 10 s:\n${log}`)), 10_000);
    child.stdout.on("data", (d) => { log += d; if (log.includes("serving")) { clearTimeout(timer); resolve(); } });
    child.stderr.on("data", (d) => { log += d; });
    child.once("exit", (code) => { clearTimeout(timer); reject(new Error(`serve.mjs exited with ${code}:\n${log}`)); });
  });
  return { child, url: `http://127.0.0.1:${port}`, close: () => child.kill() };
}

const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
  ".wasm": "application/wasm", ".json": "application/json", ".ts": "text/plain; charset=utf-8" };

/**
 * A static server over `dir`, plus `routes`: {"/path": {file, bytes?, cutAt?, truncateAt?, noRange?}}
 * served from elsewhere: `bytes` = only the first n bytes (a short file, its length told truly);
 * `cutAt` = close the connection after n body bytes, once (then serve normally); `truncateAt` =
 * close it at byte n of the file, every time (the server promises more bytes than it ever
 * sends); `stallAt` = stop sending after n body bytes and keep the connection open (once;
 * `stallAlways`: every time), as a server or proxy that hangs does; `noRange` = ignore Range
 * (always the whole file, 200). Routes may be changed between requests (a file replaced). Byte
 * ranges, ETag and If-Range as scripts/serve.mjs answers them. Counts requests (`hits`) and the
 * body bytes sent (`served`) per path.
 */
export async function staticServer(dir, routes = {}) {
  const hits = new Map();
  const served = new Map();
  const server = createHttpServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    hits.set(path, (hits.get(path) ?? 0) + 1);
    const route = routes[path];
    let file;
    if (route) {
      file = route.file;
    } else {
      const rel = normalize(path).replace(/^(\.\.[/\\])+/, "");
      file = join(dir, rel.endsWith("/") ? `${rel}index.html` : rel);
      if (!file.startsWith(dir)) file = null;
    }
    let stat = null;
    try { stat = file ? statSync(file) : null; } catch { stat = null; }
    if (!stat || stat.isDirectory()) { res.writeHead(404); res.end("not found"); return; }
    const size = Math.min(stat.size, route?.bytes ?? Infinity);
    const body = writeHead(req, res, stat, size,
      { "content-type": TYPES[extname(file)] ?? "application/octet-stream", "cache-control": "no-cache" }, { ranges: !route?.noRange });
    if (!body) { res.end(); return; }
    let limit = route?.truncateAt != null ? Math.max(0, route.truncateAt - body.start) : Infinity;
    if (route?.cutAt != null && !route.cut) {
      route.cut = true;
      limit = route.cutAt;
    }
    let stall = Infinity;
    if (route?.stallAt != null && (route.stallAlways || !route.stalled)) {
      route.stalled = true;
      stall = Math.max(0, route.stallAt - body.start);
    }
    let sent = 0;
    const stream = createReadStream(file, body);
    const count = (n) => { sent += n; served.set(path, (served.get(path) ?? 0) + n); };
    stream.on("data", (chunk) => {
      if (sent + chunk.length >= stall) {
        // Bytes up to `stall`, then silence on an open connection (closed when the client goes).
        stream.destroy();
        const part = chunk.subarray(0, stall - sent);
        count(part.length);
        res.write(part);
        return;
      }
      if (sent + chunk.length >= limit) {
        // The first `limit` bytes reach the client, then the connection ends mid-body, a moment
        // later as a failing network does (Chrome drops body bytes it has not handed to the page
        // when the error lands with them).
        stream.destroy();
        const part = chunk.subarray(0, limit - sent);
        count(part.length);
        res.write(part, () => setTimeout(() => req.socket.destroy(), 200));
        return;
      }
      count(chunk.length);
      if (!res.write(chunk)) {
        stream.pause();
        res.once("drain", () => stream.resume());
      }
    });
    stream.on("end", () => res.end());
    stream.on("error", () => req.socket.destroy());
  });
  const port = await freePort();
  await new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${port}`, hits, served,
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }),
  };
}

/** Chromium, headless; with WebGPU unless `webgpu: false`. */
export function launch({ webgpu = true, args = [] } = {}) {
  return chromium.launch({ executablePath: CHROMIUM, args: [...BASE_ARGS, ...(webgpu ? ["--enable-unsafe-webgpu"] : []), ...args] });
}

/** A page that records its console errors and exceptions, to explain a failure. */
export async function openPage(browserOrContext, url, viewport = { width: 1280, height: 800 }) {
  const page = await browserOrContext.newPage({ viewport });
  const problems = [];
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  if (url) await page.goto(url);
  return { page, problems };
}

/**
 * A tiny synthetic model (random weights, a 259-token byte vocabulary: it decodes in
 * milliseconds per token even on SwiftShader) at test-results/fixtures/`file`, written by
 * `examples/write_tiny_model.rs` with `args` (e.g. ["--name", "..."]). Returns its folder.
 */
export function tinyModel(file = "tiny.gguf", args = []) {
  const dir = join(results, "fixtures");
  const out = join(dir, file);
  mkdirSync(dir, { recursive: true });
  // scripts/test.sh builds the writer first (PAGEDLM_TINY_MODEL_WRITER): beside the native suites
  // a `cargo run` would wait for the build directory.
  const writer = process.env.PAGEDLM_TINY_MODEL_WRITER;
  if (writer) execFileSync(join(root, writer), [out, ...args], { stdio: ["ignore", "inherit", "inherit"] });
  else execFileSync("cargo", ["run", "--quiet", "--features", "testing", "--example", "write_tiny_model", "--", out, ...args], { cwd: root, stdio: ["ignore", "inherit", "inherit"] });
  return dir;
}
