//! Chat formats: which family a GGUF's `tokenizer.chat_template` belongs to (the Jinja source
//! is inspected, never executed) and rendering a conversation in it.

use super::{ChatMessage, TokenizerError};

pub(super) const IM_START: &str = "<|im_start|>";
pub(super) const IM_END: &str = "<|im_end|>";
pub(super) const START_OF_TURN: &str = "<start_of_turn>";
pub(super) const END_OF_TURN: &str = "<end_of_turn>";

/// The chat format a model file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChatFormatKind {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n` (SmolLM2, Qwen).
    ChatMl,
    /// `<start_of_turn>{user|model}\n{content}<end_of_turn>\n` (Gemma instruction-tuned files).
    Gemma,
    /// No chat template: a base model, for text completion only.
    None,
}

impl ChatFormatKind {
    /// The format of a template: Gemma's turn markers, else ChatML's. A file without a
    /// template is a base model, whatever its vocabulary holds (SmolLM2's base models share the
    /// instruct models' ChatML tokens): it completes text and does not chat. A template of
    /// another family is rendered as plain ChatML.
    pub(super) fn detect(template: Option<&str>) -> ChatFormatKind {
        match template {
            Some(t) if t.contains(START_OF_TURN) => ChatFormatKind::Gemma,
            Some(_) => ChatFormatKind::ChatMl,
            None => ChatFormatKind::None,
        }
    }

    /// The marker that ends a turn: generation stops on it.
    pub fn end_of_turn(self) -> Option<&'static str> {
        match self {
            ChatFormatKind::ChatMl => Some(IM_END),
            ChatFormatKind::Gemma => Some(END_OF_TURN),
            ChatFormatKind::None => None,
        }
    }

    /// The special tokens the format writes, which the vocabulary must have.
    pub(super) fn markers(self) -> &'static [&'static str] {
        match self {
            ChatFormatKind::ChatMl => &[IM_START, IM_END],
            ChatFormatKind::Gemma => &[START_OF_TURN, END_OF_TURN],
            ChatFormatKind::None => &[],
        }
    }
}

/// ChatML: the default system turn when `messages` does not start with a system message, a
/// turn per message, then `<|im_start|>assistant\n` when `add_generation_prompt`.
pub(super) fn render_chatml(messages: &[ChatMessage], default_system: Option<&str>, add_generation_prompt: bool) -> String {
    let mut prompt = String::new();
    let mut turn = |role: &str, content: &str| {
        prompt.push_str(IM_START);
        prompt.push_str(role);
        prompt.push('\n');
        prompt.push_str(content);
        prompt.push_str(IM_END);
        prompt.push('\n');
    };
    let starts_with_system = messages.first().is_some_and(|m| m.role == "system");
    if let (false, Some(system)) = (starts_with_system, default_system) {
        turn("system", system);
    }
    for message in messages {
        turn(&message.role, &message.content);
    }
    if add_generation_prompt {
        prompt.push_str(IM_START);
        prompt.push_str("assistant\n");
    }
    prompt
}

/// Gemma 3's template: a leading system message becomes the first turn's prefix
/// (`{system}\n\n`), turns must alternate user/assistant starting with user, `assistant` is
/// written `model`, contents are trimmed, and the generation prompt is `<start_of_turn>model\n`.
/// The template's leading `{{ bos_token }}` is not written: BOS is added as an id
/// ([`super::Tokenizer::encode_prompt`]), never as text.
pub(super) fn render_gemma(messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
    let (prefix, turns) = match messages.split_first() {
        Some((first, rest)) if first.role == "system" => (format!("{}\n\n", first.content), rest),
        _ => (String::new(), messages),
    };
    let mut prompt = String::new();
    for (index, message) in turns.iter().enumerate() {
        if (message.role == "user") != (index % 2 == 0) {
            return Err(TokenizerError::ChatRoles { index, role: message.role.clone() });
        }
        let role = if message.role == "assistant" { "model" } else { &message.role };
        prompt.push_str(START_OF_TURN);
        prompt.push_str(role);
        prompt.push('\n');
        if index == 0 {
            prompt.push_str(&prefix);
        }
        prompt.push_str(message.content.trim());
        prompt.push_str(END_OF_TURN);
        prompt.push('\n');
    }
    if add_generation_prompt {
        prompt.push_str(START_OF_TURN);
        prompt.push_str("model\n");
    }
    Ok(prompt)
}

/// Reads the default system prompt out of a ChatML Jinja template: the literal text of the first
/// `<|im_start|>system\n ... <|im_end|>` that contains no Jinja expression. Returns `None` for
/// templates that only render the caller's system message, and for non-ChatML templates.
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
