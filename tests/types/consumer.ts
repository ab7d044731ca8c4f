// Compiled by tests/e2e/types.test.mjs with `tsc --noEmit --strict`: what a TypeScript user of
// the package writes must type-check against js/index.d.ts, and misuse must not.
import { createEngine, deleteCachedModel, estimateMemory, listCachedModels, PagedlmError, type CachedModel, type MemoryEstimate, type ChatCompletionChunk, type CompletionChunk, type EngineStats, type Profile } from "pagedlm";

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
    text += c.choices[0]?.delta?.reasoning_content ?? "";
  }
  const completion = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
  const thought: string | undefined = completion.choices[0]?.message.reasoning_content;
  await engine.chat.completions.create({
    messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello", reasoning_content: thought ?? null }, { role: "user", content: "Bye" }],
    chat_template_kwargs: { enable_thinking: false },
  });
  const hit: number = completion.usage.prefix_hit_tokens;
  if (engine.info.model.chat_template === null) text += engine.info.model.architecture;
  const window: number | null = engine.info.model.sliding_window;
  const perToken: number = engine.info.kv.bytes_per_token;
  for await (const chunk of await engine.completions.create({ prompt: "Once upon a time", stream: true, max_tokens: 4 })) {
    const c: CompletionChunk = chunk;
    text += c.choices[0]?.text ?? "";
  }
  const structured = await engine.chat.completions.create({
    messages: [{ role: "user", content: "A person as JSON" }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: { type: "object" }, strict: true } },
  });
  text += structured.choices[0].message.content + (structured.pagedlm.warning ?? "");
  await engine.chat.completions.create({
    messages: [{ role: "developer", content: "Answer in JSON." }, { role: "user", content: [{ type: "text", text: "A " }, { type: "text", text: "cat" }] }],
    response_format: { type: "json_object" },
  });
  const refusal: null = structured.choices[0].message.refusal;
  await engine.completions.create({ prompt: "Answer: ", grammar: 'start: "yes" | "no"', max_tokens: 2 });
  const plain = await engine.completions.create({ prompt: "Once", max_tokens: 2, seed: 1 });
  text += plain.choices[0].text + plain.usage.completion_tokens + (window ?? perToken);
  const stats: EngineStats = await engine.stats();
  const cells: number[] = stats.block_states;
  await engine.resetCache();
  const profile: Profile = await engine.profile(64, { timestamps: false });
  const slowest: string = profile.decode.kernels[0]?.name ?? profile.method;
  text += slowest + profile.blocking_readbacks_per_token;
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
// @ts-expect-error: completion mode takes a prompt, not messages
createEngine("/m.gguf").then((e) => e.completions.create({ messages: [{ role: "user", content: "Hi" }] }));
// @ts-expect-error: a completion has text, not a message
createEngine("/m.gguf").then(async (e) => (await e.completions.create({ prompt: "x" })).choices[0].message);
// @ts-expect-error: response_format's type is "text", "json_object" or "json_schema"
createEngine("/m.gguf").then((e) => e.chat.completions.create({ messages: [], response_format: { type: "yaml" } }));
// @ts-expect-error: profile takes a token count
createEngine("/m.gguf").then((e) => e.profile("512"));
// @ts-expect-error: deleteCachedModel takes the model's URL
deleteCachedModel(42);

/** Big models: estimate first, load from an OPFS handle, list and delete what is stored. */
async function bigModels(handle: FileSystemFileHandle): Promise<number> {
  const estimate: MemoryEstimate = await estimateMemory("/models/big-00001-of-00003.gguf", { kvDtype: "int8", maxMemoryBytes: 4e9 });
  if (!estimate.fits) return estimate.reasons.length;
  const engine = await createEngine(handle, {
    onProgress: (p) => {
      if (p.phase === "download" && p.resumed_from !== undefined) console.log(p.resumed_from, p.loaded, p.total);
      if (p.phase === "upload") console.log(p.fraction);
    },
  });
  const stored: CachedModel[] = await listCachedModels();
  for (const m of stored) if (!m.complete && m.storage === "opfs") await deleteCachedModel(m.url);
  return estimate.weights_bytes.webgpu + engine.load.files;
}

export { main, bigModels };
