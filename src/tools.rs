//! Tool calls, OpenAI-style: the functions a request offers (`tools`, `tool_choice`,
//! `parallel_tool_calls`), the conversation written for the model with them, the grammar a call
//! must follow, and the reply read back as calls.
//!
//! Each family calls in its own format ([`ToolFormat`], found from the chat template): Qwen and
//! Hermes `<tool_call>\n{"name", "arguments"}\n</tool_call>`, Llama 3.x a bare `{"name",
//! "parameters"}` object, Phi-4-mini `<|tool_call|>[{"name", "arguments"}, ...]<|/tool_call|>`.
//! A template that writes `tools` itself (Qwen, Llama 3.x) gets them and the conversation's
//! calls and results as they are ([`template_input`]); Phi-4-mini's takes them in its system
//! message's `tools` field. Other templates (SmolLM2, Gemma) get the Hermes format written into
//! the conversation:
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

use crate::constraint::{json_layout, Constraint, ConstraintError, Marker};

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
    /// How the model writes a call: its family's format, which the engine sets from the chat
    /// template when it renders the prompt ([`ToolFormat::Hermes`] until then).
    pub format: ToolFormat,
}

/// How a family writes tool calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`, several separated by a
    /// newline (Qwen 2.5 and 3, Hermes; and the format pagedlm writes into templates that know
    /// no tools).
    #[default]
    Hermes,
    /// `{"name": NAME, "parameters": ARGS}`, one call (Llama 3.x's JSON tool calling).
    Llama3,
    /// `<|tool_call|>[{"name": NAME, "arguments": ARGS}, ...]<|/tool_call|>` (Phi-4-mini),
    /// the markers being special tokens of its vocabulary.
    Phi4 { open: Marker, close: Marker },
}

impl ToolFormat {
    /// The format of a chat template's family, from its text and what it renders (`renders_tools`:
    /// it writes the `tools` variable). `marker` is how the vocabulary holds a marker, `None`
    /// when it is not one token. Phi-4-mini's template takes the tools in the system message's
    /// `tools` field and its vocabulary has `<|tool_call|>`; Llama 3.x's writes the tools and
    /// asks for `"parameters"`; everything else is Hermes.
    pub fn detect(template: &str, renders_tools: bool, marker: &dyn Fn(&str) -> Option<Marker>) -> ToolFormat {
        if template.contains("message['tools']") || template.contains("<|tool_call|>") {
            if let (Some(open), Some(close)) = (marker("<|tool_call|>"), marker("<|/tool_call|>")) {
                return ToolFormat::Phi4 { open, close };
            }
        }
        if renders_tools && !template.contains("<tool_call>") && template.contains("<|start_header_id|>") && template.contains("\"parameters\"") {
            return ToolFormat::Llama3;
        }
        ToolFormat::Hermes
    }

    /// The text of calls in an assistant turn of the history, for templates that do not write
    /// `tool_calls` themselves. `args` are JSON texts.
    fn calls_text(&self, calls: &[(&str, String)]) -> String {
        let call = |(name, args): &(&str, String), key: &str| format!("{{\"name\": {}, \"{key}\": {args}}}", Value::from(*name));
        match self {
            ToolFormat::Hermes => calls.iter().map(|c| format!("{CALL_OPEN}\n{}\n{CALL_CLOSE}", call(c, "arguments"))).collect::<Vec<_>>().join("\n"),
            ToolFormat::Llama3 => calls.iter().map(|c| call(c, "parameters")).collect::<Vec<_>>().join("; "),
            ToolFormat::Phi4 { open, close } => {
                format!("{}[{}]{}", open.text, calls.iter().map(|c| call(c, "arguments")).collect::<Vec<_>>().join(", "), close.text)
            }
        }
    }
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
    /// An assistant reply's reasoning (what a reasoning model wrote between its think markers),
    /// which some templates write back (Qwen3's, for the turns after the last user message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
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
        Ok(Tools { functions, choice, parallel: parallel.unwrap_or(false), format: ToolFormat::default() })
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

