//! Reasoning replies: what a reasoning model (Qwen3, DeepSeek-R1 distills, SmolLM3) writes
//! between its think markers is returned apart from the answer, as `reasoning_content` (the field
//! vLLM, SGLang and llama.cpp's server use), and a constraint on the output applies after the
//! block ([`Reasoning::constraint`]).
//!
//! The block is either opened by the prompt (DeepSeek-R1's generation prompt ends with
//! `<think>\n`: the reply starts inside it) or by the reply itself (Qwen3 writes `<think>` first);
//! a prompt that closes it (`enable_thinking: false` writes `<think>\n\n</think>\n\n`) has no
//! reasoning to split. Blanks around the reasoning and before the answer are dropped.

use crate::constraint::{Constraint, Marker};

/// How a request's reply reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reasoning {
    pub open: Marker,
    pub close: Marker,
    /// The prompt opened the block: the reply starts inside it.
    pub starts_inside: bool,
}

impl Reasoning {
    /// The reasoning of a prompt rendered by a template that knows think markers: `None` when
    /// the prompt closed the block already (thinking is off), else where the reply starts.
    pub fn of_prompt(prompt: &str, open: Marker, close: Marker) -> Option<Reasoning> {
        let tail = prompt.trim_end();
        if tail.ends_with(close.text.as_str()) {
            return None;
        }
        let starts_inside = tail.ends_with(open.text.as_str());
        Some(Reasoning { open, close, starts_inside })
    }

    /// `body` applied after the reasoning block.
    pub fn constraint(&self, body: Constraint) -> Constraint {
        let open = (!self.starts_inside).then(|| self.open.clone());
        Constraint::AfterReasoning { open, close: self.close.clone(), body: Box::new(body) }
    }

    /// A splitter of the reply's text as it streams.
    pub fn splitter(&self) -> ReasoningSplitter {
        ReasoningSplitter {
            open: self.open.text.clone(),
            close: self.close.text.clone(),
            state: if self.starts_inside { State::Inside } else { State::Before },
            pending: String::new(),
            opened: self.starts_inside,
        }
    }

    /// A whole reply split into its reasoning (`None` when it has none) and its answer.
    pub fn split(&self, reply: &str) -> (Option<String>, String) {
        let mut splitter = self.splitter();
        let (mut reasoning, mut content) = splitter.push(reply);
        let (r, c) = splitter.finish();
        reasoning.push_str(&r);
        content.push_str(&c);
        (splitter.had_reasoning().then_some(reasoning), content)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but blanks yet: the reply may still open a block.
    Before,
    /// Inside the block, past its leading blanks or not.
    Inside,
    InsideText,
    /// Past the block: blanks before the answer are dropped.
    After,
    /// In the answer.
    Answer,
}

/// Splits streamed text into reasoning and answer, holding back what may still be the start of
/// a marker (or blanks that may end the reasoning), so that the deltas add up to the
/// [`Reasoning::split`] of the whole.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    open: String,
    close: String,
    state: State,
    pending: String,
    /// The reply is (or was) in a reasoning block.
    opened: bool,
}

