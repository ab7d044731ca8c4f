//! A request's life as the caller sees it: its parameters, its handle, the events a step
//! reports about it and the record of its end.

use crate::constraint::{Constrained, Constraint};
use crate::error::EngineError;
use crate::kv::SeqId;
use crate::reasoning::{Reasoning, ReasoningSplitter};
use crate::sampler::{Sampler, SamplingParams, MAX_REPETITION_WINDOW};
use crate::speculate::{Drafter, Speculative};
use crate::time::now_ms;
use crate::tokenizer::StreamDecoder;
use crate::tools::{ToolCall, Tools};

/// A request's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RequestId(pub u64);

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// The reply is calls of the request's tools ([`Generation::tool_calls`]).
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

/// A generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    /// Text that ends the generation (the stop string itself is not part of the output).
    pub stop: Vec<String>,
    /// Keep generating through end-of-generation tokens (for benchmarks).
    pub ignore_eos: bool,
    /// What the output must match (JSON Schema, a grammar): each step's tokens are chosen among
    /// those it allows, and the generation ends when it is complete ([`crate::constraint`]).
    pub constraint: Option<Constraint>,
    /// Functions the model may call ([`crate::tools`]): their grammar constrains the reply (with
    /// `constraint`, they are refused), and a reply of calls ends with
    /// [`FinishReason::ToolCalls`]. The prompt must offer them ([`crate::tools::template_input`]).
    pub tools: Option<Tools>,
    /// Extra variables for the chat template of a chat request's prompt (OpenAI-style APIs'
    /// `chat_template_kwargs`: Qwen3's `enable_thinking`, ...).
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// How the reply reasons, for a reasoning model's chat (set by the engine with the prompt,
    /// in `prepare_chat`): its reasoning block is returned apart
    /// ([`Generation::reasoning_content`], [`Event::Token`]'s `reasoning`) and the constraint
    /// applies after it.
    pub reasoning: Option<Reasoning>,
    /// Whether this request drafts ([`crate::speculate`]); `None`: the engine's choice
    /// (`SchedConfig::speculative`).
    pub speculative: Option<Speculative>,
    /// Most draft tokens per step; `None`: the engine's (`SchedConfig::max_draft`).
    pub max_draft: Option<u32>,
    /// What the output is expected to be (OpenAI's predicted outputs): drafted from first,
    /// followed along as the output advances.
    pub prediction: Option<Prediction>,
}

/// A request's predicted output: text (tokenized as text that follows the prompt, without
/// special tokens) or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prediction {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prediction {
    /// OpenAI's `prediction` (the CLI's items and the package take it as is): `{type: "content",
    /// content}` with `content` a string or text parts `[{type: "text", text}]` (joined); `null`
    /// is none. Anything else is refused with what is expected.
    pub fn from_openai(value: &serde_json::Value) -> Result<Option<Prediction>, String> {
        let text = |part: &serde_json::Value| match (part.get("type").and_then(|t| t.as_str()), part.get("text").and_then(|t| t.as_str())) {
            (Some("text"), Some(text)) => Some(text.to_string()),
            _ => None,
        };
        let content = match value.get("content") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(parts)) => parts.iter().map(text).collect::<Option<Vec<String>>>().map(|t| t.concat()),
            _ => None,
        };
        match (value, value.get("type").and_then(|t| t.as_str()), content) {
            (serde_json::Value::Null, _, _) => Ok(None),
            (_, Some("content"), Some(content)) => Ok(Some(Prediction::Text(content))),
            _ => Err("prediction must be {\"type\": \"content\", \"content\": a string or [{\"type\": \"text\", \"text\": ...}]}".into()),
        }
    }
}

