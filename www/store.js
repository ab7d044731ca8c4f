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

/** Every saved conversation: [{id, title, system, history, turns, snapshot: Uint8Array | null}], oldest first. */
export async function loadConversations() {
  try {
    const all = (await withStore("readonly", (s) => s.getAll())) ?? [];
    return all.sort((a, b) => a.id - b.id);
  } catch (e) {
    console.warn("pagedlm: saved conversations could not be read:", e);
    return [];
  }
}

/** Saves (replaces) one conversation's record. A full quota only costs the next reload a recompute. */
export async function saveConversation(record) {
  try {
    await withStore("readwrite", (s) => s.put(record));
  } catch (e) {
    console.warn("pagedlm: the conversation could not be saved:", e);
  }
}
