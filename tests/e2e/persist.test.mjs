// End-to-end: the chat page keeps conversations and their KV snapshots in IndexedDB. After a
// reload, the next turn of a restored conversation reuses its history's K/V (the prefix hit
// covers it) instead of recomputing it; a snapshot of another KV format is dropped silently.
// Needs pkg/ (bash scripts/build-web.sh) and models/ (npm run fetch-model).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { byId, launch, MODEL, openPage, root, startServer } from "./helpers.mjs";

const MAX_TOKENS = 6;
const LOAD_TIMEOUT = 240_000;
const REPLY_TIMEOUT = 180_000;

async function waitForModel(page, problems) {
  const ready = page.waitForSelector(`${byId("model-progress")}[data-done="true"]`, { timeout: LOAD_TIMEOUT });
  const failed = page.waitForSelector(`${byId("error-panel")}:not([hidden])`, { timeout: LOAD_TIMEOUT })
    .then(async (el) => { throw new Error(`the page failed to load the model: ${await el.innerText()}\n${problems.join("\n")}`); });
  await Promise.race([ready, failed]);
  failed.catch(() => {});
}

async function ask(page, text) {
  await page.fill(byId("chat-input"), text);
  await page.click(byId("send-button"));
}

/** The n-th reply of the shown conversation once done: its text and figures. */
async function waitDone(page, n) {
  // Restored replies are done from the start: wait for the n-th one, not for any n + 1 done ones.
  await page.waitForFunction((i) => document.querySelectorAll('[data-testid="message-assistant"]')[i]?.dataset.done === "true", n,
    { timeout: REPLY_TIMEOUT });
  const msg = page.locator(byId("message-assistant")).nth(n);
  const num = async (name) => Number(await msg.getAttribute(name));
  return {
    text: (await msg.locator(".body").textContent()) ?? "",
    promptTokens: await num("data-prompt-tokens"),
    tokens: await num("data-tokens"),
    prefixHit: await num("data-prefix-hit"),
    error: await msg.locator(".message-error").count() ? await msg.locator(".message-error").textContent() : null,
  };
}

/** The conversations saved in IndexedDB: id, history, turns and a fingerprint of the snapshot bytes. */
function savedRecords(page) {
  return page.evaluate(() => new Promise((resolve, reject) => {
    const open = indexedDB.open("pagedlm-chat", 1);
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const all = open.result.transaction("conversations", "readonly").objectStore("conversations").getAll();
      all.onerror = () => reject(all.error);
      all.onsuccess = () => resolve(all.result.map((r) => {
        let sum = 0;
        for (const b of r.snapshot ?? []) sum = (sum * 31 + b) >>> 0;
        return { id: r.id, history: r.history, turns: r.turns, snapshot: r.snapshot ? `${r.snapshot.length} bytes, ${sum}` : null };
      }));
    };
  }));
}

