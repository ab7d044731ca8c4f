// Compiled by tests/e2e/types.test.mjs with `tsc --noEmit --strict`: code written against the
// `openai` SDK's own types (parameters, messages, tools, response formats, completions and
// chunks) works with pagedlm unchanged.
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionCreateParamsStreaming,
  ChatCompletionMessageParam,
  ChatCompletionTool,
  ChatCompletionToolChoiceOption,
} from "openai/resources/chat/completions";
import { createEngine } from "pagedlm";

const tools: ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
      strict: true,
    },
  },
];

async function main(): Promise<string> {
  const engine = await createEngine("/models/model.gguf");
  const messages: ChatCompletionMessageParam[] = [
    { role: "developer", content: "You check the weather." },
    { role: "user", content: [{ type: "text", text: "Weather in " }, { type: "text", text: "Oslo?" }] },
  ];
  const choice: ChatCompletionToolChoiceOption = "required";
  const params: ChatCompletionCreateParamsNonStreaming = { model: "smollm2", messages, tools, tool_choice: choice, max_tokens: 64, temperature: null, stop: null };
  const completion: ChatCompletion = await engine.chat.completions.create(params);
  const message = completion.choices[0].message;
  let text = message.content ?? "";
  for (const call of message.tool_calls ?? []) {
    if (call.type === "function") text += call.function.name + call.function.arguments;
  }
  // The reply written back with a tool result continues the conversation.
  messages.push(message, { role: "tool", tool_call_id: message.tool_calls?.[0]?.id ?? "", content: '{"temp": 3}' });
  const streaming: ChatCompletionCreateParamsStreaming = {
    model: "smollm2",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    response_format: { type: "json_schema", json_schema: { name: "answer", schema: { type: "object" }, strict: true } },
  };
  for await (const chunk of await engine.chat.completions.create(streaming)) {
    const c: ChatCompletionChunk = chunk;
    text += c.choices[0]?.delta?.content ?? "";
    for (const call of c.choices[0]?.delta?.tool_calls ?? []) text += call.function?.arguments ?? "";
    if (c.choices[0]?.finish_reason === "tool_calls") text += "!";
  }
  return text;
}

void main;
