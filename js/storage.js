// Where downloaded models live between visits, and how a download survives a cut.
//
// A model URL is downloaded into the origin private file system (OPFS): folder `name` (the
// package's `cacheName`), one file per URL named by a hash of it, and a JSON sidecar beside it
// ({url, model, part, parts, size, etag, lastModified, complete, written}). The worker writes
// through a sync access handle at offsets and flushes every few MB or second, writing `written`
// into the sidecar at each flush, so that a download cut anywhere (a network error, a closed tab)
// continues after a reload from the bytes on disk with `Range: bytes=N-` and `If-Range`. A file
// is handed to the engine only once its sidecar says complete and its size matches.
//
// Where OPFS is missing, the Cache API holds whole responses (no resume); where that is missing
// too, or `cache: false`, the download goes into a Blob, which Chrome keeps on disk when it is big.
//
// A split GGUF (llama.cpp's gguf-split naming, `name-00001-of-00003.gguf`) is every part, in
// order: downloaded, listed and deleted together.
//
// The worker downloads (`modelFiles`); the page lists and deletes (`listCachedModels`,
// `deleteCachedModel`), which work in either.

export const DEFAULT_STORE = "pagedlm-models-v1";

/** How often a download makes its progress durable (the most a cut tab loses). */
const FLUSH_BYTES = 16 << 20;
const FLUSH_MS = 1000;
/** A download that receives nothing for this long is asked again from where it stopped (OPFS) or fails. */
export const DEFAULT_STALL_MS = 30_000;
/** Stalls in a row (no byte between them) before a download fails. */
const MAX_STALLS = 3;
/** A flush to storage slower than this is reported in a progress note. */
const SLOW_FLUSH_MS = 5_000;
/** How often download progress is reported. */
const REPORT_MS = 50;

const PART = /-(\d{5})-of-(\d{5})\.gguf$/i;

function fail(code, message) {
  return Object.assign(new Error(message), { code });
}

const secondsText = (ms) => `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
const bytesText = (n) => `${n.toLocaleString("en-US")} bytes (${(n / 1e9).toFixed(2)} GB)`;

/**
 * The URLs of the model at `url`: every part of a split GGUF, in order (whichever part `url`
 * names), else `[url]`.
 */
export function modelParts(url) {
  const parsed = new URL(url);
  const m = PART.exec(parsed.pathname);
  if (!m) return [parsed.href];
  const [no, count] = [Number(m[1]), Number(m[2])];
  if (count < 1 || no < 1 || no > count) return [parsed.href];
  const stem = parsed.pathname.slice(0, m.index);
  return Array.from({ length: count }, (_, i) => {
    const part = new URL(parsed.href);
    part.pathname = `${stem}-${String(i + 1).padStart(5, "0")}-of-${m[2]}.gguf`;
    return part.href;
  });
}

/** A file name for `url` (FNV-1a 64): the sidecar holds the URL, so a collision is seen, not trusted. */
function fileKey(url) {
  let hash = 0xcbf29ce484222325n;
  for (const byte of new TextEncoder().encode(url)) {
    hash = ((hash ^ BigInt(byte)) * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return hash.toString(16).padStart(16, "0");
}

const opfsAvailable = () => typeof navigator !== "undefined" && typeof navigator.storage?.getDirectory === "function";
/** Writing needs a sync access handle: dedicated workers only. */
const opfsWritable = () => opfsAvailable() && typeof FileSystemFileHandle !== "undefined" && "createSyncAccessHandle" in FileSystemFileHandle.prototype;

async function opfsFolder(name, create) {
  if (!opfsAvailable()) return null;
  try {
    return await (await navigator.storage.getDirectory()).getDirectoryHandle(name, { create });
  } catch {
    // Not there (create: false), or refused (an opaque origin, some private modes).
    return null;
  }
}

async function openCache(name, create) {
  if (typeof caches === "undefined") return null;
  try {
    if (!create && !(await caches.has(name))) return null;
    return await caches.open(name);
  } catch {
    return null;
  }
}

/** Runs `work` holding the Web Lock for `url`'s file, so two tabs never write one file at once. */
function withFileLock(url, work, options = {}) {
  if (typeof navigator === "undefined" || !navigator.locks) return work(true);
  return navigator.locks.request(`pagedlm-model-${fileKey(url)}`, options, work);
}

async function readMeta(folder, key) {
  try {
    const meta = JSON.parse(await (await (await folder.getFileHandle(`${key}.json`)).getFile()).text());
    return meta && typeof meta === "object" ? meta : null;
  } catch {
    return null;
  }
}

async function fileSize(folder, name) {
  try {
    return (await (await folder.getFileHandle(name)).getFile()).size;
  } catch {
    return -1;
  }
}

const isQuotaError = (e) => e?.name === "QuotaExceededError" || /quota/i.test(e?.message ?? "");

function quotaError(url, needed, available) {
  return fail("QUOTA_EXCEEDED", `Storing the model ${url} needs ${bytesText(needed)} more, but the browser offers this site only ${bytesText(Math.max(0, available))}. Free space (deleteCachedModel, or the browser's site settings) or load it with cache: false.`);
}