impl GenerateRequest {
    /// The constraint its output follows: `constraint`, or its tools' grammar; after the
    /// reasoning block when the reply reasons.
    pub fn output_constraint(&self) -> Result<Option<Constraint>, crate::constraint::ConstraintError> {
        let constraint = match (&self.constraint, &self.tools) {
            (Some(_), Some(t)) if t.offered() => {
                return Err(crate::constraint::ConstraintError::Invalid("tools cannot be combined with response_format or a grammar: give one".into()))
            }
            (Some(c), _) => Some(c.clone()),
            (None, Some(t)) => t.constraint(),
            (None, None) => None,
        };
        Ok(match (constraint, &self.reasoning) {
            (Some(c), Some(r)) => Some(r.constraint(c)),
            (c, _) => c,
        })
    }
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            max_tokens: 128,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            constraint: None,
            tools: None,
            chat_template_kwargs: serde_json::Map::new(),
            reasoning: None,
            speculative: None,
            max_draft: None,
            prediction: None,
        }
    }
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// How a request handles its tokens: its sampler, its streaming decoder, its constraint's
/// matcher, if any, and its drafter.
pub(crate) struct Handling {
    pub sampler: Sampler,
    pub decoder: StreamDecoder,
    pub constrained: Option<Constrained>,
    pub drafter: Drafter,
}

/// One generated token as streamed to the caller.
pub struct TokenEvent<'a> {
    pub id: u32,
    /// Text completed by this token (may be empty while a UTF-8 character is incomplete); for a
    /// reasoning reply, the answer's text only.
    pub text: &'a str,
    /// Reasoning completed by this token (empty unless the reply reasons).
    pub reasoning: &'a str,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    /// The reply; for a reasoning reply, its answer (what follows the reasoning block).
    pub text: String,
    /// The reasoning block of a reasoning reply (the text between the think markers, without
    /// them and the blanks around it); absent when the reply has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    pub finish_reason: FinishReason,
    /// Prompt tokens whose K/V came from the prefix cache.
    pub prefix_hit_tokens: u32,
    /// Prompt tokens computed (`prompt_tokens.len() - prefix_hit_tokens`).
    pub prefill_tokens: u32,
    /// From the call to the first generated token.
    pub ttft_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// The physical KV blocks the request's sequence held at its end, in order (the prefix
    /// cache keeps them for the next turn until evicted).
    pub blocks: Vec<u32>,
    /// Draft tokens (speculative decoding: a prediction's or prompt lookup's) that the output
    /// took, and those it did not (OpenAI's `accepted_prediction_tokens`,
    /// `rejected_prediction_tokens`).
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
    /// Set when a constrained generation ended before its output was complete (at
    /// `max_tokens`, the context limit, a stop string or an abort): the text does not match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// The calls a reply of tool calls holds (`finish_reason` is then `tool_calls`; `text` keeps
    /// the reply as the model wrote it). Call ids are `call_{request id}_{k}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// Something that happened to a request during a step.
#[derive(Debug)]
pub enum Event {
    /// The scheduler admitted the request for the first time: its prompt's K/V are being
    /// computed from now on, `prefix_hit_tokens` of them came from the prefix cache.
    Admitted { id: RequestId, prompt_tokens: u32, prefix_hit_tokens: u32 },
    /// A generated token and the text it completes: `reasoning` what it adds to a reasoning
    /// block, `text` what it adds to the reply (its answer, for a reasoning reply).
    Token { id: RequestId, token: u32, text: String, reasoning: String },
    /// The request ended: its generation, or the error that ended it.
    Finished { id: RequestId, result: Result<Generation, EngineError> },
}

/// A logit row that samples: the request's parameters, the draw's counter (the position
/// predicted, so that a recomputed step draws the same token) and the penalty window to write to
/// its sequence's ring first (`None`: the ring as the step before left it, with that step's token
/// appended on the GPU: a step planned ahead).
#[derive(Clone, Debug)]
pub(crate) struct RowSampling {
    pub params: SamplingParams,
    pub counter: u32,
    pub window: Option<Vec<u32>>,
    /// Its tokens are masked by the request's constraint: the mask is the one its matcher
    /// holds when the step chooses ([`Request::mask`]), which for a step planned ahead is after
    /// the step before commits.
    pub constrained: bool,
    /// In a verification step: how many of the window's last tokens (the draft tokens after
    /// this row's) it must not see. Such a row's window (its first row's) holds the draft, and
    /// no row appends its token to the ring.
    pub hidden: Option<u32>,
}

