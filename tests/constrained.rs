//! Constrained decoding (JSON Schema, JSON objects, Lark grammars, regular expressions) on tiny
//! synthetic models, natively and in the browser: a random model's argmax wanders anywhere, so
//! every output that parses and matches was the mask's doing. Constrained and free requests
//! batch together and the free ones keep their solo tokens; bad constraints are refused before
//! any work; a constraint cut short ends with `length` and a warning. Tool calls (required,
//! named, auto) are valid calls, and a tool result turn continues.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::tiny_model;
use serde_json::{json, Value};

use pagedlm::engine::{
    Constraint, Engine, EngineOptions, ErrorKind, FinishReason, GenerateRequest, Generation, Message, RequestId, SchedConfig, ToolCall, Tools,
};
use pagedlm::rng::Rng;
use pagedlm::sampler::SamplingParams;

fn ids(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 3 + rng.below(256) as u32).collect()
}

/// Schemas whose every output is short (bounded strings, numbers and arrays), so that a random
/// model finishes them within the token limit.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}}, "required": ["color", "ok"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 3}),
        json!({"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}, "tag": {"type": "string", "pattern": "^[a-c]{2}$"}}, "required": ["point", "tag"], "additionalProperties": false}),
    ]
}

/// A check of `value` against the schemas above written out by hand (the native real-model
/// test uses an independent validator; this one also runs in the browser).
fn matches(k: usize, v: &Value) -> bool {
    let int_in = |v: &Value, lo: i64, hi: i64| v.as_i64().is_some_and(|n| (lo..=hi).contains(&n));
    let keys = |v: &Value, want: &[&str]| v.as_object().is_some_and(|o| o.len() == want.len() && want.iter().all(|k| o.contains_key(*k)));
    match k {
        0 => keys(v, &["name", "age"]) && v["name"].as_str().is_some_and(|s| s.chars().count() <= 6) && int_in(&v["age"], 0, 120),
        1 => keys(v, &["color", "ok"]) && ["red", "green", "blue"].contains(&v["color"].as_str().unwrap_or("")) && v["ok"].is_boolean(),
        2 => v.as_array().is_some_and(|a| (1..=3).contains(&a.len()) && a.iter().all(|x| int_in(x, -5, 5))),
        3 => {
            keys(v, &["point", "tag"])
                && keys(&v["point"], &["x", "y"])
                && int_in(&v["point"]["x"], 0, 9)
                && int_in(&v["point"]["y"], 0, 9)
                && v["tag"].as_str().is_some_and(|s| s.len() == 2 && s.bytes().all(|b| (b'a'..=b'c').contains(&b)))
        }
        _ => unreachable!(),
    }
}

fn constrained(schema: &Value, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest { max_tokens: 96, sampling, constraint: Some(Constraint::JsonSchema(schema.clone())), ..Default::default() }
}

fn assert_matches(what: &str, k: usize, g: &Generation) {
    assert_eq!(g.finish_reason, FinishReason::Stop, "{what}: schema {k} did not complete: {:?} ({:?})", g.text, g.warning);
    assert!(g.warning.is_none(), "{what}: {:?}", g.warning);
    let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{what}: schema {k}: {:?} does not parse: {e}", g.text));
    assert!(matches(k, &v), "{what}: schema {k}: {v} does not match");
}

