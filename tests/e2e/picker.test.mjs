// The page's model picker, cheaply: served with an empty models folder, the page lists both
// models, says the default one is missing with the command that fetches it, and says the same
// for Gemma when it is picked. No model is loaded (the picker's loading path is the one
// chat.test.mjs drives with SmolLM2).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { byId, launch, openPage, startServer } from "./helpers.mjs";

describe("model picker", () => {
  let empty;
  let server;
  let browser;
  let page;

  before(async () => {
    empty = mkdtempSync(join(tmpdir(), "pagedlm-no-models-"));
    server = await startServer({ PAGEDLM_MODELS_DIR: empty });
    browser = await launch();
    ({ page } = await openPage(browser, `${server.url}/`));
  });

  after(async () => {
    await browser?.close();
    server?.close();
    rmSync(empty, { recursive: true, force: true });
  });

  const missingHint = async () => {
    await page.waitForSelector(`${byId("error-panel")}[data-code="MODEL_MISSING"]:not([hidden])`, { timeout: 30_000 });
    return page.locator(byId("error-panel")).innerText();
  };

  it("lists SmolLM2 (selected) and Gemma 3 270M, and says how to fetch a missing file", { timeout: 60_000 }, async () => {
    const options = await page.locator(`${byId("model-picker")} option`).evaluateAll((os) => os.map((o) => [o.value, o.textContent]));
    assert.deepEqual(options.map(([v]) => v), ["smollm2-135m", "gemma3-270m"], `picker options: ${JSON.stringify(options)}`);
    assert.match(options[1][1], /Gemma 3 270M/);
    assert.equal(await page.locator(byId("model-picker")).inputValue(), "smollm2-135m", "SmolLM2 is the default");
    const smol = await missingHint();
    assert.match(smol, /SmolLM2-135M-Instruct\.Q4_1\.gguf/);
    assert.match(smol, /npm run fetch-model(?! --)/, smol);
    assert.equal(await page.isDisabled(byId("send-button")), true);

    await page.selectOption(byId("model-picker"), "gemma3-270m");
    await page.waitForFunction(() => /gemma-3-270m/.test(document.querySelector('[data-testid="error-panel"]').innerText), null, { timeout: 30_000 });
    const gemma = await missingHint();
    assert.match(gemma, /npm run fetch-model -- gemma3-270m/, gemma);
    assert.equal(await page.getAttribute(byId("model-picker"), "data-mode"), "chat", "no model loaded: the mode is unchanged");
    assert.equal(await page.getAttribute(byId("model-progress"), "data-done"), null);
  });
});