/** Throws QUOTA_EXCEEDED when the origin's quota has less than `needed` bytes left. */
async function checkQuota(url, needed) {
  if (!navigator.storage?.estimate || !(needed > 0)) return;
  let estimate;
  try {
    estimate = await navigator.storage.estimate();
  } catch {
    return;
  }
  const available = (estimate.quota ?? Infinity) - (estimate.usage ?? 0);
  if (needed > available) throw quotaError(url, needed, available);
}

async function request(url, headers = {}, { rangeNotSatisfiable = false } = {}) {
  let response;
  try {
    // Not the HTTP cache: the model is stored here, and a cached partial would confuse a resume.
    response = await fetch(url, { headers, cache: "no-store" });
  } catch (e) {
    throw fail("MODEL_DOWNLOAD", `Downloading the model from ${url} failed: ${e?.message || e}. Check the URL and your connection.`);
  }
  if (!response.ok && !(rangeNotSatisfiable && response.status === 416)) {
    response.body?.cancel().catch(() => {});
    throw fail("MODEL_DOWNLOAD", `Downloading the model from ${url} failed: HTTP ${response.status} ${response.statusText}.`);
  }
  return response;
}

/** `Content-Range: bytes a-b/size` as {start, end, size} (size null for `*`), else null. */
function contentRange(response) {
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(response.headers.get("content-range") ?? "");
  return m ? { start: Number(m[1]), end: Number(m[2]), size: m[3] === "*" ? null : Number(m[3]) } : null;
}

/**
 * The body's length when the bytes fetch hands over are the ones counted (no content coding,
 * whose Content-Length counts the compressed bytes), else null.
 */
function bodyLength(response) {
  const length = response.headers.get("content-length");
  const coding = response.headers.get("content-encoding");
  return length != null && (!coding || coding === "identity") ? Number(length) : null;
}

const validators = (response) => ({ etag: response.headers.get("etag"), lastModified: response.headers.get("last-modified") });

/** Reports progress at most every REPORT_MS, and always the last one. */
function throttled(report) {
  let last = -Infinity;
  return (event, force = false) => {
    const now = performance.now();
    if (!force && now - last < REPORT_MS) return;
    last = now;
    report(event);
  };
}

/**
 * Reads `body` as fast as it arrives into a queue, for a consumer that awaits between chunks: a
 * stream that errors (a cut connection) drops the chunks it still holds, so bytes that arrived
 * must be taken before the error lands. `next()` resolves to the next chunk, null at the end, or
 * rejects with the stream's error once the queue is drained. It reads at most `EAGER_BYTES` ahead
 * of the consumer, so a disk slower than the network never piles the download up in memory.
 */
/** The most bytes of a download read ahead of what is written to storage. */
const EAGER_BYTES = 64 * 1024 * 1024;