impl ReasoningSplitter {
    /// Takes the next piece of text; returns the reasoning and the answer it completes.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        self.pending.push_str(piece);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Before => {
                    let start = self.pending.trim_start();
                    if let Some(rest) = start.strip_prefix(self.open.as_str()) {
                        self.pending = rest.to_string();
                        self.state = State::Inside;
                        self.opened = true;
                    } else if self.open.starts_with(start) {
                        // Blanks, or the start of the opening marker: wait.
                        return (reasoning, content);
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Inside => {
                    let start = self.pending.trim_start();
                    if start.is_empty() {
                        return (reasoning, content);
                    }
                    self.pending = start.to_string();
                    self.state = State::InsideText;
                }
                State::InsideText => match self.pending.find(self.close.as_str()) {
                    Some(at) => {
                        reasoning.push_str(self.pending[..at].trim_end());
                        self.pending = self.pending[at + self.close.len()..].to_string();
                        self.state = State::After;
                    }
                    None => {
                        // Hold back blanks at the end and what may be the start of the close.
                        let keep = partial_suffix(&self.pending, &self.close);
                        let text = &self.pending[..self.pending.len() - keep];
                        let shown = text.trim_end().len();
                        reasoning.push_str(&self.pending[..shown]);
                        self.pending = self.pending[shown..].to_string();
                        return (reasoning, content);
                    }
                },
                State::After => {
                    let start = self.pending.trim_start();
                    if start.is_empty() {
                        self.pending.clear();
                        return (reasoning, content);
                    }
                    self.pending = start.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    content.push_str(&self.pending);
                    self.pending.clear();
                    return (reasoning, content);
                }
            }
        }
    }

    /// The end of the reply: what was held back. A block that never closed is all reasoning
    /// (the reply was cut short while thinking).
    pub fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Inside | State::InsideText => (rest.trim_end().to_string(), String::new()),
            State::Before | State::Answer => (String::new(), rest),
            State::After => (String::new(), String::new()),
        }
    }

    /// Whether the reply opened (or started in) a reasoning block.
    pub fn had_reasoning(&self) -> bool {
        self.opened
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.as_bytes().starts_with(&text.as_bytes()[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen(starts_inside: bool) -> Reasoning {
        Reasoning { open: Marker::text("<think>"), close: Marker::text("</think>"), starts_inside }
    }

    #[test]
    fn splits_whole_replies() {
        let r = qwen(false);
        assert_eq!(r.split("<think>\nTwo plus two.\n</think>\n\n4"), (Some("Two plus two.".into()), "4".into()));
        assert_eq!(r.split("  4 is the answer"), (None, "  4 is the answer".into()));
        assert_eq!(r.split("<think>\nstill thinking"), (Some("still thinking".into()), String::new()));
        assert_eq!(r.split("<thin"), (None, "<thin".into()));
        let r1 = qwen(true);
        assert_eq!(r1.split("Okay, so.\n</think>\n\n{\"a\": 1}"), (Some("Okay, so.".into()), "{\"a\": 1}".into()));
        assert_eq!(r1.split("</think>answer"), (Some(String::new()), "answer".into()));
    }

    #[test]
    fn streamed_pieces_add_up_to_the_split_of_the_whole() {
        let reply = "<think>\nFirst, 2 + 2.\n\nThat is 4.  \n</think>\n\nIt is **4**.";
        for r in [qwen(false), qwen(true)] {
            let reply = if r.starts_inside { &reply["<think>".len()..] } else { reply };
            let (want_reasoning, want_content) = r.split(reply);
            // Every way of cutting it into pieces of 1..=4 bytes (on character boundaries).
            for width in 1..=4 {
                let mut s = r.splitter();
                let (mut reasoning, mut content) = (String::new(), String::new());
                let mut at = 0;
                while at < reply.len() {
                    let end = (at + width).min(reply.len());
                    let (dr, dc) = s.push(&reply[at..end]);
                    assert!(dc.is_empty() || !reasoning.is_empty() || want_reasoning.as_deref() == Some(""), "answer before reasoning");
                    reasoning.push_str(&dr);
                    content.push_str(&dc);
                    at = end;
                }
                let (dr, dc) = s.finish();
                reasoning.push_str(&dr);
                content.push_str(&dc);
                assert_eq!(Some(reasoning), want_reasoning, "width {width}");
                assert_eq!(content, want_content, "width {width}");
            }
        }
        assert_eq!(qwen(false).split(reply), (Some("First, 2 + 2.\n\nThat is 4.".into()), "It is **4**.".into()));
    }

    #[test]
    fn a_prompt_that_closed_the_block_has_no_reasoning() {
        let (open, close) = (Marker::text("<think>"), Marker::text("</think>"));
        assert_eq!(Reasoning::of_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n", open.clone(), close.clone()), None);
        assert!(Reasoning::of_prompt("<｜Assistant｜><think>\n", open.clone(), close.clone()).unwrap().starts_inside);
        assert!(!Reasoning::of_prompt("<|im_start|>assistant\n", open, close).unwrap().starts_inside);
    }
}