    /// The grammar of the reply in the tools' [`ToolFormat`]: calls of the offered functions (or,
    /// under `auto`, text that does not start a call). `None` under `none`.
    pub fn constraint(&self) -> Option<Constraint> {
        let callable: Vec<(usize, &Function)> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Function(name) => self.functions.iter().enumerate().filter(|(_, f)| &f.name == name).collect(),
            _ => self.functions.iter().enumerate().collect(),
        };
        // Text under `auto` must not start the way a call does (a special-token opener cannot
        // be spelled by text at all).
        let text_start = match &self.format {
            ToolFormat::Hermes => Some(CALL_OPEN.to_string()),
            ToolFormat::Llama3 => Some("{".to_string()),
            ToolFormat::Phi4 { open, .. } => open.special.is_none().then(|| open.text.clone()),
        };
        let mut lark = String::new();
        lark.push_str(
            match (&self.choice, text_start) {
                (ToolChoice::Auto, Some(opener)) => format!("start: TEXT | calls\nTEXT: /(?s:.+)/ & ~/(?s:[ \\t\\n]*{}.*)/\n", regex_escape(&opener)),
                (ToolChoice::Auto, None) => "start: TEXT | calls\nTEXT: /(?s:.+)/\n".to_string(),
                _ => "start: calls\n".to_string(),
            }
            .as_str(),
        );
        let (key, separator) = match &self.format {
            ToolFormat::Hermes => ("arguments", "\"\\n\""),
            ToolFormat::Llama3 => ("parameters", "\"; \""),
            ToolFormat::Phi4 { .. } => ("arguments", "\", \""),
        };
        // Llama 3.x's templates take one call per turn.
        let parallel = self.parallel && self.format != ToolFormat::Llama3;
        lark.push_str(&if parallel {
            format!("calls: {} call ({separator} call)* {}\n", self.calls_open(), self.calls_close())
        } else {
            format!("calls: {} call {}\n", self.calls_open(), self.calls_close())
        });
        let alternatives: Vec<String> = callable.iter().map(|(i, _)| format!("f{i}")).collect();
        lark.push_str(&match &self.format {
            ToolFormat::Hermes => format!("call: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"\n", alternatives.join(" | ")),
            _ => format!("call: {}\n", alternatives.join(" | ")),
        });
        for (i, f) in callable {
            // Names are [A-Za-z0-9_-]: nothing to escape inside the Lark string.
            lark.push_str(&format!("f{i}: \"{{\\\"name\\\": \\\"{}\\\", \\\"{key}\\\": \" a{i} \"}}\"\n", f.name));
            lark.push_str(&format!("a{i}: %json {}\n", json_layout(f.parameters.clone())));
        }
        Some(Constraint::Lark(lark))
    }

    /// What a reply of calls starts and ends with around the calls themselves, in Lark.
    fn calls_open(&self) -> String {
        match &self.format {
            ToolFormat::Phi4 { open, .. } => format!("{} \"[\"", open.lark()),
            _ => String::new(),
        }
    }

    fn calls_close(&self) -> String {
        match &self.format {
            ToolFormat::Phi4 { close, .. } => format!("\"]\" {}", close.lark()),
            _ => String::new(),
        }
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

    /// The calls a reply holds in the tools' [`ToolFormat`], when it is calls (each call parses
    /// and names an offered function, and nothing but blanks lies between or after them);
    /// `None` when it is text. Call `k` gets the id `{id_prefix}{k}`.
    pub fn read_calls(&self, reply: &str, id_prefix: &str) -> Option<Vec<ToolCall>> {
        if !self.offered() {
            return None;
        }
        let calls = match &self.format {
            ToolFormat::Hermes => self.read_hermes(reply)?,
            ToolFormat::Llama3 => read_json_calls(reply.trim(), ';')?,
            ToolFormat::Phi4 { open, close } => {
                let mut rest = reply.trim_start();
                let mut calls = Vec::new();
                while let Some(body) = rest.strip_prefix(open.text.as_str()) {
                    let end = body.find(close.text.as_str())?;
                    let list = body[..end].trim();
                    calls.extend(read_json_calls(list.strip_prefix('[')?.strip_suffix(']')?.trim(), ',')?);
                    rest = body[end + close.text.len()..].trim_start();
                }
                if !rest.is_empty() {
                    return None;
                }
                calls
            }
        };
        if calls.is_empty() || !calls.iter().all(|(name, _)| self.functions.iter().any(|f| &f.name == name)) {
            return None;
        }
        let calls = calls.into_iter().enumerate().map(|(k, (name, arguments))| ToolCall {
            id: format!("{id_prefix}{k}"),
            kind: function_type(),
            function: FunctionCall { name, arguments },
        });
        Some(calls.collect())
    }

    /// Hermes calls: `<tool_call>` JSON `</tool_call>`, one after the other.
    fn read_hermes(&self, reply: &str) -> Option<Vec<(String, String)>> {
        let mut rest = reply.trim_start();
        let mut calls = Vec::new();
        while let Some(body) = rest.strip_prefix(CALL_OPEN) {
            let end = body.find(CALL_CLOSE)?;
            let text = body[..end].trim();
            let call: Value = serde_json::from_str(text).ok()?;
            let name = call.get("name").and_then(Value::as_str)?;
            let arguments = call.get("arguments").filter(|a| a.is_object())?;
            calls.push((name.to_string(), raw_arguments(text, name).unwrap_or_else(|| arguments.to_string())));
            rest = body[end + CALL_CLOSE.len()..].trim_start();
        }
        rest.is_empty().then_some(calls)
    }
}

/// One call as JSON: `{"name": NAME, "arguments" | "parameters": {...}}`, its arguments kept as
/// the model wrote them.
#[derive(Deserialize)]
struct JsonCall<'a> {
    name: String,
    #[serde(alias = "parameters", borrow)]
    arguments: &'a serde_json::value::RawValue,
}