function eagerReader(body) {
  const reader = body.getReader();
  const queue = [];
  let queued = 0;
  let wake = null;
  let resume = null;
  let ended = false;
  let error = null;
  (async () => {
    try {
      for (;;) {
        // At most EAGER_BYTES ahead of the writes: a disk slower than the network must not
        // pile the download up in the worker's memory.
        while (queued >= EAGER_BYTES) await new Promise((resolve) => { resume = resolve; });
        const { done, value } = await reader.read();
        if (done) break;
        queue.push(value);
        queued += value.length;
        wake?.();
      }
    } catch (e) {
      error = e;
    }
    ended = true;
    wake?.();
  })();
  return {
    async next() {
      while (queue.length === 0 && !ended) await new Promise((resolve) => { wake = resolve; });
      wake = null;
      if (queue.length > 0) {
        const chunk = queue.shift();
        queued -= chunk.length;
        if (queued < EAGER_BYTES) {
          resume?.();
          resume = null;
        }
        return chunk;
      }
      if (error) throw error;
      return null;
    },
    cancel: () => reader.cancel().catch(() => {}),
  };
}

/**
 * A response for `url` from byte `have` on (a Range request with If-Range when `have` > 0), for
 * the download `meta` describes ({size, etag, lastModified}). Resolves to {response, have, note}:
 * `have` 0 and a `note` saying why when the server sends another file or ignores ranges, so the
 * download starts over.
 */
async function openFrom(url, have, meta) {
  if (have === 0) return { response: await request(url), have: 0, note: null };
  const validator = meta.etag ?? meta.lastModified;
  const response = await request(url, { range: `bytes=${have}-`, ...(validator ? { "if-range": validator } : {}) }, { rangeNotSatisfiable: true });
  const range = contentRange(response);
  const { etag } = validators(response);
  if (response.status === 416) {
    // Nothing past `have`: a server file shorter than the partial one (it changed), or one
    // whose last bytes were written but not yet marked complete. Either way, fetch it whole.
    const note = "the file on the server is not the one the cut download holds: downloading it again from the start";
    return { response: await request(url), have: 0, note };
  }
  if (response.status === 206 && !(range && range.start === have && (range.size == null || meta.size == null || range.size === meta.size) && (!meta.etag || !etag || etag === meta.etag))) {
    // A range of another file than the one the partial download holds: start over.
    await response.body?.cancel().catch(() => {});
    const note = "the file on the server changed since the download was cut: downloading it again from the start";
    return { response: await request(url), have: 0, note };
  }
  if (response.status !== 206) {
    const note = meta.etag || meta.lastModified
      ? "the server sent the whole file (it changed since the download was cut, or it ignores ranges): downloading it again from the start"
      : "the server ignores ranges: downloading the model again from the start";
    return { response, have: 0, note };
  }
  return { response, have, note: null };
}

/** What `next()` resolves to when nothing arrived for the stall time. */
const STALLED = Symbol("stalled");

/** `promise`, or STALLED after `ms` when it has not settled by then. */
function orStalled(promise, ms) {
  let timer;
  const stall = new Promise((resolve) => { timer = setTimeout(() => resolve(STALLED), ms); });
  return Promise.race([promise, stall]).finally(() => clearTimeout(timer));
}

/**
 * Part `index` of `urls` in OPFS folder `folder`: the stored file when complete, else downloaded
 * into it, resuming a partial download. Resolves to {blob, source: "cache"|"network"}.
 */
