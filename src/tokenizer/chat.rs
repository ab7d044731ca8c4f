//! Chat templates: the GGUF's own Jinja `tokenizer.chat_template`, rendered with minijinja the
//! way Hugging Face's transformers renders it with jinja2 (`trim_blocks`, `lstrip_blocks`, the
//! globals `raise_exception` and `strftime_now`, its own `tojson`, Python's string and dict
//! methods), so that a prompt is what the model was trained on, whatever its family.
//!
//! What a template can do is found by rendering it ([`TemplateCaps`]): whether it writes the
//! `tools` it is given, an assistant message's `tool_calls` (and whether their arguments must be
//! a JSON text rather than an object), and whether it knows `<think>` reasoning blocks.

use std::sync::{Arc, Mutex};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{json, Map, Value as Json};

use super::TokenizerError;

pub(super) const IM_START: &str = "<|im_start|>";
pub(super) const IM_END: &str = "<|im_end|>";
pub(super) const START_OF_TURN: &str = "<start_of_turn>";
pub(super) const END_OF_TURN: &str = "<end_of_turn>";

/// The name the template is compiled under; errors quote it with a line number.
const TEMPLATE_NAME: &str = "chat_template";

/// The chat format a model file uses, as `info().model.chat_template` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChatFormatKind {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n` (SmolLM2, Qwen).
    ChatMl,
    /// `<start_of_turn>{user|model}\n{content}<end_of_turn>\n` (Gemma instruction-tuned files).
    Gemma,
    /// Another family's template (Llama 3, Phi, DeepSeek): rendered all the same.
    Other,
    /// No chat template: a base model, for text completion only.
    None,
}

impl ChatFormatKind {
    /// The family of a template, by the turn markers it writes. A file without a template is a
    /// base model, whatever its vocabulary holds (SmolLM2's base models share the instruct
    /// models' ChatML tokens): it completes text and does not chat.
    pub(super) fn detect(template: Option<&str>) -> ChatFormatKind {
        match template {
            Some(t) if t.contains(START_OF_TURN) => ChatFormatKind::Gemma,
            Some(t) if t.contains(IM_START) => ChatFormatKind::ChatMl,
            Some(_) => ChatFormatKind::Other,
            None => ChatFormatKind::None,
        }
    }

    /// The marker that ends a turn: generation stops on it.
    pub fn end_of_turn(self) -> Option<&'static str> {
        match self {
            ChatFormatKind::ChatMl => Some(IM_END),
            ChatFormatKind::Gemma => Some(END_OF_TURN),
            ChatFormatKind::Other | ChatFormatKind::None => None,
        }
    }

    /// The special tokens the format writes, which the vocabulary must have.
    pub(super) fn markers(self) -> &'static [&'static str] {
        match self {
            ChatFormatKind::ChatMl => &[IM_START, IM_END],
            ChatFormatKind::Gemma => &[START_OF_TURN, END_OF_TURN],
            ChatFormatKind::Other | ChatFormatKind::None => &[],
        }
    }
}

/// What one rendering takes: the variables transformers passes to a template.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatInput {
    /// OpenAI-shaped messages: `{role, content, tool_calls?, tool_call_id?, reasoning_content?}`.
    pub messages: Vec<Json>,
    /// OpenAI-shaped tools (`[{type: "function", function: {name, description, parameters}}]`),
    /// `None` when the request has none (the template then sees `tools = none`).
    pub tools: Option<Vec<Json>>,
    pub add_generation_prompt: bool,
    /// Extra variables (`chat_template_kwargs`: Qwen3's `enable_thinking`, ...). They cannot
    /// replace `messages`, `tools`, `add_generation_prompt`, `bos_token` or `eos_token`.
    pub kwargs: Map<String, Json>,
    /// The time `strftime_now` reports, in seconds since the Unix epoch (UTC); `None`: now.
    pub now: Option<i64>,
}

impl ChatInput {
    /// `messages` as a conversation of plain `{role, content}` turns.
    pub fn conversation<'a>(turns: impl IntoIterator<Item = (&'a str, &'a str)>, add_generation_prompt: bool) -> ChatInput {
        let messages = turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
        ChatInput { messages, add_generation_prompt, ..ChatInput::default() }
    }
}

/// What a template does with what it is given, found by rendering probes at load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateCaps {
    /// It writes the `tools` variable (Qwen, Llama 3.x): the tools go to the template as they are.
    pub tools: bool,
    /// It writes an assistant message's `tool_calls`.
    pub tool_calls: bool,
    /// It writes `tool_calls` only when their `arguments` are a JSON text (DeepSeek-R1's
    /// template concatenates them), not an object as transformers' callers usually pass them.
    pub string_arguments: bool,
    /// It knows `<think>` reasoning blocks (Qwen3, DeepSeek-R1 distills, SmolLM3).
    pub thinking: bool,
}

/// A compiled chat template with the special-token texts it is given.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    caps: TemplateCaps,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("caps", &self.caps).finish_non_exhaustive()
    }
}

