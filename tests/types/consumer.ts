// Compiled by tests/e2e/types.test.mjs with `tsc --noEmit --strict`: what a TypeScript user of
// the package writes must type-check against js/index.d.ts, and misuse must not.
import { createEngine, PagedlmError, type ChatCompletionChunk, type EngineStats } from "pagedlm";

async function main(file: File): Promise<string> {
  const engine = await createEngine("/models/model.gguf", {
    kvDtype: "int8",
    blockSize: 16,
    poolTokens: 4096,
    maxBatch: 4,
    onProgress: (p) => console.log(p.phase, p.fraction ?? "?"),
  });
  const controller = new AbortController();
  const stream = await engine.chat.completions.create({
    messages: [{ role: "user", content: "Hi" }],
    stream: true,
    max_tokens: 8,
    temperature: 0,
    stop: ["\n"],
    signal: controller.signal,
  });
  let text = "";
  for await (const chunk of stream) {
    const c: ChatCompletionChunk = chunk;
    text += c.choices[0]?.delta?.content ?? "";
  }
  const completion = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
  const hit: number = completion.usage.prefix_hit_tokens;
  const stats: EngineStats = await engine.stats();
  const cells: number[] = stats.block_states;
  await engine.resetCache();
  const snapshot: Uint8Array = await engine.exportConversation([{ role: "user", content: "Hi" }, { role: "assistant", content: completion.choices[0].message.content ?? "" }]);
  const restored: number = (await engine.importConversation(snapshot)).tokens;
  text += restored;
  await engine.dispose();
  const fromFile = await createEngine(file);
  await fromFile.dispose();
  try {
    await createEngine(new ArrayBuffer(8));
  } catch (e) {
    if (e instanceof PagedlmError && e.code === "MODEL_FORMAT") text += e.message;
  }
  return `${text} ${hit} ${cells.length}`;
}

// @ts-expect-error: kvDtype is "f32" or "int8"
createEngine("/m.gguf", { kvDtype: "f16" });
// @ts-expect-error: messages are required
createEngine("/m.gguf").then((e) => e.chat.completions.create({ max_tokens: 1 }));

export { main };