function opfsPart(folder, urls, index, stallMs, report) {
  const url = urls[index];
  const key = fileKey(url);
  return withFileLock(url, async () => {
    const meta = await readMeta(folder, key);
    const onDisk = await fileSize(folder, `${key}.gguf`);
    const mine = meta?.url === url;
    if (mine && meta.complete && meta.size === onDisk) {
      return { blob: await (await folder.getFileHandle(`${key}.gguf`)).getFile(), source: "cache" };
    }
    // What a cut download left: up to its last flush, and no more than the file holds.
    const kept = mine && !meta.complete ? Math.max(0, Math.min(meta.written ?? 0, onDisk)) : 0;
    const opened = await openFrom(url, kept, meta);
    let { response } = opened;
    const { have, note } = opened;
    const range = response.status === 206 ? contentRange(response) : null;
    let total = range ? range.size : bodyLength(response);
    let resumedFrom = have;
    let body = eagerReader(response.body);
    try {
      if (total != null) await checkQuota(url, total - have);
    } catch (e) {
      await body.cancel();
      throw e;
    }
    let base = { url, model: urls[0], part: index + 1, parts: urls.length, size: total, ...validators(response) };
    const handle = await folder.getFileHandle(`${key}.gguf`, { create: true });
    const access = await handle.createSyncAccessHandle();
    // The resume record's handle is opened once for the whole download and written in place at
    // each flush: asking the browser for a new handle at every flush hung in CI (one such request
    // in a few dozen never came back, and the download with it).
    let record;
    try {
      record = await (await folder.getFileHandle(`${key}.json`, { create: true })).createSyncAccessHandle();
    } catch (e) {
      access.close();
      throw e;
    }
    const putMeta = (meta) => {
      const bytes = new TextEncoder().encode(JSON.stringify(meta));
      record.truncate(0);
      record.write(bytes, { at: 0 });
      record.flush();
    };
    let at = have;
    try {
      access.truncate(have);
      access.flush();
      putMeta({ ...base, complete: false, written: have });
      const progress = throttled(report);
      const event = () => ({ phase: "download", loaded: at, total: total ?? 0, ...(resumedFrom > 0 ? { resumed_from: resumedFrom } : {}), ...(urls.length > 1 ? { part: index + 1, parts: urls.length } : {}) });
      if (note) report({ ...event(), note });
      let flushed = { bytes: have, at: performance.now() };
      const flush = async () => {
        const started = performance.now();
        access.flush();
        putMeta({ ...base, complete: false, written: at });
        flushed = { bytes: at, at: performance.now() };
        // Storage this slow looks like a stalled download from outside: say where the time goes.
        const took = flushed.at - started;
        if (took >= SLOW_FLUSH_MS) report({ ...event(), note: `writing to browser storage is slow: making ${bytesText(at)} durable took ${secondsText(took)}` });
      };
      // Stalls in a row with no byte between them; past MAX_STALLS the download fails.
      let stalls = 0;
      for (;;) {
        let chunk;
        try {
          chunk = await orStalled(body.next(), stallMs);
        } catch (e) {
          await flush();
          throw fail("MODEL_DOWNLOAD", `Downloading the model from ${url} stopped after ${at.toLocaleString("en-US")} of ${total == null ? "?" : total.toLocaleString("en-US")} bytes: ${e?.message || e}. Loading it again resumes from there.`);
        }
        if (chunk === STALLED) {
          // Nothing for the stall time, the connection still open: drop it and ask again from
          // the byte reached, as a reload would.
          await flush();
          body.cancel();
          const silent = `received nothing for ${secondsText(stallMs)} after ${at.toLocaleString("en-US")} of ${total == null ? "?" : total.toLocaleString("en-US")} bytes`;
          if (++stalls > MAX_STALLS) throw fail("MODEL_DOWNLOAD", `Downloading the model from ${url} stalled: it ${silent}, ${stalls} times in a row. Loading it again resumes from there.`);
          const again = await openFrom(url, at, base);
          response = again.response;
          const againRange = response.status === 206 ? contentRange(response) : null;
          if (again.have !== at) {
            // Another file, or a server that ignores ranges: the bytes so far are not its own.
            at = 0;
            resumedFrom = 0;
            access.truncate(0);
            total = againRange ? againRange.size : bodyLength(response);
            base = { ...base, size: total, ...validators(response) };
            await flush();
          }
          body = eagerReader(response.body);
          report({ ...event(), note: `the download ${silent}: asked the server again from byte ${at.toLocaleString("en-US")}${again.note ? ` (${again.note})` : ""}` });
          continue;
        }
        if (chunk === null) break;
        stalls = 0;
        // A write the quota stops returns a count other than the chunk's length (Chrome 156
        // returns 2^32 - 8) where the spec says it throws QuotaExceededError: both mean full.
        const written = access.write(chunk, { at });
        if (written !== chunk.length) throw Object.assign(new Error("the storage quota is full"), { name: "QuotaExceededError" });
        at += written;
        if (at - flushed.bytes >= FLUSH_BYTES || performance.now() - flushed.at >= FLUSH_MS) await flush();
        progress(event());
      }
      if (total != null && at !== total) {
        await flush();
        throw fail("MODEL_DOWNLOAD", `The model download from ${url} ended after ${at.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} bytes. Loading it again resumes from there.`);
      }
      access.flush();
      putMeta({ ...base, size: at, complete: true, written: at });
      progress(event(), true);
    } catch (e) {
      if (!isQuotaError(e)) throw e;
      throw fail("QUOTA_EXCEEDED", `Storing the model ${url} needs ${bytesText(total ?? at)}, but the browser's storage for this site filled up after ${bytesText(at)} of it. Free space (deleteCachedModel, or the browser's site settings) or load it with cache: false.`);
    } finally {
      body.cancel();
      access.close();
      record.close();
    }
    report({ phase: "stored", loaded: at, total: at, storage: "opfs", ...(urls.length > 1 ? { part: index + 1, parts: urls.length } : {}) });
    return { blob: await handle.getFile(), source: "network" };
  });
}

