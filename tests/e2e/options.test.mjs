// The option names agree on every side: what `createEngine`, `chat.completions.create` and
// `completions.create` accept
// in js/index.js (through js/protocol.js), what js/index.d.ts declares, and what the wasm engine
// reads (`optionNames()` from src/web.rs, the fields serde deserializes). A name one side gains
// and another lacks fails here with the difference. Runs in node: no browser, no model.
import { before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { root } from "./helpers.mjs";
import { CHAT_OPTIONS, COMPLETION_PARAMS, ENGINE_OPTIONS, ESTIMATE_OPTIONS, PACKAGE_OPTIONS, REQUEST_OPTIONS, REQUEST_PARAMS, requestOptions } from "../../js/protocol.js";
import { createEngine } from "../../js/index.js";

/** The top-level member names of `interface name` in TypeScript declarations. */
export function interfaceFields(source, name) {
  // Comments go, and arrows, whose ">" is no closing bracket.
  const text = source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "").replace(/=>/g, " returns ");
  const head = new RegExp(`interface\\s+${name}\\b[^{]*\\{`).exec(text);
  assert.ok(head, `js/index.d.ts declares interface ${name}`);
  const fields = [];
  let depth = 1;
  let member = "";
  for (const ch of text.slice(head.index + head[0].length)) {
    if (ch === "{" || ch === "(" || ch === "[" || ch === "<") depth += 1;
    else if (ch === "}" || ch === ")" || ch === "]" || ch === ">") depth -= 1;
    if (depth === 0) break;
    if (depth === 1 && (ch === ";" || ch === "\n")) {
      const m = /^\s*(?:readonly\s+)?([A-Za-z_$][\w$]*)\??\s*:/.exec(member);
      if (m) fields.push(m[1]);
      member = "";
    } else {
      member += ch;
    }
  }
  return fields;
}

/** Lists `a` and `b` ({side: names}) hold the same names; the message says which side lacks which. */
function sameNames(a, b, what) {
  const [[nameA, listA]] = Object.entries(a);
  const [[nameB, listB]] = Object.entries(b);
  const onlyA = listA.filter((n) => !listB.includes(n));
  const onlyB = listB.filter((n) => !listA.includes(n));
  assert.ok(onlyA.length === 0 && onlyB.length === 0,
    `${what}: only in ${nameA}: [${onlyA.join(", ")}]; only in ${nameB}: [${onlyB.join(", ")}]`);
  assert.equal(new Set(listA).size, listA.length, `${what}: ${nameA} names one twice: [${listA.join(", ")}]`);
}

describe("option names", () => {
  let wasm;
  let dts;

  before(async () => {
    const glue = await import("../../pkg/pagedlm.js");
    glue.initSync({ module: readFileSync(join(root, "pkg/pagedlm_bg.wasm")) });
    wasm = glue.optionNames();
    dts = readFileSync(join(root, "js/index.d.ts"), "utf8");
  });

  it("createEngine: js/protocol.js, the wasm engine and index.d.ts EngineOptions agree", () => {
    sameNames({ "js ENGINE_OPTIONS + ESTIMATE_OPTIONS": [...ENGINE_OPTIONS, ...ESTIMATE_OPTIONS] }, { "wasm LoadOptions": wasm.load }, "engine options");
    const clash = PACKAGE_OPTIONS.filter((n) => ENGINE_OPTIONS.includes(n));
    assert.deepEqual(clash, [], "a package option is not also an engine option");
    sameNames({ "js ENGINE_OPTIONS + PACKAGE_OPTIONS": [...ENGINE_OPTIONS, ...PACKAGE_OPTIONS] },
      { "index.d.ts EngineOptions": interfaceFields(dts, "EngineOptions") }, "createEngine options");
  });

  it("chat.completions.create: js/protocol.js, the wasm engine and index.d.ts ChatCompletionCreateParams agree", () => {
    const chatOptions = [...REQUEST_OPTIONS, ...CHAT_OPTIONS];
    sameNames({ "js REQUEST_OPTIONS + CHAT_OPTIONS": chatOptions }, { "wasm ChatOptions": wasm.chat }, "request options");
    const clash = REQUEST_PARAMS.filter((n) => chatOptions.includes(n));
    assert.deepEqual(clash, [], "a package parameter is not also an engine option");
    sameNames({ "js REQUEST_OPTIONS + CHAT_OPTIONS + REQUEST_PARAMS": [...chatOptions, ...REQUEST_PARAMS] },
      { "index.d.ts ChatCompletionCreateParams": interfaceFields(dts, "ChatCompletionCreateParams") }, "create params");
  });

  it("completions.create: js/protocol.js, the wasm engine and index.d.ts CompletionCreateParams agree", () => {
    sameNames({ "js REQUEST_OPTIONS": [...REQUEST_OPTIONS] }, { "wasm completion options": wasm.completion }, "completion options");
    const clash = COMPLETION_PARAMS.filter((n) => REQUEST_OPTIONS.includes(n));
    assert.deepEqual(clash, [], "a package parameter is not also an engine option");
    sameNames({ "js REQUEST_OPTIONS + COMPLETION_PARAMS": [...REQUEST_OPTIONS, ...COMPLETION_PARAMS] },
      { "index.d.ts CompletionCreateParams": interfaceFields(dts, "CompletionCreateParams") }, "completion params");
    const params = Object.fromEntries(interfaceFields(dts, "CompletionCreateParams").map((n) => [n, 1]));
    sameNames({ "what completions.create sends": Object.keys(requestOptions(params)) }, { "wasm completion options": wasm.completion }, "sent completion options");
  });

  it("createEngine accepts every declared option and refuses another", async () => {
    // Node has no Worker: an options object that passes the checks ends in UNSUPPORTED.
    const codeOf = (options) => createEngine(new ArrayBuffer(8), options).then(() => "resolved", (e) => e.code);
    for (const name of interfaceFields(dts, "EngineOptions")) {
      assert.equal(await codeOf({ [name]: undefined }), "UNSUPPORTED", `createEngine accepts ${name}`);
    }
    assert.equal(await codeOf({ kvDtyp: "int8" }), "INVALID_ARGUMENT", "createEngine refuses an unknown option");
  });

  it("estimateMemory: index.d.ts EstimateOptions adds ESTIMATE_OPTIONS to createEngine's", () => {
    const declared = interfaceFields(dts, "EstimateOptions");
    for (const name of ESTIMATE_OPTIONS) assert.ok(declared.includes(name), `EstimateOptions declares ${name}`);
  });

  it("create passes every declared engine option on to the engine", () => {
    const params = Object.fromEntries(interfaceFields(dts, "ChatCompletionCreateParams").map((n) => [n, 1]));
    sameNames({ "what create sends": Object.keys(requestOptions(params, true)) }, { "wasm ChatOptions": wasm.chat }, "sent options");
  });
});