gpu_test! {
    // Every schema, greedy and sampled, alone and then all at once in batches of 8 with a
    // free request among them, which keeps its solo tokens.
    async fn json_schemas_hold_on_a_random_model_alone_and_batched() {
        let bytes = tiny_model(51);
        let mut rng = Rng::new(5);
        let mut work: Vec<(usize, Vec<u32>, GenerateRequest)> = Vec::new();
        for (k, schema) in schemas().iter().enumerate() {
            for s in 0..2u64 {
                let sampling = if s == 0 { SamplingParams::greedy() } else { SamplingParams { temperature: 1.5, seed: 10 + k as u64, ..SamplingParams::greedy() } };
                let n = 3 + rng.below(12) as usize;
                work.push((k, ids(&mut rng, n), constrained(schema, sampling)));
            }
        }
        let free = (ids(&mut rng, 9), GenerateRequest { max_tokens: 24, ignore_eos: true, ..Default::default() });
        let opts = EngineOptions { max_context: 160, prefix_cache: false, ..Default::default() };
        let mut alone = Engine::load(&bytes, opts.clone()).await.unwrap();
        let mut solo = Vec::new();
        for (k, prompt, request) in &work {
            let g = alone.generate(prompt, request, &mut |_| true).await.unwrap();
            assert_matches("alone", *k, &g);
            solo.push(g.tokens);
        }
        let free_solo = alone.generate(&free.0, &free.1, &mut |_| true).await.unwrap().tokens;
        assert!(alone.grammar_build_ms().is_some());

        let sched = SchedConfig { max_batch: 8, step_tokens: 64, ..Default::default() };
        let mut batched = Engine::load(&bytes, EngineOptions { sched, block_size: 8, check_integrity: true, ..opts }).await.unwrap();
        let free_id = batched.submit(free.0.clone(), free.1.clone()).unwrap();
        let submitted: Vec<RequestId> = work.iter().map(|(_, p, r)| batched.submit(p.clone(), r.clone()).unwrap()).collect();
        let done = common::finish_streamed(&mut batched, true).await;
        assert_eq!(done[&free_id].tokens, free_solo, "the free request's tokens in a batch with constrained ones");
        for (i, id) in submitted.iter().enumerate() {
            let k = work[i].0;
            assert_matches("batched", k, &done[id]);
            assert_eq!(done[id].tokens, solo[i], "request {i} (schema {k}): batched tokens differ from its solo run");
        }
    }
}

gpu_test! {
    // JSON objects, a Lark grammar and a regular expression, through `generate`.
    async fn json_objects_grammars_and_regular_expressions_hold() {
        let bytes = tiny_model(52);
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 160, ..Default::default() }).await.unwrap();
        let prompt: Vec<u32> = ids(&mut Rng::new(6), 8);
        let run = |c: Constraint| GenerateRequest { max_tokens: 64, constraint: Some(c), ..Default::default() };
        // Any object: a random model would write strings forever, so the test asks for the
        // empty object's shortest path only by checking what came out parses as an object.
        let lark = "start: \"id=\" NUM (\",\" NUM)*\nNUM: /[1-9][0-9]?/\n";
        let g = engine.generate(&prompt, &run(Constraint::Lark(lark.into())), &mut |_| true).await.unwrap();
        let ok = g.text.strip_prefix("id=").is_some_and(|rest| rest.split(',').all(|n| (1..=99).contains(&n.parse::<u32>().unwrap_or(0))));
        assert!(ok, "lark: {:?} ({:?}, {:?})", g.text, g.finish_reason, g.warning);
        let g = engine.generate(&prompt, &run(Constraint::Regex("(yes|no|maybe)!".into())), &mut |_| true).await.unwrap();
        assert!(["yes!", "no!", "maybe!"].contains(&g.text.as_str()), "regex: {:?}", g.text);
        assert_eq!(g.finish_reason, FinishReason::Stop, "a complete match ends without a step for end of generation");
        let object = GenerateRequest { max_tokens: 400, sampling: SamplingParams { temperature: 0.7, seed: 3, ..SamplingParams::greedy() }, constraint: Some(Constraint::JsonObject), ..Default::default() };
        let g = engine.generate(&prompt, &object, &mut |_| true).await.unwrap();
        if g.finish_reason == FinishReason::Stop {
            let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("json_object: {:?}: {e}", g.text));
            assert!(v.is_object(), "json_object gave {v}");
        } else {
            assert!(g.text.starts_with('{') && g.warning.is_some(), "json_object cut short: {:?} {:?}", g.text, g.warning);
        }
        // A constrained sequence decodes ahead like a free one: each step's forward pass goes to
        // the GPU before the token of the step before is back, its mask chosen after.
        let sched = engine.sched_stats();
        assert!(sched.steps_ahead * 2 > sched.steps, "{} of {} constrained steps planned ahead", sched.steps_ahead, sched.steps);
    }
}