/**
 * `response`'s body passed through, counted into progress events, as {stream, failure()}: the
 * stream errors with MODEL_DOWNLOAD when it ends short of `total` or receives nothing for
 * `stallMs` (nothing to resume into here), and `failure()` is that error (Cache.put() reports any
 * error of its body as its own generic one).
 */
function counted(response, url, total, report, stallMs) {
  const reader = response.body.getReader();
  let loaded = 0;
  let failure = null;
  const failed = (e) => {
    failure = e;
    return e;
  };
  const progress = throttled(report);
  const stream = new ReadableStream({
    async pull(controller) {
      const got = await orStalled(reader.read(), stallMs);
      if (got === STALLED) {
        reader.cancel().catch(() => {});
        throw failed(fail("MODEL_DOWNLOAD", `Downloading the model from ${url} stalled: it received nothing for ${secondsText(stallMs)} after ${loaded.toLocaleString("en-US")} of ${total == null ? "?" : total.toLocaleString("en-US")} bytes. Try again.`));
      }
      if (got.done) {
        if (total != null && loaded !== total) {
          throw failed(fail("MODEL_DOWNLOAD", `The model download from ${url} ended after ${loaded.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} bytes. Try again.`));
        }
        progress({ phase: "download", loaded, total: total ?? loaded }, true);
        controller.close();
        return;
      }
      loaded += got.value.length;
      progress({ phase: "download", loaded, total: total ?? 0 });
      controller.enqueue(got.value);
    },
    cancel: (reason) => reader.cancel(reason),
  });
  return { stream, failure: () => failure };
}

/** `e` as the package's error: its own when it has a code, else MODEL_DOWNLOAD for `url`. */
function downloadError(e, url) {
  return typeof e?.code === "string" ? e : fail("MODEL_DOWNLOAD", `Downloading the model from ${url} failed: ${e?.message || e}.`);
}

/** Part `url` from the Cache API when there whole, else downloaded into it (no resume). */
async function cachePart(cache, url, stallMs, report) {
  const hit = await cache.match(url).catch(() => undefined);
  if (hit) {
    const blob = await hit.blob();
    const expected = bodyLength(hit);
    if (expected == null || blob.size === expected) return { blob, source: "cache" };
    await cache.delete(url).catch(() => {});
  }
  const response = await request(url);
  const total = bodyLength(response);
  if (total != null) {
    try {
      await checkQuota(url, total);
    } catch (e) {
      await response.body?.cancel().catch(() => {});
      throw e;
    }
  }
  const headers = { "content-type": "application/octet-stream", ...(total != null ? { "content-length": String(total) } : {}) };
  const body = counted(response, url, total, report, stallMs);
  try {
    await cache.put(url, new Response(body.stream, { headers }));
  } catch (e) {
    await cache.delete(url).catch(() => {});
    if (isQuotaError(e)) throw quotaError(url, total ?? 0, await navigator.storage?.estimate?.().then((s) => s.quota - s.usage, () => 0) ?? 0);
    throw downloadError(body.failure() ?? e, url);
  }
  const stored = await cache.match(url);
  report({ phase: "stored", loaded: total ?? 0, total: total ?? 0, storage: "cache" });
  return { blob: await stored.blob(), source: "network" };
}

