// The package's TypeScript types: a consumer file (tests/types/consumer.ts) must compile under
// `tsc --strict` against js/index.d.ts, and its @ts-expect-error lines prove misuse is refused.
import { it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { root } from "./helpers.mjs";

it("js/index.d.ts type-checks a consumer under tsc --strict", { timeout: 120_000 }, () => {
  const tsc = join(root, "node_modules/typescript/bin/tsc");
  const run = spawnSync(process.execPath, [tsc, "-p", join(root, "tests/types/tsconfig.json")], { encoding: "utf8" });
  assert.equal(run.status, 0, `tsc failed:\n${run.stdout}${run.stderr}`);
});
