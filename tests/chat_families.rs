//! Chat requests through each family's real template (tests/data/templates/) on a tiny synthetic
//! model: tools reach the template as it wants them and the request learns the family's call
//! format, Qwen3's `enable_thinking` goes through `chat_template_kwargs`, a reasoning prompt
//! sets the reply's reasoning, a constraint applies after the think block, and on the CPU
//! backend a Qwen3 reply of tool calls and a DeepSeek-R1 reasoning reply come back as OpenAI
//! shapes (`tool_calls`, `reasoning_content`, streamed reasoning). Native only (it reads the
//! templates from disk); no GPU.
#![cfg(not(target_arch = "wasm32"))]

use serde_json::{json, Value};

use pagedlm::constraint::{Constraint, Grammars, Marker};
use pagedlm::engine::{
    prepare_chat, BackendChoice, Engine, EngineOptions, ErrorKind, FinishReason, GenerateRequest, Message, Reasoning, SamplingParams, ToolFormat, Tools,
};
use pagedlm::gguf::Gguf;
use pagedlm::synth::{tiny_llama_gguf, SynthConfig};
use pagedlm::tokenizer::{token_type, Tokenizer, TokenizerSpec};

mod common;

use common::chat_template as template;

/// The tiny synthetic model (byte-level vocabulary with ChatML's specials) with a context long
/// enough for a prompt of tools spelled in bytes, its chat template replaced by `chat_template`.
fn model_with(chat_template: &str) -> Vec<u8> {
    common::with_chat_template(&tiny_llama_gguf(&SynthConfig { context: 2048, ..SynthConfig::tiny() }), chat_template)
}

fn spec_with(chat_template: &str) -> TokenizerSpec {
    let bytes = model_with(chat_template);
    TokenizerSpec::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap()
}

fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_spec(spec_with(&template(name))).unwrap()
}

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": false}}}])
}

fn user(text: &str) -> Message {
    Message { role: "user".into(), content: Some(text.into()), ..Default::default() }
}

fn with_tools(choice: Value) -> GenerateRequest {
    GenerateRequest { tools: Tools::from_options(Some(&weather()), Some(&choice), None).unwrap(), ..GenerateRequest::default() }
}

#[test]
fn qwen3_gets_its_tools_and_thinks_unless_told_not_to() {
    let tok = tokenizer("Qwen-Qwen3-0.6B.jinja");
    let mut request = with_tools(json!("auto"));
    let prompt = prepare_chat(&tok, &[user("Weather in Oslo?")], &mut request).unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n# Tools\n\n"), "{prompt}");
    assert!(prompt.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\""), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"), "{prompt}");
    assert_eq!(request.tools.as_ref().unwrap().format, ToolFormat::Hermes);
    let reasoning = request.reasoning.clone().expect("Qwen3 thinks by default");
    assert!(!reasoning.starts_inside, "Qwen3 writes <think> itself");
    assert_eq!(reasoning.close.text, "</think>");
    // `enable_thinking: false` through the template kwargs: the prompt closes the block.
    let mut request = GenerateRequest { chat_template_kwargs: json!({"enable_thinking": false}).as_object().unwrap().clone(), ..with_tools(json!("auto")) };
    let prompt = prepare_chat(&tok, &[user("Weather in Oslo?")], &mut request).unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{prompt}");
    assert_eq!(request.reasoning, None);
    // The history's calls and results go to the template as they are.
    let call = json!({"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}});
    let history: Vec<Message> = serde_json::from_value(json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "3 degrees"}
    ]))
    .unwrap();
    let prompt = prepare_chat(&tok, &history, &mut with_tools(json!("auto"))).unwrap();
    assert!(
        prompt.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3 degrees\n</tool_response><|im_end|>\n"),
        "{prompt}"
    );
}

