// Saved conversations in IndexedDB: per conversation its messages and the KV snapshot of its
// history (engine.exportConversation), so a reload continues where it stopped without
// recomputing the history. A browser without IndexedDB (or refusing it) just keeps nothing.

const DB_NAME = "pagedlm-chat";
const STORE = "conversations";

let opening = null;

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function open() {
  if (!opening) {
    opening = (async () => {
      if (typeof indexedDB === "undefined") return null;
      const req = indexedDB.open(DB_NAME, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(STORE, { keyPath: "id" });
      return request(req);
    })().catch((e) => {
      console.warn("pagedlm: conversations are not saved:", e);
      return null;
    });
  }
  return opening;
}

async function withStore(mode, work) {
  const db = await open();
  if (!db) return undefined;
  const tx = db.transaction(STORE, mode);
  const result = await request(work(tx.objectStore(STORE)));
  await new Promise((resolve, reject) => {
    tx.oncomplete = resolve;
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
  return result;
}

const ROLES = new Set(["system", "user", "assistant", "tool"]);
/** Longest text a saved record may hold (a reply of 8k tokens is well under it). */
const MAX_TEXT = 1 << 20;

const isText = (v) => typeof v === "string" && v.length <= MAX_TEXT;

function validCall(c) {
  return c && typeof c === "object" && isText(c.id) && c.type === "function" && c.function && typeof c.function === "object"
    && isText(c.function.name) && isText(c.function.arguments);
}

function validMessage(m) {
  if (!m || typeof m !== "object" || !ROLES.has(m.role)) return false;
  if (m.role === "assistant" && m.tool_calls != null) {
    return Array.isArray(m.tool_calls) && m.tool_calls.length > 0 && m.tool_calls.every(validCall) && (m.content === null || isText(m.content));
  }
  if (m.role === "tool" && !isText(m.tool_call_id)) return false;
  return isText(m.content);
}

/**
 * Whether `r` is a conversation record as `saveConversation` writes it: stored data comes from
 * anywhere (an older page, another tab's bug, a user's edit), and a record that is not exactly
 * this shape must not reach the page or the engine.
 */
export function validRecord(r) {
  return !!r && typeof r === "object" && Number.isSafeInteger(r.id) && r.id > 0 && isText(r.title)
    && (r.system == null || isText(r.system)) && Array.isArray(r.history) && r.history.length > 0 && r.history.every(validMessage)
    && Number.isSafeInteger(r.turns ?? 0) && (r.turns ?? 0) >= 0
    && (r.snapshot == null || r.snapshot instanceof Uint8Array);
}

/**
 * Every saved conversation that is whole, oldest first: {records: [{id, title, system, history,
 * turns, snapshot: Uint8Array | null}], dropped}. A damaged record is deleted and counted in
 * `dropped` (the page says so); the others load.
 */
export async function loadConversations() {
  let all;
  try {
    all = (await withStore("readonly", (s) => s.getAll())) ?? [];
  } catch (e) {
    console.warn("pagedlm: saved conversations could not be read:", e);
    return { records: [], dropped: 0 };
  }
  const records = all.filter(validRecord).sort((a, b) => a.id - b.id);
  const bad = all.filter((r) => !validRecord(r));
  for (const r of bad) {
    // The store's key path is `id`: every stored value has one, whatever else is wrong with it.
    try {
      await withStore("readwrite", (s) => s.delete(r.id));
    } catch (e) {
      console.warn("pagedlm: a damaged saved conversation could not be removed:", e);
    }
  }
  return { records, dropped: bad.length };
}

/** Saves (replaces) one conversation's record. A full quota only costs the next reload a recompute. */
export async function saveConversation(record) {
  try {
    await withStore("readwrite", (s) => s.put(record));
  } catch (e) {
    console.warn("pagedlm: the conversation could not be saved:", e);
  }
}
