//! Tool calls, OpenAI-style: the functions a request offers (`tools`, `tool_choice`,
//! `parallel_tool_calls`), the conversation written for the model with them, the grammar a call
//! must follow, and the reply read back as calls.
//!
//! The format is the one Hermes and Qwen models are trained on, rendered inside the model's own
//! chat template (ChatML for SmolLM2, turns for Gemma 3):
//! - the offered functions go at the end of the system turn (after the caller's system message,
//!   or the template's default one): a `# Tools` section with one `{"type": "function",
//!   "function": {name, description, parameters}}` line per function inside `<tools></tools>`,
//!   and how to call them;
//! - a call is `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`; several calls
//!   (only with `parallel_tool_calls: true`) are separated by a newline;
//! - an assistant message's `tool_calls` are written back in that form, after its content;
//! - `tool` messages become a `user` turn holding `<tool_response>\nCONTENT\n</tool_response>`
//!   (consecutive ones share the turn), which both templates accept.
//!
//! A call is constrained ([`Tools::constraint`], a Lark grammar with one `%json` rule per
//! function's parameter schema): under `required` or a named function the reply is calls only;
//! under `auto` it is either calls or text that does not start with `<tool_call>`; under `none`
//! the functions are not offered and nothing is constrained.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::constraint::{json_layout, Constraint, ConstraintError};
use crate::tokenizer::ChatMessage;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of its arguments (an object schema; `{"type": "object"}` when not given).
    pub parameters: Value,
}

/// Which calls the reply may hold (OpenAI's `tool_choice`).
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Text or calls, as the model chooses (the default).
    Auto,
    /// Text only: the functions are not offered.
    None,
    /// At least one call, of any function.
    Required,
    /// A call of this function.
    Function(String),
}

/// The functions a request offers and how they may be called.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// More than one call in a reply (`parallel_tool_calls: true`; one call otherwise: small
    /// models asked for "one or more" tend to repeat a call until the token limit).
    pub parallel: bool,
}

/// A call in a reply or in an assistant message of the history, as OpenAI writes it:
/// `{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a JSON text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

/// The function a [`ToolCall`] calls and its arguments (a JSON text).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A chat message as OpenAI's API writes it: `content` may be null on an assistant message that
/// holds `tool_calls`; a `tool` message answers the call named by `tool_call_id`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

fn invalid(why: impl Into<String>) -> ConstraintError {
    ConstraintError::Invalid(why.into())
}