/// The tool name the capability probes offer; nothing else writes it.
const PROBE_TOOL: &str = "pagedlm_probe_tool";
const PROBE_ARGUMENT: &str = "pagedlm_probe_argument";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts of the vocabulary's BOS and EOS
    /// tokens ("" when it has none). A template that does not parse is
    /// [`TokenizerError::Template`] with minijinja's message.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        // Built from constants, so it cannot fail; the default syntax is the fallback all the same.
        env.set_syntax(minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().unwrap_or_default());
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(|e| template_error("does not parse", &e))?;
        let mut template =
            ChatTemplate { env, source: source.to_string(), bos_token: bos_token.to_string(), eos_token: eos_token.to_string(), caps: TemplateCaps::default() };
        template.caps = template.probe();
        Ok(template)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn caps(&self) -> TemplateCaps {
        self.caps
    }

    /// Renders `input`. A template that raises (`raise_exception`) or fails is
    /// [`TokenizerError::Template`] with its message.
    pub fn render(&self, input: &ChatInput) -> Result<String, TokenizerError> {
        let raised: Arc<Mutex<Option<String>>> = Arc::default();
        let mut context: Map<String, Json> = input.kwargs.clone();
        context.insert("messages".into(), Json::Array(input.messages.clone()));
        context.insert("tools".into(), input.tools.clone().map_or(Json::Null, Json::Array));
        context.insert("add_generation_prompt".into(), Json::Bool(input.add_generation_prompt));
        context.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        context.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        let mut context: std::collections::BTreeMap<String, Value> = context.into_iter().map(|(k, v)| (k, Value::from(minijinja::value::Serde(v)))).collect();
        let sink = Arc::clone(&raised);
        context.insert(
            "raise_exception".into(),
            Value::from_function(move |message: String| -> Result<Value, Error> {
                if let Ok(mut slot) = sink.lock() {
                    slot.get_or_insert_with(|| message.clone());
                }
                Err(Error::new(ErrorKind::InvalidOperation, message))
            }),
        );
        let now = input.now.unwrap_or_else(unix_now);
        context.insert("strftime_now".into(), Value::from_function(move |format: String| strftime(&format, now)));
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| template_error("is missing", &e))?;
        template.render(Value::from(context)).map_err(|e| match raised.lock().ok().and_then(|mut slot| slot.take()) {
            Some(message) => TokenizerError::Template(format!("the model's chat template refused the conversation: {message}")),
            None => template_error("failed", &e),
        })
    }

    /// Renders probe conversations to learn [`TemplateCaps`].
    fn probe(&self) -> TemplateCaps {
        let tool = json!({"type": "function", "function": {"name": PROBE_TOOL, "description": "probe", "parameters": {"type": "object", "properties": {}}}});
        let user = json!({"role": "user", "content": "hi"});
        let renders = |input: ChatInput, needle: &str| self.render(&input).is_ok_and(|text| text.contains(needle));
        let tools = renders(ChatInput { messages: vec![user.clone()], tools: Some(vec![tool.clone()]), ..ChatInput::default() }, PROBE_TOOL);
        let call = |arguments: Json| {
            let call = json!({"id": "call_0", "type": "function", "function": {"name": PROBE_TOOL, "arguments": arguments}});
            let assistant = json!({"role": "assistant", "content": "", "tool_calls": [call]});
            let next = json!({"role": "user", "content": "ok"});
            ChatInput { messages: vec![user.clone(), assistant, next], tools: Some(vec![tool.clone()]), ..ChatInput::default() }
        };
        let object_arguments = renders(call(json!({PROBE_ARGUMENT: 1})), PROBE_ARGUMENT);
        let string_arguments = !object_arguments && renders(call(Json::String(format!("{{\"{PROBE_ARGUMENT}\": 1}}"))), PROBE_ARGUMENT);
        TemplateCaps { tools, tool_calls: object_arguments || string_arguments, string_arguments, thinking: self.source.contains("<think>") }
    }
}

fn template_error(what: &str, e: &Error) -> TokenizerError {
    TokenizerError::Template(format!("the model's chat template {what}: {e}"))
}

fn unix_now() -> i64 {
    web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)` (not minijinja's, which escapes `<`, `>`, `&`
/// and `'` for HTML, and a prompt is not HTML). Keys keep the order they came in.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a number or a string")),
        },
        None => None,
    };
    let (item, key) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s.try_iter()?.map(|p| p.as_str().map(str::to_string)).collect::<Option<_>>().unwrap_or_default();
            match parts.as_slice() {
                [item, key] => (item.clone(), key.clone()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        _ => ((if indent.is_some() { "," } else { ", " }).to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, &PythonJson { indent, item, key, sort_keys: sort_keys.unwrap_or(false) }, 0, &mut out);
    Ok(Value::from(out))
}

/// How Python's `json.dumps` lays a value out.
struct PythonJson {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

fn write_python_json(value: &Json, layout: &PythonJson, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(unit) = &layout.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(unit);
            }
        }
    };
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item);
                }
                newline(out, depth + 1);
                write_python_json(item, layout, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if layout.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item);
                }
                newline(out, depth + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(&layout.key);
                write_python_json(v, layout, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        Json::Number(n) if n.is_f64() => out.push_str(&python_float(n.as_f64().unwrap_or(0.0))),
        // Strings escape as Python's do with ensure_ascii=False: quotes, backslashes and control
        // characters only, which is serde_json's set too.
        other => out.push_str(&other.to_string()),
    }
}

