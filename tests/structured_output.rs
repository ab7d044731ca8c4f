//! Structured output on the real model (SmolLM2-135M-Instruct), natively: 20 chat prompts,
//! each with two of 4 JSON Schemas (objects with required fields, enums, numbers with bounds, arrays, nested
//! objects, strings with patterns), 8 requests per step, streamed (every request's streamed
//! tokens are its result's); every output parses and validates against its schema with an
//! independent validator (the `jsonschema` crate). Then a few again with INT8 KV, and one alone.
//! Then tool calls: 4 questions under `required` and a named function, 8 at once, every call
//! valid against its function's schema, and a tool result turn that continues. The synthetic models of `tests/constrained.rs` carry the breadth in both runtimes; this test
//! shows the real model's outputs hold too, and prints the constrained step rate.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use common::{now_ms, real_model_bytes, report};
use serde_json::{json, Value};

use pagedlm::engine::{ChatMessage, Constraint, Engine, EngineOptions, FinishReason, GenerateRequest, Generation, KvDtype, Message, SchedConfig, Tools};

const SUBJECTS: [&str; 20] = [
    "a baker in Lyon",
    "a lighthouse keeper",
    "a retired astronaut",
    "a young chess player",
    "a beekeeper",
    "a jazz pianist",
    "a marine biologist",
    "a mountain guide",
    "a librarian in Oslo",
    "a street painter",
    "a train driver",
    "a cheese maker",
    "a robot engineer",
    "a pilot in Kenya",
    "a florist",
    "a fisherman in Maine",
    "a potter",
    "a night nurse",
    "a violin maker",
    "a park ranger",
];

/// (question about the subject, schema).
fn tasks() -> Vec<(&'static str, Value)> {
    vec![
        (
            "Give the name and age of {s}.",
            json!({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 30}, "age": {"type": "integer", "minimum": 18, "maximum": 99}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "How does {s} feel about Mondays? Answer with a mood and a score.",
            json!({"type": "object", "properties": {"mood": {"enum": ["happy", "neutral", "sad"]}, "score": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["mood", "score"], "additionalProperties": false}),
        ),
        (
            "List up to three tools that {s} uses.",
            json!({"type": "object", "properties": {"tools": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 3}}, "required": ["tools"], "additionalProperties": false}),
        ),
        (
            "Where does {s} work? Give the city, the country and an ID code like ABC-12.",
            json!({"type": "object", "properties": {"place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}}, "required": ["city", "country"], "additionalProperties": false}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["place", "code"], "additionalProperties": false}),
        ),
    ]
}

fn prompt(engine: &Engine, question: &str, subject: &str) -> Vec<u32> {
    let text = format!("{} Answer in JSON.", question.replace("{s}", subject));
    engine.chat_prompt(&[ChatMessage::new("user", text)]).unwrap()
}

fn validate(what: &str, schema: &Value, g: &Generation) {
    assert_eq!(g.finish_reason, FinishReason::Stop, "{what}: did not complete: {:?} ({:?})", g.text, g.warning);
    let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{what}: {:?} does not parse: {e}", g.text));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {v} is not valid: {errors:?}");
}

/// Submits `work` to `engine` at once and checks every output; returns (tokens, ms).
async fn run_all(engine: &mut Engine, work: &[(String, Vec<u32>, Value)], what: &str) -> (usize, f64) {
    let t0 = now_ms();
    let mut ids = Vec::new();
    for (_, p, schema) in work {
        let request = GenerateRequest { max_tokens: 96, constraint: Some(Constraint::JsonSchema(schema.clone())), ..Default::default() };
        ids.push(engine.submit(p.clone(), request).unwrap());
    }
    let done = common::finish_streamed(engine, false).await;
    let ms = now_ms() - t0;
    let mut tokens = 0;
    for (k, (id, (name, _, schema))) in ids.iter().zip(work).enumerate() {
        validate(&format!("{what} {name}"), schema, &done[id]);
        tokens += done[id].tokens.len();
        if k < 4 {
            report(&format!("{what} {name}: {}", done[id].text));
        }
    }
    (tokens, ms)
}

gpu_test! {
    async fn real_model_outputs_validate_against_their_schemas() {
        let bytes = real_model_bytes().await;
        let sched = SchedConfig { max_batch: 8, ..Default::default() };
        let opts = EngineOptions { max_context: 512, sched, ..Default::default() };
        let mut engine = Engine::load(&bytes, opts.clone()).await.unwrap();
        // Each subject with two of the four tasks: 40 requests, every schema 10 times.
        let tasks = tasks();
        let mut work = Vec::new();
        for (s, subject) in SUBJECTS.iter().enumerate() {
            for t in [s % 4, (s + 1) % 4] {
                let (question, schema) = &tasks[t];
                work.push((format!("task {t}, subject {s}"), prompt(&engine, question, subject), schema.clone()));
            }
        }
        let (tokens, ms) = run_all(&mut engine, &work, "f32, 8 per step:").await;
        report(&format!("structured output: {} requests, {tokens} tokens in {ms:.0} ms (8 per step), trie built in {:.0} ms", work.len(), engine.grammar_build_ms().unwrap_or(0.0)));

        // INT8 KV: 8 of them, every task twice.
        let mut int8 = Engine::load(&bytes, EngineOptions { kv_dtype: KvDtype::Int8, ..opts }).await.unwrap();
        let some: Vec<_> = work.iter().step_by(5).cloned().collect();
        run_all(&mut int8, &some, "int8:").await;

        // Alone, through generate.
        let (name, p, schema) = &work[7];
        let request = GenerateRequest { max_tokens: 96, constraint: Some(Constraint::JsonSchema(schema.clone())), ..Default::default() };
        let g = engine.generate(p, &request, &mut |_| true).await.unwrap();
        validate(&format!("alone {name}"), schema, &g);
    }
}

/// A 2-tool set: the weather in a city and the time in a zone.
fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}}, "required": ["zone"], "additionalProperties": false}}}
    ])
}