gpu_test! {
    // Bad constraints are refused at submit with INVALID_ARGUMENT and llguidance's reason; the
    // engine has no work afterwards. A constraint cut at `max_tokens` ends with `length` and a
    // warning saying the output does not match.
    async fn bad_constraints_are_refused_and_short_ones_end_with_length() {
        let bytes = tiny_model(53);
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 64, ..Default::default() }).await.unwrap();
        let bad = [
            (Constraint::JsonSchema(json!({"type": "objekt"})), "objekt"),
            (Constraint::JsonSchema(json!("a string is no schema")), "JSON Schema"),
            (Constraint::Lark("start: (".into()), ""),
            (Constraint::Regex("(unclosed".into()), ""),
        ];
        for (c, needle) in bad {
            let request = GenerateRequest { constraint: Some(c.clone()), ..Default::default() };
            let e = engine.submit(vec![5, 6, 7], request).expect_err(&format!("{c:?} was accepted"));
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{c:?}: {e}");
            assert!(e.to_string().starts_with("invalid constraint") && e.to_string().contains(needle), "{c:?}: {e}");
            assert!(!engine.has_work(), "a refused request left work behind");
        }
        let long = json!({"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string", "minLength": 5}, "minItems": 10}}, "required": ["words"]});
        let request = GenerateRequest { max_tokens: 6, constraint: Some(Constraint::JsonSchema(long)), ..Default::default() };
        let g = engine.generate(&[5, 6, 7], &request, &mut |_| true).await.unwrap();
        assert_eq!((g.finish_reason, g.tokens.len()), (FinishReason::Length, 6), "{:?}", g.text);
        let warning = g.warning.expect("a warning that the output is incomplete");
        assert!(warning.contains("length") && warning.contains("not match"), "{warning}");
        // The one layout: no whitespace but after ':' and ','.
        let head = "{\"words\": [\"";
        assert!(head.starts_with(&g.text) || g.text.starts_with(head), "{:?}", g.text);
    }
}

/// Two functions whose every call is short (bounded strings, enums, integers).
fn two_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"], "additionalProperties": false}}}
    ])
}

/// Whether `call` is a call of one of [`two_tools`] with arguments its schema allows.
fn valid_call(call: &ToolCall) -> bool {
    let Ok(args) = serde_json::from_str::<Value>(&call.function.arguments) else { return false };
    let keys = |want: &[&str]| args.as_object().is_some_and(|o| o.len() == want.len() && want.iter().all(|k| o.contains_key(*k)));
    match call.function.name.as_str() {
        "get_weather" => {
            keys(&["city", "unit"])
                && args["city"].as_str().is_some_and(|s| s.chars().count() <= 6)
                && ["c", "f"].contains(&args["unit"].as_str().unwrap_or(""))
        }
        "get_time" => keys(&["zone"]) && args["zone"].as_i64().is_some_and(|z| (-12..=14).contains(&z)),
        _ => false,
    }
}