/// Python's `repr` of a float as `json.dumps` writes it (`1.0`, `1e-07`, `Infinity`).
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let exponent = if x == 0.0 { 0 } else { x.abs().log10().floor() as i32 };
    if (-4..16).contains(&exponent) {
        let s = format!("{x:?}");
        if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust writes `1e-7`, Python `1e-07`: two exponent digits at least, and a sign.
        let s = format!("{x:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
        format!("{mantissa}e{sign}{digits:0>2}")
    }
}

const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Python's `datetime.strftime` for the directives chat templates use (`%d %b %Y`, `%B`,
/// `%m`, `%y`, `%a`/`%A`, `%H:%M:%S`, `%j`, `%-d`/`%-m` as glibc writes them), in UTC and the C
/// locale; any other directive is kept as written.
pub fn strftime(format: &str, unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let seconds = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (unpadded, directive) = match chars.next() {
            Some('-') => (true, chars.next()),
            other => (false, other),
        };
        let number = |n: i64, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
        match directive {
            Some('d') => out.push_str(&number(day as i64, 2)),
            Some('m') => out.push_str(&number(month as i64, 2)),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&number(year.rem_euclid(100), 2)),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('H') => out.push_str(&number(hour, 2)),
            Some('M') => out.push_str(&number(minute, 2)),
            Some('S') => out.push_str(&number(second, 2)),
            Some('j') => out.push_str(&number(day_of_year, 3)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Reads the default system prompt out of a ChatML Jinja template: the literal text of the first
/// `<|im_start|>system\n ... <|im_end|>` that contains no Jinja expression. Returns `None` for
/// templates that only render the caller's system message, and for non-ChatML templates. Tools
/// offered to a template that does not write them itself go after it.
pub fn chatml_default_system(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    template.match_indices(OPEN).find_map(|(at, _)| {
        let rest = &template[at + OPEN.len()..];
        // The role line ends either in a real newline or in a Jinja string escape.
        let rest = rest.strip_prefix('\n').or_else(|| rest.strip_prefix("\\n"))?;
        let raw = &rest[..rest.find(IM_END)?];
        let is_literal = !raw.contains("{{") && !raw.contains("{%") && !has_unescaped_quote(raw);
        is_literal.then(|| unescape_jinja(raw))
    })
}

/// A bare quote would close the Jinja string literal: the text is then an expression.
fn has_unescaped_quote(raw: &str) -> bool {
    let mut escaped = false;
    for c in raw.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' | '"' => return true,
            _ => {}
        }
    }
    false
}

fn unescape_jinja(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_writes_python_dates() {
        // 2026-01-05 13:04:09 UTC, a Monday.
        let t = days_from_civil(2026, 1, 5) * 86_400 + 13 * 3600 + 4 * 60 + 9;
        assert_eq!(strftime("%d %b %Y", t), "05 Jan 2026");
        assert_eq!(strftime("%A %B %-d, %y %H:%M:%S %j %% %Q", t), "Monday January 5, 26 13:04:09 005 % %Q");
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(strftime("%a %d %m %Y", 0), "Thu 01 01 1970");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let env = {
            let mut env = Environment::new();
            env.add_filter("tojson", tojson);
            env
        };
        let value = json!({"b": [1, 2.5, "x<y>&'\"\n"], "a": {}, "c": 1.0, "d": 1e-7, "e": null, "f": true});
        let render = |t: &str| env.render_str(t, minijinja::context! { v => Value::from(minijinja::value::Serde(&value)) }).unwrap();
        assert_eq!(render("{{ v | tojson }}"), r#"{"b": [1, 2.5, "x<y>&'\"\n"], "a": {}, "c": 1.0, "d": 1e-07, "e": null, "f": true}"#);
        assert_eq!(render("{{ v.b | tojson(indent=2) }}"), "[\n  1,\n  2.5,\n  \"x<y>&'\\\"\\n\"\n]");
        assert_eq!(
            render("{{ v | tojson(sort_keys=true, separators=[',', ':']) }}"),
            r#"{"a":{},"b":[1,2.5,"x<y>&'\"\n"],"c":1.0,"d":1e-07,"e":null,"f":true}"#
        );
    }

    #[test]
    fn raise_exception_is_the_templates_message_and_syntax_errors_are_typed() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = t.render(&ChatInput::conversation([("user", "hi")], true)).unwrap_err();
        assert_eq!(e.to_string(), "the model's chat template refused the conversation: no system role");
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TokenizerError::Template(_))));
        let t = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}", "", "").unwrap();
        assert!(matches!(t.render(&ChatInput::conversation([("user", "hi")], true)), Err(TokenizerError::Template(m)) if m.contains("failed")));
    }
}