#[test]
fn each_family_gets_its_format() {
    let format = |name: &str, edit: &dyn Fn(&mut TokenizerSpec)| {
        let mut spec = spec_with(&template(name));
        edit(&mut spec);
        let tok = Tokenizer::from_spec(spec).unwrap();
        let mut request = with_tools(json!("required"));
        let prompt = prepare_chat(&tok, &[user("Weather in Oslo?")], &mut request).unwrap();
        (prompt, request)
    };
    let (prompt, request) = format("meta-llama-Llama-3.2-3B-Instruct.jinja", &|_| {});
    assert_eq!(request.tools.unwrap().format, ToolFormat::Llama3);
    assert!(prompt.contains("Environment: ipython\n") && prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    // Phi-4-mini: the tools go into the system message, calls between its special tokens.
    let add_specials = |spec: &mut TokenizerSpec| {
        for marker in ["<|tool_call|>", "<|/tool_call|>"] {
            spec.tokens.push(marker.into());
            spec.token_types.push(token_type::CONTROL);
        }
    };
    let (prompt, request) = format("microsoft-Phi-4-mini-instruct.jinja", &add_specials);
    let open = Marker { text: "<|tool_call|>".into(), special: Some(259) };
    let close = Marker { text: "<|/tool_call|>".into(), special: Some(260) };
    assert_eq!(request.tools.unwrap().format, ToolFormat::Phi4 { open, close });
    assert!(prompt.starts_with("<|system|>You are a helpful assistant with some tools.<|tool|>[{\"name\": \"get_weather\", "), "{prompt}");
    // A family without a tool format of its own (SmolLM2, Gemma, Phi-3.5): Hermes in the system turn, as before.
    let (prompt, request) = format("microsoft-Phi-3.5-mini-instruct.jinja", &|_| {});
    assert_eq!(request.tools.unwrap().format, ToolFormat::Hermes);
    assert!(prompt.starts_with("<|system|>\n# Tools\n\nYou may call one or more functions"), "{prompt}");
    // DeepSeek-R1's generation prompt opens the think block: the reply starts inside it.
    let (prompt, request) = format("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", &|_| {});
    assert!(prompt.ends_with("<｜Assistant｜><think>\n"), "{prompt}");
    assert!(request.reasoning.unwrap().starts_inside);
    // A template that raises is INVALID_ARGUMENT with its message (Llama 3.x takes one call a turn).
    let tok = tokenizer("meta-llama-Llama-3.2-3B-Instruct.jinja");
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}});
    let two_calls: Vec<Message> =
        serde_json::from_value(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]}]))
            .unwrap();
    let err = prepare_chat(&tok, &two_calls, &mut with_tools(json!("auto"))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().ends_with("refused the conversation: This model only supports single tool-calls at once!"), "{err}");
}

#[test]
fn structured_output_applies_after_the_reasoning_block() {
    let tok = tokenizer("Qwen-Qwen3-0.6B.jinja");
    let grammars = Grammars::new(&tok, tok.vocab_size() as u32).unwrap();
    let schema = Constraint::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}));
    let feed = |reasoning: &Reasoning, text: &str| -> Result<bool, String> {
        let mut m = grammars.start(&reasoning.constraint(schema.clone())).map_err(|e| e.to_string())?;
        for id in tok.encode(text).unwrap() {
            if !m.allows(id) {
                return Err(format!("token {id} ({:?}) refused after {text:?}", tok.id_to_token(id)));
            }
            m.advance(id).map_err(|e| e.to_string())?;
        }
        Ok(m.is_accepting())
    };
    let (open, close) = (Marker::text("<think>"), Marker::text("</think>"));
    let qwen = Reasoning { open: open.clone(), close: close.clone(), starts_inside: false };
    assert_eq!(feed(&qwen, "<think>\nNot {json} at all: a < b.\n</think>\n\n{\"a\": 12}"), Ok(true));
    assert_eq!(feed(&qwen, "{\"a\": 3}"), Ok(true), "the block is optional when the reply opens it");
    assert!(feed(&qwen, "Sure! {\"a\": 3}").is_err(), "text outside the block is refused");
    assert!(feed(&qwen, "<think>ok</think>\n\nsure").is_err(), "after the block, only the schema");
    // Tool calls too: after the block, the call grammar (Qwen3 thinks before it calls).
    let tools = Tools::from_options(Some(&weather()), Some(&json!("required")), None).unwrap().unwrap();
    let mut calls = grammars.start(&qwen.constraint(tools.constraint().unwrap())).unwrap();
    for id in tok
        .encode("<think>\nThe user wants Oslo.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")
        .unwrap()
    {
        assert!(calls.allows(id), "token {id} refused");
        calls.advance(id).unwrap();
    }
    assert!(calls.is_complete());
    let r1 = Reasoning { open, close, starts_inside: true };
    assert_eq!(feed(&r1, "Hmm. {\"a\": 1} looks right.\n</think>\n\n{\"a\": 1}"), Ok(true));
    assert_eq!(feed(&r1, "still thinking"), Ok(false), "inside the block: not complete");
}