/// What a request did with a token it was given ([`Request::accept`]).
#[derive(Debug, Default)]
pub(crate) struct Accepted {
    /// The token, the text it completes and the reasoning it completes, to stream to the caller.
    pub token: Option<(u32, String, String)>,
    /// Set when the request ends with this token.
    pub finish: Option<FinishReason>,
    /// Set when the request fails with this token (its constraint's matcher failed).
    pub failure: Option<EngineError>,
}

/// A request as the scheduler holds it: the caller's prompt and parameters, the per-request token
/// handling (sampling, end-of-generation, stop strings, the token limit, streaming decode) and
/// where it stands. The scheduling fields are the scheduler's; everything about tokens changes
/// only through [`Request::accept`].
pub(crate) struct Request {
    pub id: RequestId,
    prompt: Vec<u32>,
    params: GenerateRequest,
    sampler: Sampler,
    decoder: StreamDecoder,
    /// The constraint's matcher, past every generated token (its mask is the next token's).
    constrained: Option<Constrained>,
    /// Splits a reasoning reply's text as it streams.
    splitter: Option<ReasoningSplitter>,
    /// Tokens generated so far (streamed to the caller).
    generated: Vec<u32>,
    /// The reply as the model wrote it (reasoning block included).
    text: String,
    /// The sequence while running.
    pub seq: Option<SeqId>,
    /// Tokens of `prompt ++ generated` whose K/V the sequence holds.
    pub computed: u32,
    /// The prefix-cache hit at first admission (what the caller sees as `prefix_hit_tokens`).
    first_hit: Option<u32>,
    submitted_ms: f64,
    first_token_ms: Option<f64>,
    prefill_done_ms: Option<f64>,
    /// Step at which it joined the queue (again) and at which it was last admitted.
    pub enqueued_step: u64,
    pub admitted_step: u64,
    /// The next token, sampled and streamed but not yet fed to the model.
    pending: Option<u32>,
    drafter: Drafter,
    /// The rows it got in the step planned last: their first position and the draft after its
    /// next token's row ([`Request::in_flight`]).
    planned: Option<(u32, Vec<u32>)>,
}

impl Request {
    pub fn new(id: RequestId, prompt: Vec<u32>, params: GenerateRequest, handling: Handling, step: u64) -> Request {
        let mut r = Request {
            id,
            prompt,
            splitter: params.reasoning.as_ref().map(Reasoning::splitter),
            params,
            sampler: handling.sampler,
            decoder: handling.decoder,
            constrained: handling.constrained,
            generated: Vec::new(),
            text: String::new(),
            seq: None,
            computed: 0,
            first_hit: None,
            submitted_ms: now_ms(),
            first_token_ms: None,
            prefill_done_ms: None,
            enqueued_step: step,
            admitted_step: 0,
            pending: None,
            drafter: handling.drafter,
            planned: None,
        };
        // A paused drafter probes only where drafting never holds a step back (see
        // `Request::drafts_ahead`): a constrained or penalized sequence that may draft gets no
        // step planned ahead.
        r.drafter.probe = r.drafts_ahead();
        r
    }

