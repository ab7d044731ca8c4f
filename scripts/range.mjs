// HTTP byte ranges for the static servers (scripts/serve.mjs, tests/e2e/helpers.mjs): one
// `Range: bytes=a-b` / `bytes=a-` / `bytes=-n` answered with 206 and Content-Range, an ETag from
// the file's size and mtime, and `If-Range` honoured (a validator that no longer matches gets the
// whole file, 200), so the package's downloads resume where they stopped.

/** A strong validator that changes whenever the file's size or mtime does. */
export function etagOf(stat) {
  return `"${stat.size.toString(16)}-${Math.floor(stat.mtimeMs).toString(16)}"`;
}

/**
 * The byte range `headers` ask for out of `size` bytes: `{start, end}` (end inclusive), null for
 * the whole body (no Range, a stale If-Range, several ranges, or a header we do not parse: RFC
 * 9110 lets a server ignore those), or "unsatisfiable" (416).
 */
export function requestedRange(headers, size, etag, lastModified) {
  const header = headers.range;
  if (!header) return null;
  const ifRange = headers["if-range"];
  if (ifRange && ifRange !== etag && ifRange !== lastModified) return null;
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === "" && m[2] === "")) return null;
  let start;
  let end;
  if (m[1] === "") {
    const suffix = Number(m[2]);
    if (suffix === 0) return "unsatisfiable";
    start = Math.max(0, size - suffix);
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  if (start >= size || start > end) return "unsatisfiable";
  return { start, end };
}

/**
 * Writes the head of a GET/HEAD answer for a file of `size` bytes (`stat` for its validators):
 * 200, 206 with Content-Range, or 416; `headers` added. `ranges: false` answers every request
 * with the whole file (a server that ignores Range). Returns the body to send as `{start, end}`
 * (end inclusive), or null when there is none (HEAD, 416, an empty file).
 */
export function writeHead(req, res, stat, size, headers, { ranges = true } = {}) {
  const etag = etagOf(stat);
  const lastModified = stat.mtime.toUTCString();
  const common = { ...headers, etag, "last-modified": lastModified, ...(ranges ? { "accept-ranges": "bytes" } : {}) };
  const range = ranges ? requestedRange(req.headers, size, etag, lastModified) : null;
  if (range === "unsatisfiable") {
    res.writeHead(416, { ...common, "content-range": `bytes */${size}`, "content-length": 0 });
    return null;
  }
  if (range) {
    res.writeHead(206, { ...common, "content-range": `bytes ${range.start}-${range.end}/${size}`, "content-length": range.end - range.start + 1 });
  } else {
    res.writeHead(200, { ...common, "content-length": size });
  }
  if (req.method === "HEAD" || size === 0) return null;
  return range ?? { start: 0, end: size - 1 };
}
