// Static server for the chat page: www/ at "/", the wasm package at "/pkg/", the models at "/models/".
// Binds 127.0.0.1 only. PORT overrides 8080; PAGEDLM_MODELS_DIR serves another folder at "/models/"
// (the page's picker says how to fetch a model the folder lacks). Byte ranges (and If-Range) are
// answered, so the package's model downloads resume (scripts/range.mjs).
import { createServer } from "node:http";
import { createReadStream, statSync } from "node:fs";
import { extname, join, normalize, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { writeHead } from "./range.mjs";

const root = resolve(fileURLToPath(new URL("..", import.meta.url)));
const port = Number(process.env.PORT || 8080);
const host = process.env.HOST || "127.0.0.1";
const types = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8", ".wasm": "application/wasm", ".json": "application/json", ".svg": "image/svg+xml",
  ".png": "image/png", ".gguf": "application/octet-stream", ".ts": "text/plain; charset=utf-8",
};
// PAGEDLM_SERVE_PEERS=1 (bench/peers.sh) also serves the benchmark peers' browser builds from
// node_modules (wllama 2.x and 3.x: ES module and wasm), so a benchmark fetches nothing from elsewhere.
const peerMounts = process.env.PAGEDLM_SERVE_PEERS === "1"
  ? [["/peers/wllama-2/", "node_modules/wllama-v2/esm"], ["/peers/wllama-3/", "node_modules/@wllama/wllama/esm"]]
  : [];
const mounts = [...peerMounts, ["/pkg/", "pkg"], ["/models/", process.env.PAGEDLM_MODELS_DIR || "models"], ["/js/", "js"], ["/", "www"]];
// Cross-origin isolation (SharedArrayBuffer, so wasm threads) on every response, the 404 too: the
// benchmarks run in a blank page at an unknown path.
const isolation = {
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-embedder-policy": "require-corp",
  "cross-origin-resource-policy": "cross-origin",
};

function resolvePath(urlPath) {
  for (const [prefix, dir] of mounts) {
    if (urlPath.startsWith(prefix)) {
      const rel = normalize(decodeURIComponent(urlPath.slice(prefix.length))).replace(/^(\.\.[/\\])+/, "");
      const base = resolve(root, dir);
      const full = join(base, rel || "index.html");
      return full.startsWith(base) ? full : null;
    }
  }
  return null;
}

const server = createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  if (req.method === "OPTIONS") {
    // A cross-origin page's resumed download (If-Range is not a CORS-safelisted header) asks first.
    res.writeHead(204, { ...isolation, "access-control-allow-origin": "*", "access-control-allow-headers": "range, if-range", "access-control-max-age": "600" });
    res.end();
    return;
  }
  let file = resolvePath(url.pathname);
  let st;
  try { st = file && statSync(file); if (st && st.isDirectory()) { file = join(file, "index.html"); st = statSync(file); } } catch { st = null; }
  if (!st) { res.writeHead(404, { "content-type": "text/plain", ...isolation }); res.end("not found"); return; }
  const body = writeHead(req, res, st, st.size, {
    "content-type": types[extname(file)] || "application/octet-stream",
    "cache-control": "no-cache",
    ...isolation,
    "access-control-allow-origin": "*",
    "access-control-expose-headers": "content-range, content-length, etag, last-modified, accept-ranges",
  });
  if (!body) { res.end(); return; }
  createReadStream(file, body).pipe(res);
});
server.listen(port, host, () => console.log(`pagedlm: serving the chat page at http://${host}:${port}/`));