/// JSON calls one after the other, `separator` (and blanks) between them.
fn read_json_calls(text: &str, separator: char) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<JsonCall>();
        let call = stream.next()?.ok()?;
        if !call.arguments.get().trim_start().starts_with('{') {
            return None;
        }
        calls.push((call.name, call.arguments.get().to_string()));
        rest = rest[stream.byte_offset()..].trim_start();
        if let Some(after) = rest.strip_prefix(separator) {
            rest = after.trim_start();
            if rest.is_empty() {
                return None;
            }
        } else if !rest.is_empty() {
            return None;
        }
    }
    Some(calls)
}

/// `text` with the characters a regular expression gives meaning to escaped (and `/`, which ends
/// a Lark regex).
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The arguments of a call `{"name": NAME, "arguments": ARGS}` as the model wrote them (the form
/// the grammar writes), so that the call written back into the conversation is the same text.
fn raw_arguments(call: &str, name: &str) -> Option<String> {
    let prefix = format!("{{\"name\": {}, \"arguments\": ", Value::from(name));
    let args = call.strip_prefix(&prefix)?.strip_suffix('}')?.trim();
    serde_json::from_str::<Value>(args).ok().map(|_| args.to_string())
}

/// What a chat template does with tools, for [`template_input`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateStyle {
    /// It writes the `tools` variable and assistant `tool_calls` (Qwen, Llama 3.x): they are
    /// given as they are, and `tool` messages stay `tool` messages.
    pub native: bool,
    /// Its `tool_calls` take `arguments` as a JSON text rather than an object.
    pub string_arguments: bool,
    /// How the family calls ([`ToolFormat::Phi4`]: the tools go in the system message's
    /// `tools` field, as a JSON text).
    pub format: ToolFormat,
    /// The template's own system prompt, which tools written into the system turn follow when
    /// the conversation has none.
    pub default_system: Option<String>,
}

/// Phi-4-mini's system prompt when tools are offered to a conversation without one (its model
/// card's).
const PHI4_TOOLS_SYSTEM: &str = "You are a helpful assistant with some tools.";