impl Tools {
    /// Reads OpenAI's `tools` (`[{"type": "function", "function": {name, description?,
    /// parameters?, strict?}}]`), `tool_choice` (`"auto"`, `"none"`, `"required"` or `{"type":
    /// "function", "function": {"name"}}`; `auto` when absent) and `parallel_tool_calls`.
    /// Names are 1-64 of `[A-Za-z0-9_-]` and unique; a named choice must name one of them.
    /// Whether each parameter schema can be used is checked when the request's constraint
    /// starts ([`crate::constraint::Grammars::start`]).
    pub fn from_openai(tools: &Value, choice: Option<&Value>, parallel: Option<bool>) -> Result<Tools, ConstraintError> {
        let list = tools
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid("tools must be a non-empty array of {type: \"function\", function: {name, description, parameters}}"))?;
        let mut functions: Vec<Function> = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            let kind = tool.get("type").and_then(Value::as_str);
            let f = tool.get("function").filter(|f| f.is_object());
            let (Some("function"), Some(f)) = (kind, f) else {
                return Err(invalid(format!("tools[{i}] must be {{type: \"function\", function: {{name, description, parameters}}}}")));
            };
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let well_formed = (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !well_formed {
                return Err(invalid(format!("tools[{i}].function.name {name:?} must be 1-64 letters, digits, '_' or '-'")));
            }
            if functions.iter().any(|g| g.name == name) {
                return Err(invalid(format!("tools[{i}]: two functions are named {name:?}")));
            }
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object"}),
                Some(p) if p.is_object() => p.clone(),
                Some(_) => return Err(invalid(format!("tools[{i}].function.parameters must be a JSON Schema object"))),
            };
            let description = f.get("description").and_then(Value::as_str).map(str::to_string);
            functions.push(Function { name: name.to_string(), description, parameters });
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(invalid(format!("tool_choice {other:?} is not \"auto\", \"none\", \"required\" or {{type: \"function\", function: {{name}}}}")))
                }
            },
            Some(named) => {
                let name = named.pointer("/function/name").and_then(Value::as_str).filter(|_| named.get("type").and_then(Value::as_str) == Some("function"));
                let name = name.ok_or_else(|| invalid("tool_choice must be \"auto\", \"none\", \"required\" or {type: \"function\", function: {name}}"))?;
                if !functions.iter().any(|f| f.name == name) {
                    return Err(invalid(format!("tool_choice names {name:?}, which is not among the tools")));
                }
                ToolChoice::Function(name.to_string())
            }
        };
        Ok(Tools { functions, choice, parallel: parallel.unwrap_or(false) })
    }

    /// A request's `tools`, `tool_choice` and `parallel_tool_calls` options as the CLI and the
    /// wasm API read them (null is absent): none without `tools`, and `tool_choice` without
    /// `tools` refused.
    pub fn from_options(tools: Option<&Value>, choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<Tools>, ConstraintError> {
        let (tools, choice) = (tools.filter(|t| !t.is_null()), choice.filter(|c| !c.is_null()));
        match (tools, choice) {
            (None, Some(_)) => Err(invalid("tool_choice needs tools")),
            (None, None) => Ok(None),
            (Some(tools), choice) => Tools::from_openai(tools, choice, parallel).map(Some),
        }
    }

    /// Whether the functions are offered to the model (every choice but `none`).
    pub fn offered(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The grammar of the reply: calls of the offered functions (or, under `auto`, text that
    /// does not start a call). `None` under `none`.
    pub fn constraint(&self) -> Option<Constraint> {
        let callable: Vec<(usize, &Function)> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Function(name) => self.functions.iter().enumerate().filter(|(_, f)| &f.name == name).collect(),
            _ => self.functions.iter().enumerate().collect(),
        };
        let mut lark = String::new();
        lark.push_str(match (&self.choice, self.parallel) {
            (ToolChoice::Auto, _) => "start: TEXT | calls\nTEXT: /(?s:.+)/ & ~/(?s:[ \\t\\n]*<tool_call>.*)/\n",
            _ => "start: calls\n",
        });
        lark.push_str(if self.parallel { "calls: call (\"\\n\" call)*\n" } else { "calls: call\n" });
        let alternatives: Vec<String> = callable.iter().map(|(i, _)| format!("f{i}")).collect();
        lark.push_str(&format!("call: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"\n", alternatives.join(" | ")));
        for (i, f) in callable {
            // Names are [A-Za-z0-9_-]: nothing to escape inside the Lark string.
            lark.push_str(&format!("f{i}: \"{{\\\"name\\\": \\\"{}\\\", \\\"arguments\\\": \" a{i} \"}}\"\n", f.name));
            lark.push_str(&format!("a{i}: %json {}\n", json_layout(f.parameters.clone())));
        }
        Some(Constraint::Lark(lark))
    }

    /// The text the system turn ends with when the functions are offered.
    pub fn system_text(&self) -> String {
        let mut text = String::from(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for f in &self.functions {
            let mut function = format!("{{\"name\": {}", Value::from(f.name.as_str()));
            if let Some(d) = &f.description {
                function.push_str(&format!(", \"description\": {}", Value::from(d.as_str())));
            }
            function.push_str(&format!(", \"parameters\": {}}}", f.parameters));
            text.push('\n');
            text.push_str(&format!("{{\"type\": \"function\", \"function\": {function}}}"));
        }
        text.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        text
    }

    /// The calls a reply holds, when it is calls (it starts with `<tool_call>`, each call parses
    /// and names an offered function, and nothing but blanks lies between or after them);
    /// `None` when it is text. Call `k` gets the id `{id_prefix}{k}`.
    pub fn read_calls(&self, reply: &str, id_prefix: &str) -> Option<Vec<ToolCall>> {
        if !self.offered() {
            return None;
        }
        let mut rest = reply.trim_start();
        let mut calls = Vec::new();
        while let Some(body) = rest.strip_prefix(CALL_OPEN) {
            let end = body.find(CALL_CLOSE)?;
            let text = body[..end].trim();
            let call: Value = serde_json::from_str(text).ok()?;
            let name = call.get("name").and_then(Value::as_str)?;
            let arguments = call.get("arguments").filter(|a| a.is_object())?;
            if !self.functions.iter().any(|f| f.name == name) {
                return None;
            }
            calls.push(ToolCall {
                id: format!("{id_prefix}{}", calls.len()),
                kind: function_type(),
                function: FunctionCall { name: name.to_string(), arguments: raw_arguments(text, name).unwrap_or_else(|| arguments.to_string()) },
            });
            rest = body[end + CALL_CLOSE.len()..].trim_start();
        }
        (!calls.is_empty() && rest.is_empty()).then_some(calls)
    }
}

/// The arguments of a call `{"name": NAME, "arguments": ARGS}` as the model wrote them (the form
/// the grammar writes), so that the call written back into the conversation is the same text.
fn raw_arguments(call: &str, name: &str) -> Option<String> {
    let prefix = format!("{{\"name\": {}, \"arguments\": ", Value::from(name));
    let args = call.strip_prefix(&prefix)?.strip_suffix('}')?.trim();
    serde_json::from_str::<Value>(args).ok().map(|_| args.to_string())
}

/// The conversation as the chat template takes it: `tools`' section at the end of the system
/// turn when they are offered (after the first message when it is a system one, else after
/// `default_system`, the template's own), assistant `tool_calls` written as calls and `tool`
/// messages as `<tool_response>` user turns (see the module docs). A `developer` message is a
/// system one. A message other than an assistant one without content is refused.
pub fn chat_messages(messages: &[Message], tools: Option<&Tools>, default_system: Option<&str>) -> Result<Vec<ChatMessage>, ConstraintError> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if let Some(tools) = tools.filter(|t| t.offered()) {
        let first_is_system = messages.first().is_some_and(|m| m.role == "system" || m.role == "developer");
        if !first_is_system {
            let system = default_system.map(|s| format!("{s}\n\n")).unwrap_or_default();
            out.push(ChatMessage::new("system", format!("{system}{}", tools.system_text())));
        }
    }
    let mut in_tool_turn = false;
    for (i, m) in messages.iter().enumerate() {
        let content = m.content.as_deref();
        let may_be_empty = m.role == "assistant" && !m.tool_calls.is_empty();
        if content.is_none() && !may_be_empty {
            return Err(invalid(format!("messages[{i}] ({}) has no content", m.role)));
        }
        let content = content.unwrap_or_default();
        match m.role.as_str() {
            "tool" => {
                let response = format!("<tool_response>\n{content}\n</tool_response>");
                match out.last_mut().filter(|_| in_tool_turn) {
                    Some(turn) => turn.content = format!("{}\n{response}", turn.content),
                    None => out.push(ChatMessage::new("user", response)),
                }
                in_tool_turn = true;
                continue;
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let mut text = content.to_string();
                for call in &m.tool_calls {
                    // Arguments that are not JSON are kept as a JSON string.
                    // Arguments are written as they came (a reply's are the text the model
                    // wrote, so its K/V can be reused); ones that are not JSON as a JSON string.
                    let raw = call.function.arguments.trim();
                    let args = if serde_json::from_str::<Value>(raw).is_ok() { raw.to_string() } else { Value::from(raw).to_string() };
                    let body = format!("{{\"name\": {}, \"arguments\": {args}}}", Value::from(call.function.name.as_str()));
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}"));
                }
                out.push(ChatMessage::new("assistant", text));
            }
            "system" | "developer" => {
                let mut text = content.to_string();
                if let Some(tools) = tools.filter(|t| t.offered() && i == 0) {
                    text = format!("{text}\n\n{}", tools.system_text());
                }
                out.push(ChatMessage::new("system", text));
            }
            role => out.push(ChatMessage::new(role, content)),
        }
        in_tool_turn = false;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"]}}}
        ])
    }

    #[test]
    fn reads_openai_tools_and_refuses_bad_ones() {
        let t = Tools::from_openai(&weather(), Some(&json!({"type": "function", "function": {"name": "get_time"}})), None).unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_time".into()));
        assert_eq!(t.functions[0].description.as_deref(), Some("Weather in a city"));
        assert!(!t.parallel);
        let bad = [
            (json!([]), None),
            (json!([{"type": "function", "function": {"name": "a b"}}]), None),
            (json!([{"type": "function", "function": {"name": "x"}}, {"type": "function", "function": {"name": "x"}}]), None),
            (json!([{"type": "code", "function": {"name": "x"}}]), None),
            (json!([{"type": "function", "function": {"name": "x", "parameters": 3}}]), None),
            (weather(), Some(json!("sometimes"))),
            (weather(), Some(json!({"type": "function", "function": {"name": "get_mail"}}))),
        ];
        for (tools, choice) in bad {
            let e = Tools::from_openai(&tools, choice.as_ref(), None).expect_err(&format!("{tools} {choice:?}"));
            assert!(matches!(e, ConstraintError::Invalid(_)), "{e}");
        }
    }

    #[test]
    fn writes_tools_calls_and_responses_into_the_conversation() {
        let tools = Tools::from_openai(&weather(), None, None).unwrap();
        let call = ToolCall {
            id: "c0".into(),
            kind: "function".into(),
            function: FunctionCall { name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() },
        };
        let messages = vec![
            Message { role: "user".into(), content: Some("Weather in Oslo?".into()), ..Default::default() },
            Message { role: "assistant".into(), content: None, tool_calls: vec![call], ..Default::default() },
            Message { role: "tool".into(), content: Some("{\"temp\": 3}".into()), tool_call_id: Some("c0".into()), ..Default::default() },
            Message { role: "tool".into(), content: Some("second".into()), tool_call_id: Some("c1".into()), ..Default::default() },
        ];
        let out = chat_messages(&messages, Some(&tools), Some("You are helpful.")).unwrap();
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.starts_with("You are helpful.\n\n# Tools"), "{}", out[0].content);
        assert!(out[0].content.contains("{\"name\": \"get_time\", \"parameters\": {"), "{}", out[0].content);
        assert_eq!(out[2].content, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
        assert_eq!(out[3].content, "<tool_response>\n{\"temp\": 3}\n</tool_response>\n<tool_response>\nsecond\n</tool_response>");
        // A caller's system message keeps its text and gets the tools after it; `none` offers nothing.
        let with_system = [Message { role: "developer".into(), content: Some("Be brief.".into()), ..Default::default() }];
        let out = chat_messages(&with_system, Some(&tools), None).unwrap();
        assert!(out.len() == 1 && out[0].role == "system" && out[0].content.starts_with("Be brief.\n\n# Tools"));
        assert_eq!(Tools::from_options(None, Some(&json!("required")), None), Err(invalid("tool_choice needs tools")));
        assert_eq!(Tools::from_options(Some(&Value::Null), None, None), Ok(None));
        let none = Tools { choice: ToolChoice::None, ..tools.clone() };
        assert_eq!(chat_messages(&with_system, Some(&none), None).unwrap()[0].content, "Be brief.");
        let empty = [Message { role: "user".into(), content: None, ..Default::default() }];
        assert!(chat_messages(&empty, None, None).is_err());
    }

    #[test]
    fn reads_calls_back_and_text_as_text() {
        let tools = Tools::from_openai(&weather(), None, Some(true)).unwrap();
        let reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}\n</tool_call>";
        let calls = tools.read_calls(reply, "call_7_").unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].id.as_str(), calls[0].function.name.as_str()), ("call_7_0", "get_weather"));
        assert_eq!(calls[1].function.arguments, "{\"zone\": \"utc\"}", "the arguments as the model wrote them");
        for text in [
            "It is sunny.",
            "<tool_call>\n{\"name\": \"get_mail\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_time\"",
            &format!("{reply} and more"),
        ] {
            assert_eq!(tools.read_calls(text, "c"), None, "{text}");
        }
        let none = Tools { choice: ToolChoice::None, ..tools };
        assert_eq!(none.read_calls(reply, "c"), None);
    }
}