describe("chat page persistence", () => {
  let server;
  let browser;
  let page;
  let problems;

  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    assert.ok(existsSync(MODEL), "the model is missing: run `npm run fetch-model`");
    server = await startServer();
    browser = await launch();
    ({ page, problems } = await openPage(browser, `${server.url}/?max_tokens=${MAX_TOKENS}&temperature=0&backend=webgpu`));
  });

  after(async () => {
    await browser?.close();
    server?.close();
  });

  it("restores a conversation after a reload, and its next turn reuses the saved K/V", { timeout: 2 * LOAD_TIMEOUT + 2 * REPLY_TIMEOUT }, async () => {
    await waitForModel(page, problems);
    await ask(page, "Name a color.");
    const first = await waitDone(page, 0);
    assert.equal(first.error, null, `the reply failed: ${first.error}`);

    await page.reload();
    await waitForModel(page, problems);
    const restored = page.locator(`${byId("conversation")}[data-restored="true"]`);
    assert.equal(await restored.count(), 1, "the conversation is back in the list");
    await restored.click();
    assert.equal(await page.locator(byId("message-user")).first().textContent(), "Name a color.");
    assert.equal(await page.locator(`${byId("message-assistant")} .body`).first().textContent(), first.text, "the reply is back");

    await ask(page, "And another one?");
    const second = await waitDone(page, 1);
    assert.equal(second.error, null, `the follow-up failed: ${second.error}`);
    const history = first.promptTokens + first.tokens;
    console.log(`after the reload: prefix hit ${second.prefixHit} of ${second.promptTokens} (history ${history} tokens)`);
    // A fresh engine has nothing cached: only the imported snapshot can make this hit.
    assert.ok(second.prefixHit >= history - 3, `the prefix hit (${second.prefixHit}) covers the history (${history} tokens)`);
    assert.equal(Number(await page.getAttribute(byId("kv-stats"), "data-last-prefix-hit")), second.prefixHit, "the KV panel shows the hit");
  });

  it("drops a snapshot of another KV format and recomputes, keeping the history", { timeout: LOAD_TIMEOUT + REPLY_TIMEOUT }, async () => {
    await page.selectOption("#kv-dtype", "int8");
    await page.waitForURL(/kv_dtype=int8/);
    await waitForModel(page, problems);
    await page.locator(`${byId("conversation")}[data-restored="true"]`).first().click();
    assert.equal(await page.locator(byId("message-user")).count(), 2, "both turns are back");
    await ask(page, "One more?");
    const third = await waitDone(page, 2);
    assert.equal(third.error, null, `the turn after the refused snapshot failed: ${third.error}`);
    assert.equal(third.prefixHit, 0, "an f32 snapshot is not used by an int8 pool");
    assert.deepEqual(problems.filter((p) => !/favicon|Failed to load resource/.test(p)), [], "no page errors");
  });

  it("recovers by itself from a lost GPU device: the turn fails, the saved conversation is untouched, the next turn continues from its snapshot", { timeout: LOAD_TIMEOUT + 3 * REPLY_TIMEOUT }, async () => {
    // The restored conversation of the test before is shown, 3 turns, its snapshot saved (int8).
    const saved = await savedRecords(page);
    assert.ok(saved.length > 0 && saved.every((r) => r.snapshot), `conversations with snapshots are saved: ${JSON.stringify(saved)}`);
    const users = await page.locator(byId("message-user")).count();
    await ask(page, "Tell me about the sea.");
    // Lost during the turn's prefill or decode: the reply ends with DEVICE_LOST either way.
    await page.evaluate(() => window.chatPage.engine.simulateDeviceLoss());
    const lost = await waitDone(page, users);
    assert.match(lost.error ?? "", /DEVICE_LOST/, `the turn on the lost device failed with DEVICE_LOST: ${JSON.stringify(lost)}`);
    await page.waitForSelector(`${byId("model-progress")}[data-done="true"][data-device-losses="1"]`, { timeout: LOAD_TIMEOUT });
    assert.equal(await page.getAttribute(byId("model-progress"), "data-source"), "cache", "the model came back from the browser cache");
    assert.deepEqual(await savedRecords(page), saved, "the saved conversations and their snapshots are untouched");

    await ask(page, "One more?");
    const next = await waitDone(page, users + 1);
    assert.equal(next.error, null, `the turn after the recovery failed: ${next.error}`);
    const history = saved.find((r) => r.history.length === 2 * users)?.history;
    assert.ok(history, "the shown conversation is saved");
    console.log(`after the device loss: prefix hit ${next.prefixHit} of ${next.promptTokens}`);
    // The new engine's cache is empty: the hit can only come from the imported snapshot.
    assert.ok(next.prefixHit > next.promptTokens / 2, `the turn after the recovery reuses the saved K/V (hit ${next.prefixHit} of ${next.promptTokens})`);
    const after = (await savedRecords(page)).find((r) => r.history.length === 2 * users + 2);
    assert.ok(after, "the conversation saved its new turn");
    assert.deepEqual(after.history.slice(0, 2 * users), history, "after its history as it was, without the failed turn");
    assert.equal(after.history[2 * users].content, "One more?");
    assert.deepEqual(problems.filter((p) => !/favicon|Failed to load resource/.test(p)), [], "no page errors");
  });
});
