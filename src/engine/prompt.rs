//! Prompts: chat messages rendered with the model's chat template, OpenAI-style requests with
//! their tools, and raw text, tokenized.

use crate::error::EngineError;
use crate::tokenizer::ChatMessage;
use crate::tools::{Message, Tools};

use super::Engine;

impl Engine {
    /// Renders chat messages with the model's template and the assistant's generation prompt,
    /// and tokenizes them: the prompt of the next reply.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.render(messages, true)
    }

    /// The prompt of an OpenAI-style chat request: `messages` (which may hold tool calls and
    /// tool results) with `tools`' section in the system turn when they are offered, rendered
    /// with the chat template and the generation prompt ([`crate::tools::chat_messages`]).
    pub fn openai_chat_prompt(&self, messages: &[Message], tools: Option<&Tools>) -> Result<Vec<u32>, EngineError> {
        self.chat_prompt(&self.openai_messages(messages, tools)?)
    }

    /// `messages` as the chat template takes them ([`crate::tools::chat_messages`], with this
    /// model's default system prompt).
    pub fn openai_messages(&self, messages: &[Message], tools: Option<&Tools>) -> Result<Vec<ChatMessage>, EngineError> {
        Ok(crate::tools::chat_messages(messages, tools, self.tokenizer.default_system_prompt())?)
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
