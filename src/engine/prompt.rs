//! Prompts: chat messages rendered with the model's chat template, OpenAI-style requests with
//! their tools, and raw text, tokenized.

use serde_json::{Map, Value};

use crate::constraint::Marker;
use crate::error::EngineError;
use crate::reasoning::Reasoning;
use crate::request::GenerateRequest;
use crate::tokenizer::{ChatInput, ChatMessage, Tokenizer, TokenizerError};
use crate::tools::{Message, TemplateStyle, ToolFormat, Tools};

use super::Engine;

impl Engine {
    /// Renders chat messages with the model's template and the assistant's generation prompt,
    /// and tokenizes them: the prompt of the next reply.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.render(messages, true)
    }

    /// The prompt of an OpenAI-style chat request: `messages` (which may hold tool calls and
    /// tool results) with `tools` offered, rendered with the chat template and the generation
    /// prompt ([`crate::tools::template_input`]). [`Self::prepare_chat`] also sets what the
    /// request needs to read the reply (the family's tool format, reasoning) and passes its
    /// template kwargs.
    pub fn openai_chat_prompt(&self, messages: &[Message], tools: Option<&Tools>) -> Result<Vec<u32>, EngineError> {
        let mut request = GenerateRequest { tools: tools.cloned(), ..GenerateRequest::default() };
        self.prepare_chat(messages, &mut request)
    }

    /// The prompt of an OpenAI-style chat request and the request made ready to read its reply:
    /// `messages` and the request's tools rendered with the chat template, its
    /// `chat_template_kwargs` and the generation prompt; the tools' [`ToolFormat`] set to the
    /// template's family's, and [`GenerateRequest::reasoning`] set when the template reasons
    /// and the prompt leaves the reasoning open (see [`crate::reasoning`]).
    pub fn prepare_chat(&self, messages: &[Message], request: &mut GenerateRequest) -> Result<Vec<u32>, EngineError> {
        let text = prepare_chat(&self.tokenizer, messages, request)?;
        self.text_prompt(&text)
    }

    /// The ids of an OpenAI-style conversation so far, as [`Self::history_tokens`] (no tools
    /// offered, no generation prompt).
    pub fn openai_history_tokens(&self, messages: &[Message], chat_template_kwargs: &Map<String, Value>) -> Result<Vec<u32>, EngineError> {
        let style = template_style(&self.tokenizer)?;
        let (messages, _) = crate::tools::template_input(messages, None, &style)?;
        let input = ChatInput { messages, add_generation_prompt: false, kwargs: chat_template_kwargs.clone(), ..ChatInput::default() };
        self.text_prompt(&self.tokenizer.render_chat(&input)?)
    }

    /// The ids of a conversation so far (its messages rendered without the generation prompt):
    /// a later prompt of these messages plus a new turn begins with exactly these ids, so they
    /// are what a snapshot of the conversation keeps.
    pub fn history_tokens(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.render(messages, false)
    }

    /// The prompt of a text completion: the text's ids, after BOS when the model file asks for
    /// it (Gemma), exactly as a chat prompt starts.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode_prompt(text)?)
    }

    fn render(&self, messages: &[ChatMessage], generation_prompt: bool) -> Result<Vec<u32>, EngineError> {
        let text = self.tokenizer.apply_chat_template(messages, generation_prompt)?;
        self.text_prompt(&text)
    }
}

/// [`Engine::prepare_chat`] on a tokenizer alone: the rendered prompt text.
pub fn prepare_chat(tokenizer: &Tokenizer, messages: &[Message], request: &mut GenerateRequest) -> Result<String, EngineError> {
    let style = template_style(tokenizer)?;
    if let Some(tools) = &mut request.tools {
        tools.format = style.format.clone();
    }
    let (messages, tools) = crate::tools::template_input(messages, request.tools.as_ref(), &style)?;
    let input = ChatInput { messages, tools, add_generation_prompt: true, kwargs: request.chat_template_kwargs.clone(), now: None };
    let text = tokenizer.render_chat(&input)?;
    request.reasoning = match tokenizer.chat_template() {
        Some(t) if t.caps().thinking => Reasoning::of_prompt(&text, marker(tokenizer, "<think>"), marker(tokenizer, "</think>")),
        _ => None,
    };
    Ok(text)
}

/// What the model's template does with tools ([`TemplateStyle`]); a model without a usable
/// template fails here as rendering would.
fn template_style(tokenizer: &Tokenizer) -> Result<TemplateStyle, EngineError> {
    let Some(template) = tokenizer.chat_template() else {
        // No template, or one that does not compile: the error rendering gives.
        return Err(tokenizer.render_chat(&ChatInput::default()).err().unwrap_or(TokenizerError::NoChatTemplate).into());
    };
    let caps = template.caps();
    let format = ToolFormat::detect(template.source(), caps.tools, &|text| tokenizer.token_to_id(text).map(|_| marker(tokenizer, text)));
    Ok(TemplateStyle {
        native: caps.tools && caps.tool_calls,
        string_arguments: caps.string_arguments,
        format,
        default_system: tokenizer.default_system_prompt().map(str::to_string),
    })
}

/// `text` as the vocabulary holds it: one special token, matched by id, or text.
fn marker(tokenizer: &Tokenizer, text: &str) -> Marker {
    let special = tokenizer.token_to_id(text).filter(|&id| tokenizer.is_special(id));
    Marker { text: text.to_string(), special }
}