gpu_test! {
    // Tool calls on a random model: under `required` and a named function every reply is one
    // valid call (greedy and sampled, 6 at once), under `auto` a reply is valid calls or text
    // that does not start a call; the calls, written back with a tool result, make a prompt
    // that continues. Tools with another constraint, or a bad parameter schema, are refused.
    async fn tool_calls_are_valid_calls_and_a_tool_result_continues() {
        // A tiny model with room for the tools' system turn (~1000 of its byte-level tokens).
        let bytes = pagedlm::synth::tiny_llama_gguf(&pagedlm::synth::SynthConfig { seed: 54, context: 1536, ..pagedlm::synth::SynthConfig::tiny() });
        let sched = SchedConfig { max_batch: 8, step_tokens: 64, ..Default::default() };
        let mut engine = Engine::load(&bytes, EngineOptions { max_context: 1280, sched, ..Default::default() }).await.unwrap();
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let choices = [json!("required"), named, json!("auto")];
        let mut submitted = Vec::new();
        for (c, choice) in choices.iter().enumerate() {
            let tools = Tools::from_openai(&two_tools(), Some(choice), None).unwrap();
            for s in 0..2u64 {
                let sampling = if s == 0 { SamplingParams::greedy() } else { SamplingParams { temperature: 1.2, seed: s * 7 + c as u64, ..SamplingParams::greedy() } };
                let user = Message { role: "user".into(), content: Some(format!("Question {c}.{s}: what now?")), ..Default::default() };
                let prompt = engine.openai_chat_prompt(std::slice::from_ref(&user), Some(&tools)).unwrap();
                let request = GenerateRequest { max_tokens: 200, sampling, tools: Some(tools.clone()), ..Default::default() };
                submitted.push((c, user, engine.submit(prompt, request).unwrap()));
            }
        }
        let done = common::finish_streamed(&mut engine, false).await;
        let mut follow_up = None;
        for (c, user, id) in &submitted {
            let g = &done[id];
            match (c, &g.tool_calls) {
                (0 | 1, Some(calls)) => {
                    assert_eq!(g.finish_reason, FinishReason::ToolCalls);
                    assert!(calls.len() == 1 && valid_call(&calls[0]), "choice {c}: {calls:?} from {:?}", g.text);
                    assert!(*c != 1 || calls[0].function.name == "get_time", "the named function: {calls:?}");
                    assert_eq!(calls[0].id, format!("call_{}_0", id.0));
                    follow_up.get_or_insert((user.clone(), calls.clone()));
                }
                (2, Some(calls)) => assert!(calls.iter().all(valid_call) && g.finish_reason == FinishReason::ToolCalls, "auto: {calls:?}"),
                (2, None) => assert!(!g.text.trim_start().starts_with("<tool_call>") && g.finish_reason != FinishReason::ToolCalls, "auto text: {:?}", g.text),
                _ => panic!("choice {c} gave no call: {:?} ({:?}, {:?})", g.text, g.finish_reason, g.warning),
            }
        }
        let (user, calls) = follow_up.unwrap();
        let history = vec![
            user,
            Message { role: "assistant".into(), content: None, tool_calls: calls.clone(), ..Default::default() },
            Message { role: "tool".into(), content: Some("{\"result\": 21}".into()), tool_call_id: Some(calls[0].id.clone()), ..Default::default() },
        ];
        let tools = Tools::from_openai(&two_tools(), None, None).unwrap();
        let prompt = engine.openai_chat_prompt(&history, Some(&tools)).unwrap();
        let text = engine.tokenizer().decode(&prompt).unwrap();
        assert!(text.contains(&format!("<tool_call>\n{{\"name\": \"{}\"", calls[0].function.name)) && text.contains("<tool_response>\n{\"result\": 21}\n</tool_response>"), "{text}");
        let request = GenerateRequest { max_tokens: 12, tools: Some(tools.clone()), ..Default::default() };
        let g = engine.generate(&prompt, &request, &mut |_| true).await.unwrap();
        assert!(!g.tokens.is_empty(), "the turn after a tool result generated nothing");

        let both = GenerateRequest { constraint: Some(Constraint::JsonObject), tools: Some(tools), ..Default::default() };
        let e = engine.submit(vec![5, 6], both).expect_err("tools with response_format");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let bad = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]);
        let bad = GenerateRequest { tools: Some(Tools::from_openai(&bad, Some(&json!("required")), None).unwrap()), ..Default::default() };
        let e = engine.submit(vec![5, 6], bad).expect_err("a bad parameter schema");
        assert!(e.kind() == ErrorKind::InvalidArgument && e.to_string().contains("objekt"), "{e}");
        assert!(!engine.has_work());
    }
}