/** Part `url` downloaded into a Blob (no storage). */
async function blobPart(url, stallMs, report) {
  const response = await request(url);
  const total = bodyLength(response);
  const body = counted(response, url, total, report, stallMs);
  try {
    return { blob: await new Response(body.stream).blob(), source: "network" };
  } catch (e) {
    throw downloadError(body.failure() ?? e, url);
  }
}

/**
 * The model at `url` as one Blob per file (every part of a split GGUF), from storage when it is
 * there whole, else downloaded (into storage unless `store.enabled` is false). Worker only (OPFS
 * writes need a sync access handle). Resolves to {blobs, source: "network"|"cache", storage:
 * "opfs"|"cache"|null, url} (source "cache" only when every part came from storage).
 */
export async function modelFiles(url, store, report) {
  const urls = modelParts(url);
  const stallMs = store.stallMs ?? DEFAULT_STALL_MS;
  const folder = store.enabled && opfsWritable() ? await opfsFolder(store.name, true) : null;
  const cache = store.enabled && !folder ? await openCache(store.name, true) : null;
  const storage = folder ? "opfs" : cache ? "cache" : null;
  const blobs = [];
  let fromStorage = 0;
  try {
    for (let i = 0; i < urls.length; i++) {
      const partReport = urls.length > 1 ? (e) => report({ ...e, part: i + 1, parts: urls.length }) : report;
      const got = folder ? await opfsPart(folder, urls, i, stallMs, partReport) : cache ? await cachePart(cache, urls[i], stallMs, partReport) : await blobPart(urls[i], stallMs, partReport);
      blobs.push(got.blob);
      if (got.source === "cache") fromStorage += 1;
    }
  } catch (e) {
    // A model that cannot be stored leaves nothing behind: no part of it is listed.
    if (e?.code === "QUOTA_EXCEEDED" && storage) await deleteCachedModel(url, store.name).catch(() => {});
    throw e;
  }
  return { blobs, source: fromStorage === urls.length ? "cache" : "network", storage, url: urls[0] };
}

/**
 * The stored files of the model at `url` when every part is there whole (for reading its header
 * without the network), else null.
 */
export async function storedFiles(url, name = DEFAULT_STORE) {
  const urls = modelParts(url);
  const folder = await opfsFolder(name, false);
  if (folder) {
    const blobs = [];
    for (const part of urls) {
      const key = fileKey(part);
      const meta = await readMeta(folder, key);
      if (meta?.url !== part || !meta.complete) break;
      const file = await (await folder.getFileHandle(`${key}.gguf`)).getFile().catch(() => null);
      if (!file || file.size !== meta.size) break;
      blobs.push(file);
    }
    if (blobs.length === urls.length) return blobs;
  }
  const cache = await openCache(name, false);
  if (cache) {
    const blobs = [];
    for (const part of urls) {
      const hit = await cache.match(part).catch(() => undefined);
      if (!hit) break;
      blobs.push(await hit.blob());
    }
    if (blobs.length === urls.length) return blobs;
  }
  return null;
}

/**
 * The models in browser storage: [{url, bytes, complete, storage: "opfs"|"cache", parts}], a split
 * model once (its first part's URL, the bytes of all its parts, complete when every part is).
 * Partial downloads are listed with complete: false (loading the URL again resumes them).
 */