    /// Every token of the sequence: the prompt, then what was generated.
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.prompt.clone();
        t.extend(&self.generated);
        t
    }

    /// The token at position `p` of the sequence (prompt, then generated).
    pub fn token_at(&self, p: u32) -> u32 {
        let p = p as usize;
        self.prompt.get(p).copied().unwrap_or_else(|| self.generated[p - self.prompt.len()])
    }

    /// Tokens the sequence must hold before it can produce its next token: the prompt and every
    /// generated token except the pending one, which the next decode row feeds.
    pub fn context_len(&self) -> u32 {
        (self.prompt.len() + self.generated.len()) as u32 - self.pending.is_some() as u32
    }

    /// The first `n` tokens of the context.
    pub fn context(&self, n: usize) -> impl Iterator<Item = &u32> {
        self.prompt.iter().chain(&self.generated).take(n.min(self.context_len() as usize))
    }

    /// The tokens whose cached prefix admission looks up: the context but its last token,
    /// which is always computed (see [`crate::kv::KvCache::allocate_for_prompt`]).
    pub fn cache_probe(&self) -> Vec<u32> {
        let n = (self.context_len() as usize).saturating_sub(1).max(1);
        self.prompt.iter().chain(&self.generated).take(n).copied().collect()
    }

    /// Still reading its prompt (or, after a preemption, its prompt and earlier output).
    pub fn in_prefill(&self) -> bool {
        self.computed < self.context_len()
    }

    /// The token its next decode row feeds, once its context is computed.
    pub fn pending(&self) -> Option<u32> {
        self.pending
    }

    /// How its logit row predicting position `counter` chooses the token: `None` for greedy
    /// without a penalty; else its parameters and, with `write_window`, the penalty window (the
    /// last `repetition_window` tokens of the sequence; none without a penalty).
    pub fn row_sampling(&self, counter: u32, write_window: bool) -> Option<RowSampling> {
        let params = self.sampler.params();
        let constrained = self.constrained.is_some();
        if params.is_greedy() && !constrained {
            return None;
        }
        let window = write_window.then(|| {
            if params.repetition_penalty == 1.0 {
                return Vec::new();
            }
            let all = self.tokens();
            all[all.len().saturating_sub(params.repetition_window as usize)..].to_vec()
        });
        Some(RowSampling { params: params.clone(), counter, window, constrained, hidden: None })
    }

    /// The draft to verify with its next decode row, at most `limit` tokens (none for a request
    /// that does not draft, or whose penalty ring could not hold its window and the draft), and
    /// for a constrained request the masks of the rows after each draft token, the draft cut
    /// where its constraint forbids a token ([`Constrained::draft_masks`]).
    pub fn draft(&mut self, limit: u32) -> (Vec<u32>, Vec<Vec<u32>>) {
        let params = self.sampler.params();
        let penalty_room = if params.repetition_penalty == 1.0 { limit } else { MAX_REPETITION_WINDOW.saturating_sub(params.repetition_window) };
        if !self.drafter.may_draft() {
            return (Vec::new(), Vec::new());
        }
        let left = (self.params.max_tokens as usize).saturating_sub(self.generated.len() + 1) as u32;
        let limit = limit.min(penalty_room).min(left);
        let mut draft = self.drafter.propose(&self.tokens(), limit);
        let mut masks = Vec::new();
        if let Some(c) = &mut self.constrained {
            masks = c.draft_masks(&draft);
            draft.truncate(masks.len());
        }
        let n = crate::speculate::quantize_draft(draft.len() as u32) as usize;
        draft.truncate(n);
        masks.truncate(n);
        (draft, masks)
    }

    /// Whether it may draft at its next step.
    pub fn drafting(&self) -> bool {
        self.drafter.may_draft()
    }

    /// The sampling of a verification step's rows: its decode row at `position` and the rows of
    /// `draft`, each predicting the position after its token, the first writing the penalty
    /// window with the draft to the ring and each seeing the ring up to its own token.
    pub fn draft_sampling(&self, position: u32, draft: &[u32]) -> Vec<Option<RowSampling>> {
        let k = draft.len() as u32;
        (0..=k)
            .map(|i| {
                let mut s = self.row_sampling(position + 1 + i, i == 0)?;
                if let Some(window) = &mut s.window {
                    if !window.is_empty() {
                        window.extend(draft);
                        let keep = (self.sampler.params().repetition_window + k) as usize;
                        window.drain(..window.len().saturating_sub(keep));
                    }
                }
                s.hidden = Some(k - i);
                Some(s)
            })
            .collect()
    }

    /// Notes the rows it got in the step just planned: from `position`, its next token's, then
    /// `draft`'s.
    pub fn planned(&mut self, position: u32, draft: &[u32]) {
        self.planned = Some((position, draft.to_vec()));
    }

    /// The draft of its rows in the step in flight when those rows start where its computed K/V
    /// end (their tokens are still to come), else `None`: it has no rows in flight, or they were
    /// planned past a draft that was not taken whole and will be discarded.
    pub fn in_flight(&self) -> Option<&[u32]> {
        self.planned.as_ref().filter(|(position, _)| *position == self.computed).map(|(_, draft)| draft.as_slice())
    }

    /// Whether the draft its rows in flight verify is likely taken whole (see
    /// [`crate::speculate::Drafter::confident`]), so that rows planned past it are likely kept.
    pub fn confident(&self) -> bool {
        self.drafter.confident()
    }

    /// Whether it may draft in a step planned ahead of its rows in flight: its draft rows'
    /// choice needs nothing the CPU learns from those rows (no constraint, whose masks follow
    /// the tokens; no penalty, whose window would hold them).
    pub fn drafts_ahead(&self) -> bool {
        self.constrained.is_none() && self.sampler.params().repetition_penalty == 1.0
    }

    /// The draft for a step planned ahead of its rows in flight, which verify `flight`: made as
    /// if that draft is taken whole and the token after it is the drafter's own guess (a wrong
    /// guess only costs the draft), at most `limit` tokens; cut as [`Request::draft`] cuts.
    pub fn draft_ahead(&self, flight: &[u32], limit: u32) -> Vec<u32> {
        if !self.drafter.may_draft() || !self.drafts_ahead() {
            return Vec::new();
        }
        // The rows in flight give `flight.len() + 1` tokens when the draft is taken whole.
        let after = self.generated.len() + flight.len() + 2;
        let limit = limit.min((self.params.max_tokens as usize).saturating_sub(after) as u32);
        if limit == 0 {
            return Vec::new();
        }
        let mut context = self.tokens();
        context.extend(flight);
        let mut drafter = self.drafter.clone();
        flight.iter().for_each(|&t| drafter.advance(t));
        let Some(&guess) = drafter.propose(&context, 1).first() else { return Vec::new() };
        context.push(guess);
        drafter.advance(guess);
        let mut draft = drafter.propose(&context, limit);
        draft.truncate(crate::speculate::quantize_draft(draft.len() as u32) as usize);
        draft
    }

    /// After a decode step: `proposed` draft tokens, `accepted` of them taken, `asked` when the
    /// step asked for a draft ([`crate::speculate::Drafter::record`]).
    pub fn record_draft(&mut self, proposed: u32, accepted: u32, asked: bool) {
        self.drafter.record(proposed, accepted, asked);
    }

    /// The tokens its constraint allows next (`ceil(vocab / 32)` words), past every token it
    /// has accepted; `None` when it is not constrained.
    pub fn mask(&self) -> Option<&[u32]> {
        self.constrained.as_ref().map(Constrained::mask)
    }

    /// Whether the next `n` tokens it gets (a step in flight, verifying a draft of `n - 1`) may
    /// end it by its token limit or at `max_len` computed tokens ([`Request::accept`]'s length
    /// test, early): a step planned ahead has no row for it.
    pub fn ends_within(&self, n: u32, max_len: u32) -> bool {
        self.generated.len() + n as usize >= self.params.max_tokens as usize || self.computed + n >= max_len
    }

    /// Called when the scheduler (re)admits it on `seq` with `hit` tokens already cached;
    /// returns the [`Event::Admitted`] of its first admission.
    pub fn admitted(&mut self, seq: SeqId, hit: u32, step: u64) -> Option<Event> {
        self.seq = Some(seq);
        self.planned = None;
        self.computed = hit;
        self.admitted_step = step;
        if self.first_hit.is_some() {
            return None;
        }
        self.first_hit = Some(hit);
        Some(Event::Admitted { id: self.id, prompt_tokens: self.prompt.len() as u32, prefix_hit_tokens: hit })
    }

    /// Called when a step computed `n` more of its context's K/V; `completes` when that ends
    /// the context of a prefill (its logits give the next token).
    pub fn computed_rows(&mut self, n: u32, prefill: bool, completes: bool) {
        self.computed += n;
        if prefill && completes {
            self.prefill_done_ms.get_or_insert(now_ms());
        }
        if !prefill {
            self.pending = None;
        }
    }

    /// The one place a request handles a new token (the argmax, or the token its row sampled on
    /// the GPU). Ends the request at an end-of-generation token (`eos`, unless
    /// `ignore_eos`), at a stop string (the text is cut before it and the token not streamed),
    /// when its constraint's output is complete, at `max_tokens`, or when its sequence holds
    /// `max_len` tokens; otherwise the token becomes pending, for the next decode row to feed.
    /// A constrained request's matcher takes the token here and computes the next mask.
    pub fn accept(&mut self, next: u32, eos: &[u32], max_len: u32) -> Accepted {
        self.first_token_ms.get_or_insert(now_ms());
        let stop = Accepted { token: None, finish: Some(FinishReason::Stop), failure: None };
        if self.params.max_tokens == 0 {
            return Accepted { token: None, finish: Some(FinishReason::Length), failure: None };
        }
        if eos.contains(&next) && !self.params.ignore_eos {
            return stop;
        }
        if let Some(c) = &mut self.constrained {
            if let Err(e) = c.advance(next) {
                return Accepted { token: None, finish: None, failure: Some(e.into()) };
            }
        }
        self.generated.push(next);
        self.drafter.advance(next);
        // The model's own ids always decode; an error here would be a broken vocabulary.
        let piece = self.decoder.push(next).unwrap_or_default();
        self.text.push_str(&piece);
        let stop_at = self.params.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| self.text.find(s.as_str())).min();
        if let Some(cut) = stop_at {
            self.text.truncate(cut);
            return stop;
        }
        let complete = self.constrained.as_ref().is_some_and(Constrained::is_complete);
        let length = self.generated.len() >= self.params.max_tokens as usize || self.computed >= max_len;
        if !length && !complete {
            self.pending = Some(next);
        }
        let finish = if complete { Some(FinishReason::Stop) } else { length.then_some(FinishReason::Length) };
        let (reasoning, answer) = match &mut self.splitter {
            Some(splitter) => splitter.push(&piece),
            None => (String::new(), piece),
        };
        Accepted { token: Some((next, answer, reasoning)), finish, failure: None }
    }

    /// Called when it is preempted: its K/V are gone (to the prefix cache) and it waits again.
    pub fn preempted(&mut self, step: u64) {
        self.seq = None;
        self.planned = None;
        self.computed = 0;
        self.enqueued_step = step;
    }

    /// The record of its end.
    pub fn finish(&mut self, reason: FinishReason, blocks: Vec<u32>) -> Generation {
        if reason != FinishReason::Stop {
            let rest = self.decoder.finish();
            self.text.push_str(&rest);
        }
        let now = now_ms();
        let prefill_done = self.prefill_done_ms.unwrap_or(now);
        let hit = self.first_hit.unwrap_or(0);
        let (reasoning_content, text) = match &self.params.reasoning {
            Some(r) => r.split(&self.text),
            None => (None, self.text.clone()),
        };
        let tool_calls = match (&self.params.tools, reason) {
            (Some(tools), FinishReason::Stop) => tools.read_calls(&text, &format!("call_{}_", self.id.0)),
            _ => None,
        };
        Generation {
            prompt_tokens: self.prompt.clone(),
            tokens: self.generated.clone(),
            text,
            reasoning_content,
            finish_reason: if tool_calls.is_some() { FinishReason::ToolCalls } else { reason },
            prefix_hit_tokens: hit,
            prefill_tokens: self.prompt.len() as u32 - hit,
            ttft_ms: self.first_token_ms.map_or(0.0, |t| t - self.submitted_ms),
            prefill_ms: prefill_done - self.submitted_ms,
            decode_ms: now - prefill_done,
            blocks,
            accepted_prediction_tokens: self.drafter.accepted,
            rejected_prediction_tokens: self.drafter.rejected,
            warning: self
                .constrained
                .as_ref()
                .filter(|c| !c.is_accepting())
                .map(|_| format!("the output ended ({}) before its constraint was complete: it does not match the schema or grammar", reason.as_str())),
            tool_calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Prediction;
    use serde_json::json;

    #[test]
    fn a_prediction_is_read_as_openai_writes_it() {
        let text = |s: &str| Ok(Some(Prediction::Text(s.into())));
        assert_eq!(Prediction::from_openai(&json!({"type": "content", "content": "abc"})), text("abc"));
        let parts = json!({"type": "content", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]});
        assert_eq!(Prediction::from_openai(&parts), text("abc"));
        assert_eq!(Prediction::from_openai(&json!(null)), Ok(None));
        for bad in [json!({"type": "text", "content": "x"}), json!({"type": "content"}), json!({"type": "content", "content": [{"type": "image"}]}), json!("x")]
        {
            assert!(Prediction::from_openai(&bad).unwrap_err().contains("content"), "{bad}");
        }
    }
}