fn cpu_engine(chat_template: &str) -> Engine {
    let options = EngineOptions { backend: BackendChoice::Cpu, ..EngineOptions::default() };
    pollster::block_on(Engine::load(&model_with(chat_template), options)).unwrap()
}

#[test]
fn a_qwen3_tool_call_comes_back_as_tool_calls() {
    let mut engine = cpu_engine(&template("Qwen-Qwen3-0.6B.jinja"));
    let mut request = GenerateRequest {
        max_tokens: 160,
        chat_template_kwargs: json!({"enable_thinking": false}).as_object().unwrap().clone(),
        ..with_tools(json!("required"))
    };
    let prompt = engine.prepare_chat(&[user("Weather in Oslo?")], &mut request).unwrap();
    let g = pollster::block_on(engine.generate(&prompt, &request, &mut |_| true)).unwrap();
    assert_eq!(g.finish_reason, FinishReason::ToolCalls, "{:?}", g.text);
    let calls = g.tool_calls.unwrap();
    assert_eq!(calls[0].function.name, "get_weather");
    let arguments: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    assert!(g.text.starts_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "), "{:?}", g.text);
    assert_eq!(g.reasoning_content, None);
}

#[test]
fn a_reasoning_reply_streams_and_returns_its_reasoning_apart() {
    let mut engine = cpu_engine(&template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"));
    // Sampled: the random model's argmax may repeat a blank forever.
    let sampling = SamplingParams { temperature: 1.0, seed: 11, ..SamplingParams::greedy() };
    let mut request = GenerateRequest { max_tokens: 24, sampling, ..GenerateRequest::default() };
    let prompt = engine.prepare_chat(&[user("What is 2 + 2?")], &mut request).unwrap();
    assert!(request.reasoning.as_ref().is_some_and(|r| r.starts_inside));
    let (mut streamed_reasoning, mut streamed_text) = (String::new(), String::new());
    let g = pollster::block_on(engine.generate(&prompt, &request, &mut |e| {
        streamed_reasoning.push_str(e.reasoning);
        streamed_text.push_str(e.text);
        true
    }))
    .unwrap();
    // A random model never closes the block: the whole reply is reasoning.
    assert_eq!(g.finish_reason, FinishReason::Length);
    let reasoning = g.reasoning_content.expect("a reasoning reply");
    let raw = engine.tokenizer().decode(&g.tokens).unwrap();
    assert_eq!(reasoning, raw.trim(), "the reasoning is the reply, blanks around it dropped");
    assert_eq!(g.text, "");
    assert_eq!(streamed_text, "");
    assert!(reasoning.starts_with(&streamed_reasoning) && !streamed_reasoning.is_empty(), "{streamed_reasoning:?} vs {reasoning:?}");
}