export async function listCachedModels(name = DEFAULT_STORE) {
  const models = new Map();
  const add = (url, bytes, complete, storage) => {
    const urls = modelParts(url);
    const id = `${storage} ${urls[0]}`;
    const entry = models.get(id) ?? { url: urls[0], bytes: 0, complete: true, storage, parts: urls.length, found: 0 };
    entry.bytes += bytes;
    entry.complete &&= complete;
    entry.found += 1;
    models.set(id, entry);
  };
  const folder = await opfsFolder(name, false);
  if (folder) {
    for await (const [file, handle] of folder.entries()) {
      if (handle.kind !== "file" || !file.endsWith(".json")) continue;
      const key = file.slice(0, -".json".length);
      const meta = await readMeta(folder, key);
      if (typeof meta?.url !== "string") continue;
      const size = await fileSize(folder, `${key}.gguf`);
      add(meta.url, Math.max(0, size), meta.complete === true && size === meta.size, "opfs");
    }
  }
  const cache = await openCache(name, false);
  if (cache) {
    for (const req of await cache.keys()) {
      const hit = await cache.match(req);
      add(req.url, bodyLength(hit) ?? 0, true, "cache");
    }
  }
  return [...models.values()].map(({ found, ...entry }) => ({ ...entry, complete: entry.complete && found === entry.parts }));
}

/**
 * Deletes the model at `url` (every part of a split one) from browser storage, partial downloads
 * too. Resolves to whether anything was there. Rejects with BUSY while a worker downloads it.
 */
export async function deleteCachedModel(url, name = DEFAULT_STORE) {
  const urls = modelParts(new URL(url, globalThis.location?.href).href);
  let deleted = false;
  const folder = await opfsFolder(name, false);
  if (folder) {
    for (const part of urls) {
      const key = fileKey(part);
      await withFileLock(part, async (lock) => {
        if (!lock) throw fail("BUSY", `the model ${part} is being downloaded; delete it once that has ended`);
        for (const file of [`${key}.json`, `${key}.gguf`]) {
          try {
            await folder.removeEntry(file);
            deleted = true;
          } catch (e) {
            if (e?.name !== "NotFoundError") throw e;
          }
        }
      }, { ifAvailable: true });
    }
  }
  const cache = await openCache(name, false);
  if (cache) {
    for (const part of urls) deleted = (await cache.delete(part)) || deleted;
  }
  return deleted;
}

/**
 * The first `length` bytes of `url` and the file's size: one `Range: bytes=0-(length-1)`
 * request (a server that ignores Range sends the whole file: only `length` bytes of it are read).
 */
async function fetchPrefix(url, length) {
  const response = await request(url, { range: `bytes=0-${length - 1}` });
  const range = response.status === 206 ? contentRange(response) : null;
  const size = range ? range.size : bodyLength(response);
  const reader = response.body.getReader();
  const bytes = new Uint8Array(length);
  let at = 0;
  while (at < length) {
    const { done, value } = await reader.read();
    if (done) break;
    const take = Math.min(value.length, length - at);
    bytes.set(value.subarray(0, take), at);
    at += take;
  }
  reader.cancel().catch(() => {});
  return { size: size ?? at, bytes: bytes.subarray(0, at) };
}

/**
 * The model at `url`'s files for reading headers only: {sizes, prefix(file, length) ->
 * Promise<Uint8Array>}, from storage when the model is there whole, else by range requests (the
 * first `first` bytes of each part fetched up front, for the sizes).
 */
export async function headerFiles(url, name, first) {
  const stored = await storedFiles(url, name);
  if (stored) {
    return { sizes: stored.map((b) => b.size), prefix: async (file, length) => new Uint8Array(await stored[file].slice(0, length).arrayBuffer()) };
  }
  const urls = modelParts(url);
  const got = await Promise.all(urls.map((part) => fetchPrefix(part, first)));
  return {
    sizes: got.map((g) => g.size),
    prefix: async (file, length) => {
      if (got[file].bytes.length < length) got[file] = await fetchPrefix(urls[file], length);
      return got[file].bytes.subarray(0, length);
    },
  };
}
