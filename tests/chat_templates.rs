//! Real chat templates (tests/data/templates/, the families pagedlm runs) rendered by pagedlm's
//! minijinja renderer exactly as jinja2 renders them the way transformers does: the references
//! in tests/data/templates/expected.json come from scripts/chat_templates_ref.py over the same
//! cases (tests/data/templates/cases.json): with and without tools, a system message, several
//! turns, with and without the generation prompt, a tool call and its result, Qwen3's
//! `enable_thinking: false`, reasoning in the history. Natively and in the browser (the renderer
//! is part of the wasm package).

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use pagedlm::tokenizer::{ChatInput, ChatTemplate, TokenizerError};
use serde_json::{Map, Value};

const CASES: &str = include_str!("data/templates/cases.json");
const EXPECTED: &str = include_str!("data/templates/expected.json");

/// Every template cases.json names, by that name.
const TEMPLATES: [(&str, &str); 10] = [
    ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", include_str!("data/templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja")),
    ("HuggingFaceTB-SmolLM3-3B.jinja", include_str!("data/templates/HuggingFaceTB-SmolLM3-3B.jinja")),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", include_str!("data/templates/Qwen-Qwen2.5-7B-Instruct.jinja")),
    ("Qwen-Qwen3-0.6B.jinja", include_str!("data/templates/Qwen-Qwen3-0.6B.jinja")),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", include_str!("data/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")),
    ("../gemma3/chat_template.jinja", include_str!("data/gemma3/chat_template.jinja")),
    ("google-gemma-2-2b-it.jinja", include_str!("data/templates/google-gemma-2-2b-it.jinja")),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", include_str!("data/templates/meta-llama-Llama-3.2-3B-Instruct.jinja")),
    ("microsoft-Phi-3.5-mini-instruct.jinja", include_str!("data/templates/microsoft-Phi-3.5-mini-instruct.jinja")),
    ("microsoft-Phi-4-mini-instruct.jinja", include_str!("data/templates/microsoft-Phi-4-mini-instruct.jinja")),
];

fn read_json(name: &str) -> Value {
    let text = match name {
        "cases.json" => CASES,
        _ => EXPECTED,
    };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("tests/data/templates/{name}: {e}"))
}

fn template(name: &str, tokens: &Value) -> ChatTemplate {
    let source = TEMPLATES.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name} is not in TEMPLATES")).1;
    ChatTemplate::new(source, tokens["bos_token"].as_str().unwrap(), tokens["eos_token"].as_str().unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn input(spec: &Value, case: &Value) -> ChatInput {
    ChatInput {
        messages: case["messages"].as_array().unwrap().clone(),
        tools: case.get("tools").and_then(Value::as_bool).unwrap_or(false).then(|| spec["tools"].as_array().unwrap().clone()),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        kwargs: case.get("kwargs").and_then(Value::as_object).cloned().unwrap_or_else(Map::new),
        now: spec["now_unix"].as_i64(),
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn every_family_renders_exactly_as_jinja2_does() {
    let spec = read_json("cases.json");
    let expected = read_json("expected.json");
    let mut compared = 0;
    assert_eq!(spec["templates"].as_object().unwrap().len(), TEMPLATES.len(), "cases.json and TEMPLATES name the same templates");
    for (name, tokens) in spec["templates"].as_object().unwrap() {
        let template = template(name, tokens);
        for (case, c) in spec["cases"].as_object().unwrap() {
            let want = &expected["templates"][name][case];
            let got = template.render(&input(&spec, c));
            match (want.get("text").and_then(Value::as_str), got) {
                (Some(want), Ok(got)) => assert_eq!(got, want, "{name} / {case}"),
                (Some(_), Err(e)) => panic!("{name} / {case}: jinja2 renders it, pagedlm fails: {e}"),
                (None, Ok(got)) => panic!("{name} / {case}: jinja2 fails ({want}), pagedlm renders {got:?}"),
                (None, Err(e)) => {
                    // The template's own message when it raises; any error when Python's types
                    // refuse what minijinja's refuse in other words.
                    if let Some(raised) = want.get("raised").and_then(Value::as_str) {
                        assert_eq!(e.to_string(), format!("the model's chat template refused the conversation: {raised}"), "{name} / {case}");
                    }
                    assert!(matches!(e, TokenizerError::Template(_)), "{name} / {case}: {e}");
                }
            }
            compared += 1;
        }
    }
    assert!(compared >= 100, "only {compared} renderings compared");
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn probes_find_what_each_template_does_with_tools_and_reasoning() {
    let spec = read_json("cases.json");
    let caps = |name: &str| template(name, &spec["templates"][name]).caps();
    // (template, writes `tools`, writes `tool_calls`, needs text arguments, knows <think>)
    let want = [
        ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", false, false, false, false),
        ("HuggingFaceTB-SmolLM3-3B.jinja", false, false, false, true),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", true, true, false, false),
        ("Qwen-Qwen3-0.6B.jinja", true, true, false, true),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", false, true, true, true),
        ("google-gemma-2-2b-it.jinja", false, false, false, false),
        ("../gemma3/chat_template.jinja", false, false, false, false),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", true, true, false, false),
        ("microsoft-Phi-3.5-mini-instruct.jinja", false, false, false, false),
        ("microsoft-Phi-4-mini-instruct.jinja", false, false, false, false),
    ];
    for (name, tools, tool_calls, string_arguments, thinking) in want {
        let c = caps(name);
        assert_eq!((c.tools, c.tool_calls, c.string_arguments, c.thinking), (tools, tool_calls, string_arguments, thinking), "{name}");
    }
}