/// The conversation and tools as the chat template takes them (OpenAI-shaped JSON: the messages,
/// and the `tools` variable, `None` when the template is not given any). A `developer` message
/// is a system one; an assistant message without content has content `""` (templates
/// concatenate it); `reasoning_content` is passed on (Qwen3's template writes it back).
///
/// With a [`TemplateStyle::native`] template, offered tools are its `tools`, calls its messages'
/// `tool_calls` (arguments as objects unless it wants text) and results its `tool` messages.
/// With Phi-4-mini's, the functions go as JSON text into the system message's `tools` field,
/// calls into the assistant's content. Otherwise the Hermes section goes at the end of the
/// system turn (after the first message when it is a system one, else after the template's
/// default system prompt), calls are written into the assistant's content in the family's
/// format and results become `<tool_response>` user turns (consecutive ones share the turn),
/// which every template accepts. A message other than an assistant one without content is
/// refused.
// Long: one pass over the messages, each role written for the three template styles side by side.
pub fn template_input(messages: &[Message], tools: Option<&Tools>, style: &TemplateStyle) -> Result<(Vec<Value>, Option<Vec<Value>>), ConstraintError> {
    let offered = tools.filter(|t| t.offered());
    let phi4 = matches!(style.format, ToolFormat::Phi4 { .. });
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    let first_is_system = messages.first().is_some_and(|m| m.role == "system" || m.role == "developer");
    if let (Some(tools), false) = (offered, first_is_system) {
        if phi4 {
            out.push(serde_json::json!({"role": "system", "content": PHI4_TOOLS_SYSTEM, "tools": tools.functions_json()}));
        } else if !style.native {
            let system = style.default_system.as_deref().map(|s| format!("{s}\n\n")).unwrap_or_default();
            out.push(serde_json::json!({"role": "system", "content": format!("{system}{}", tools.system_text())}));
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
        let mut message = serde_json::Map::new();
        match m.role.as_str() {
            "tool" if !style.native && !phi4 => {
                let response = format!("<tool_response>\n{content}\n</tool_response>");
                match out.last_mut().filter(|_| in_tool_turn) {
                    Some(turn) => turn["content"] = Value::from(format!("{}\n{response}", turn["content"].as_str().unwrap_or_default())),
                    None => out.push(serde_json::json!({"role": "user", "content": response})),
                }
                in_tool_turn = true;
                continue;
            }
            "tool" => {
                message.insert("role".into(), "tool".into());
                message.insert("content".into(), content.into());
                if let Some(id) = &m.tool_call_id {
                    message.insert("tool_call_id".into(), id.as_str().into());
                }
            }
            "assistant" if !m.tool_calls.is_empty() && style.native => {
                message.insert("role".into(), "assistant".into());
                message.insert("content".into(), content.into());
                let calls = m.tool_calls.iter().map(|call| {
                    let raw = call.function.arguments.trim();
                    let arguments = match serde_json::from_str::<Value>(raw) {
                        Ok(parsed) if !style.string_arguments => parsed,
                        _ => Value::from(raw),
                    };
                    serde_json::json!({"id": call.id, "type": call.kind, "function": {"name": call.function.name, "arguments": arguments}})
                });
                message.insert("tool_calls".into(), Value::Array(calls.collect()));
            }
            "assistant" if !m.tool_calls.is_empty() => {
                // Arguments are written as they came (a reply's are the text the model wrote, so
                // its K/V can be reused); ones that are not JSON as a JSON string.
                let calls: Vec<(&str, String)> = m
                    .tool_calls
                    .iter()
                    .map(|call| {
                        let raw = call.function.arguments.trim();
                        let args = if serde_json::from_str::<Value>(raw).is_ok() { raw.to_string() } else { Value::from(raw).to_string() };
                        (call.function.name.as_str(), args)
                    })
                    .collect();
                let format = if phi4 { &style.format } else { &ToolFormat::Hermes };
                let calls = format.calls_text(&calls);
                let text = if content.is_empty() { calls } else { format!("{content}\n{calls}") };
                message.insert("role".into(), "assistant".into());
                message.insert("content".into(), text.into());
            }
            "system" | "developer" => {
                message.insert("role".into(), "system".into());
                match offered.filter(|_| i == 0) {
                    Some(tools) if phi4 => {
                        message.insert("content".into(), content.into());
                        message.insert("tools".into(), tools.functions_json().into());
                    }
                    Some(tools) if !style.native => {
                        message.insert("content".into(), format!("{content}\n\n{}", tools.system_text()).into());
                    }
                    _ => {
                        message.insert("content".into(), content.into());
                    }
                }
            }
            role => {
                message.insert("role".into(), role.into());
                message.insert("content".into(), content.into());
            }
        }
        if let (Some(reasoning), "assistant") = (&m.reasoning_content, m.role.as_str()) {
            message.insert("reasoning_content".into(), reasoning.as_str().into());
        }
        out.push(Value::Object(message));
        in_tool_turn = false;
    }
    let tools = offered.filter(|_| style.native).map(Tools::openai_json);
    Ok((out, tools))
}

impl Tools {
    /// The functions as OpenAI writes them, for a template's `tools` variable.
    fn openai_json(&self) -> Vec<Value> {
        self.functions
            .iter()
            .map(|f| {
                let mut function = serde_json::Map::new();
                function.insert("name".into(), f.name.as_str().into());
                if let Some(d) = &f.description {
                    function.insert("description".into(), d.as_str().into());
                }
                function.insert("parameters".into(), f.parameters.clone());
                serde_json::json!({"type": "function", "function": function})
            })
            .collect()
    }

    /// The functions as one JSON text (Phi-4-mini's system `tools` field): `[{name,
    /// description, parameters}]` with Python's separators, as `json.dumps` writes it.
    fn functions_json(&self) -> String {
        let functions: Vec<String> = self
            .openai_json()
            .iter()
            .map(|t| {
                let f = &t["function"];
                let mut text = format!("{{\"name\": {}", f["name"]);
                if let Some(d) = f.get("description") {
                    text.push_str(&format!(", \"description\": {d}"));
                }
                text.push_str(&format!(", \"parameters\": {}}}", python_json(&f["parameters"])));
                text
            })
            .collect();
        format!("[{}]", functions.join(", "))
    }
}

/// `value` with Python's `json.dumps` separators (`", "`, `": "`).
fn python_json(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            format!("{{{}}}", map.iter().map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_json(v))).collect::<Vec<_>>().join(", "))
        }
        other => other.to_string(),
    }
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

    fn hermes(default_system: Option<&str>) -> TemplateStyle {
        TemplateStyle { default_system: default_system.map(str::to_string), ..TemplateStyle::default() }
    }

    fn weather_round() -> Vec<Message> {
        let call = ToolCall {
            id: "c0".into(),
            kind: "function".into(),
            function: FunctionCall { name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() },
        };
        vec![
            Message { role: "user".into(), content: Some("Weather in Oslo?".into()), ..Default::default() },
            Message { role: "assistant".into(), content: None, tool_calls: vec![call], ..Default::default() },
            Message { role: "tool".into(), content: Some("{\"temp\": 3}".into()), tool_call_id: Some("c0".into()), ..Default::default() },
            Message { role: "tool".into(), content: Some("second".into()), tool_call_id: Some("c1".into()), ..Default::default() },
        ]
    }

    #[test]
    fn writes_tools_calls_and_responses_into_the_conversation() {
        let tools = Tools::from_openai(&weather(), None, None).unwrap();
        let (out, template_tools) = template_input(&weather_round(), Some(&tools), &hermes(Some("You are helpful."))).unwrap();
        assert_eq!(template_tools, None, "a template without tools of its own gets them in the system turn");
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        let content = |i: usize| out[i]["content"].as_str().unwrap().to_string();
        assert!(content(0).starts_with("You are helpful.\n\n# Tools"), "{}", content(0));
        assert!(content(0).contains("{\"name\": \"get_time\", \"parameters\": {"), "{}", content(0));
        assert_eq!(content(2), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
        assert_eq!(content(3), "<tool_response>\n{\"temp\": 3}\n</tool_response>\n<tool_response>\nsecond\n</tool_response>");
        // A caller's system message keeps its text and gets the tools after it; `none` offers nothing.
        let with_system = [Message { role: "developer".into(), content: Some("Be brief.".into()), ..Default::default() }];
        let (out, _) = template_input(&with_system, Some(&tools), &hermes(None)).unwrap();
        assert!(out.len() == 1 && out[0]["role"] == "system" && out[0]["content"].as_str().unwrap().starts_with("Be brief.\n\n# Tools"));
        assert_eq!(Tools::from_options(None, Some(&json!("required")), None), Err(invalid("tool_choice needs tools")));
        assert_eq!(Tools::from_options(Some(&Value::Null), None, None), Ok(None));
        let none = Tools { choice: ToolChoice::None, ..tools.clone() };
        assert_eq!(template_input(&with_system, Some(&none), &hermes(None)).unwrap().0[0]["content"], "Be brief.");
        let empty = [Message { role: "user".into(), content: None, ..Default::default() }];
        assert!(template_input(&empty, None, &hermes(None)).is_err());
    }

    #[test]
    fn a_template_with_tools_of_its_own_gets_them_as_they_are() {
        let tools = Tools::from_openai(&weather(), None, None).unwrap();
        let native = TemplateStyle { native: true, ..TemplateStyle::default() };
        let (out, template_tools) = template_input(&weather_round(), Some(&tools), &native).unwrap();
        let template_tools = template_tools.unwrap();
        assert_eq!(template_tools[0], weather()[0], "the tools as OpenAI wrote them");
        assert_eq!(
            out[1],
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]})
        );
        assert_eq!(out[2], json!({"role": "tool", "content": "{\"temp\": 3}", "tool_call_id": "c0"}));
        assert_eq!(out.len(), 4, "no system turn is added");
        let text_arguments = TemplateStyle { string_arguments: true, ..native };
        let (out, _) = template_input(&weather_round(), Some(&tools), &text_arguments).unwrap();
        assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    }

    fn phi4() -> ToolFormat {
        ToolFormat::Phi4 {
            open: Marker { text: "<|tool_call|>".into(), special: Some(200025) },
            close: Marker { text: "<|/tool_call|>".into(), special: Some(200026) },
        }
    }

    #[test]
    fn phi4_takes_the_tools_in_its_system_message_and_calls_in_a_list() {
        let tools = Tools::from_openai(&weather(), None, None).unwrap();
        let style = TemplateStyle { format: phi4(), ..TemplateStyle::default() };
        let (out, template_tools) = template_input(&weather_round(), Some(&tools), &style).unwrap();
        assert_eq!(template_tools, None);
        assert_eq!(out[0]["content"], "You are a helpful assistant with some tools.");
        let functions: Value = serde_json::from_str(out[0]["tools"].as_str().unwrap()).unwrap();
        assert_eq!(functions[0]["name"], "get_weather");
        assert!(out[0]["tools"]
            .as_str()
            .unwrap()
            .starts_with("[{\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\""));
        assert_eq!(out[2]["content"], "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}]<|/tool_call|>");
        assert_eq!(out[3]["role"], "tool");
        let tools = Tools { format: phi4(), parallel: true, ..tools };
        let reply = "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}]<|/tool_call|>";
        let calls = tools.read_calls(reply, "c").unwrap();
        assert_eq!(calls.iter().map(|c| c.function.name.as_str()).collect::<Vec<_>>(), ["get_weather", "get_time"]);
        assert_eq!(calls[0].function.arguments, "{\"city\": \"Oslo\"}");
        assert_eq!(tools.read_calls("<|tool_call|>[{\"name\": \"get_mail\", \"arguments\": {}}]<|/tool_call|>", "c"), None);
        let Some(Constraint::Lark(lark)) = tools.constraint() else { panic!() };
        assert!(lark.contains("calls: <[200025]> \"[\" call (\", \" call)* \"]\" <[200026]>"), "{lark}");
    }

    #[test]
    fn llama3_calls_are_bare_json_with_parameters() {
        let tools = Tools { format: ToolFormat::Llama3, ..Tools::from_openai(&weather(), None, Some(true)).unwrap() };
        let calls = tools.read_calls(" {\"name\": \"get_time\", \"parameters\": {\"zone\": \"utc\"}}", "call_1_").unwrap();
        assert_eq!(
            (calls[0].id.as_str(), calls[0].function.name.as_str(), calls[0].function.arguments.as_str()),
            ("call_1_0", "get_time", "{\"zone\": \"utc\"}")
        );
        for text in
            ["It is noon.", "{\"name\": \"get_time\"}", "{\"name\": \"get_time\", \"parameters\": 3}", "{\"name\": \"get_time\", \"parameters\": {}} and more"]
        {
            assert_eq!(tools.read_calls(text, "c"), None, "{text}");
        }
        let Some(Constraint::Lark(lark)) = tools.constraint() else { panic!() };
        assert!(lark.contains("\\\"parameters\\\": "), "{lark}");
        assert!(lark.contains("calls:  call \n"), "Llama 3.x takes one call a turn: {lark}");
        assert!(lark.contains("~/(?s:[ \\t\\n]*\\{.*)/"), "{lark}");
    }

    #[test]
    fn formats_are_found_from_the_template() {
        let vocab = |text: &str| (text == "<|tool_call|>" || text == "<|/tool_call|>").then(|| Marker { text: text.into(), special: Some(7) });
        let none = |_: &str| None;
        let phi4 = "{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}";
        assert!(matches!(ToolFormat::detect(phi4, false, &vocab), ToolFormat::Phi4 { .. }));
        assert_eq!(ToolFormat::detect(phi4, false, &none), ToolFormat::Hermes, "no <|tool_call|> token: Hermes in the system text");
        let llama = "<|start_header_id|>{{- '\"parameters\": ' }}";
        assert_eq!(ToolFormat::detect(llama, true, &none), ToolFormat::Llama3);
        assert_eq!(ToolFormat::detect("<tool_call>", true, &none), ToolFormat::Hermes);
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