gpu_test! {
    // Tool calls on the real model: 4 questions under `required` and under a named function, 8
    // at once; every call names an offered function (the named one when named) and its
    // arguments validate against that function's schema. A tool result, written back after
    // the call, continues the conversation.
    async fn real_model_tool_calls_are_valid_and_a_tool_result_continues() {
        let bytes = real_model_bytes().await;
        let sched = SchedConfig { max_batch: 8, ..Default::default() };
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 512, sched, ..Default::default() }).await.unwrap();
        let spec = weather_tools();
        let schema_of = |name: &str| spec.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).map(|t| t["function"]["parameters"].clone());
        let questions = ["What is the weather in Paris?", "Is it raining in Tokyo?", "What time is it in Berlin?", "Tell me the time in New York."];
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let mut submitted = Vec::new();
        for choice in [json!("required"), named] {
            let tools = Tools::from_openai(&spec, Some(&choice), None).unwrap();
            for q in questions {
                let user = Message { role: "user".into(), content: Some(q.into()), ..Default::default() };
                let prompt = engine.openai_chat_prompt(std::slice::from_ref(&user), Some(&tools)).unwrap();
                let request = GenerateRequest { max_tokens: 64, tools: Some(tools.clone()), ..Default::default() };
                submitted.push((choice.clone(), user, engine.submit(prompt, request).unwrap()));
            }
        }
        let done = common::finish_streamed(&mut engine, false).await;
        for (choice, user, id) in &submitted {
            let g = &done[id];
            let what = format!("{choice} {:?}", user.content);
            assert_eq!(g.finish_reason, FinishReason::ToolCalls, "{what}: {:?} ({:?})", g.text, g.warning);
            let calls = g.tool_calls.as_ref().unwrap();
            assert_eq!(calls.len(), 1, "{what}: {calls:?}");
            let name = calls[0].function.name.as_str();
            assert!(choice == "required" || name == "get_time", "{what}: called {name}");
            let schema = schema_of(name).unwrap_or_else(|| panic!("{what}: {name} is not offered"));
            let args: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
            let errors: Vec<String> = jsonschema::validator_for(&schema).unwrap().iter_errors(&args).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{what}: {args} is not valid: {errors:?}");
            report(&format!("tool call, {what}: {name}({args})"));
        }
        // The first call and its result, written back: the reply goes on.
        let (_, user, id) = &submitted[0];
        let call = done[id].tool_calls.clone().unwrap();
        let history = vec![
            user.clone(),
            Message { role: "assistant".into(), content: None, tool_calls: call.clone(), ..Default::default() },
            Message { role: "tool".into(), content: Some("{\"temperature\": 18, \"sky\": \"sunny\"}".into()), tool_call_id: Some(call[0].id.clone()), ..Default::default() },
        ];
        let tools = Tools::from_openai(&spec, None, None).unwrap();
        let prompt = engine.openai_chat_prompt(&history, Some(&tools)).unwrap();
        let request = GenerateRequest { max_tokens: 24, tools: Some(tools), ..Default::default() };
        let g = engine.generate(&prompt, &request, &mut |_| true).await.unwrap();
        assert!(!g.tokens.is_empty(), "nothing after the tool result");
        // The call is written back as the model wrote it: the turn reuses the first request's K/V
        // past its prompt.
        let first = &done[id];
        assert!(g.prefix_hit_tokens as usize > first.prompt_tokens.len(), "prefix hit {} of a first prompt of {}", g.prefix_hit_tokens, first.prompt_tokens.len());
        report(&format!("after the tool result ({:?}): {:?}", g.finish_reason, g.text));
    }
}
