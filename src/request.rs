//! A request's life as the caller sees it: its parameters, its handle, the events a step
//! reports about it and the record of its end.

use crate::error::EngineError;
use crate::kv::SeqId;
use crate::sampler::{Sampler, SamplingParams};
use crate::tokenizer::StreamDecoder;

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
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest { max_tokens: 128, sampling: SamplingParams::greedy(), stop: Vec::new(), ignore_eos: false }
    }
}

/// One generated token as streamed to the caller.
pub struct TokenEvent<'a> {
    pub id: u32,
    /// Text completed by this token (may be empty while a UTF-8 character is incomplete).
    pub text: &'a str,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
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
}

/// Something that happened to a request during a step.
#[derive(Debug)]
pub enum Event {
    /// The scheduler admitted the request for the first time: its prompt's K/V are being
    /// computed from now on, `prefix_hit_tokens` of them came from the prefix cache.
    Admitted { id: RequestId, prompt_tokens: u32, prefix_hit_tokens: u32 },
    /// A generated token and the text it completes.
    Token { id: RequestId, token: u32, text: String },
    /// The request ended: its generation, or the error that ended it.
    Finished { id: RequestId, result: Result<Generation, EngineError> },
}

/// A request in the scheduler.
pub(crate) struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub params: GenerateRequest,
    pub sampler: Sampler,
    pub decoder: StreamDecoder,
    /// Tokens generated so far (streamed to the caller).
    pub generated: Vec<u32>,
    pub text: String,
    /// The sequence while running.
    pub seq: Option<SeqId>,
    /// Tokens of `prompt ++ generated` whose K/V the sequence holds.
    pub computed: u32,
    /// The prefix-cache hit at first admission (what the caller sees as `prefix_hit_tokens`).
    pub first_hit: Option<u32>,
    /// Prompt tokens this request computed itself, over all its admissions.
    pub prefill_tokens: u32,
    pub submitted_ms: f64,
    pub first_token_ms: Option<f64>,
    pub prefill_done_ms: Option<f64>,
    /// Step at which it joined the queue (again) and at which it was last admitted.
    pub enqueued_step: u64,
    pub admitted_step: u64,
    pub preemptions: u32,
    /// The next token, sampled and streamed but not yet fed to the model.
    pub pending: Option<u32>,
}

impl Request {
    /// Every token of the sequence: the prompt, then what was generated.
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.prompt.clone();
        t.extend(&self.generated);
        t
    }

    /// Tokens the sequence must hold before it can produce its next token: the prompt and every
    /// generated token except the pending one, which the next decode row feeds.
    pub fn context_len(&self) -> u32 {
        (self.prompt.len() + self.generated.len()) as u32 - self.pending.is_some() as u32
    }

    /// The tokens whose cached prefix admission looks up: the context but its last token,
    /// which is always computed (see [`KvCache::allocate_for_prompt`]).
    pub fn cache_probe(&self) -> Vec<u32> {
        let n = (self.context_len() as usize).saturating_sub(1).max(1);
        self.prompt.iter().chain(&self.generated).take(n).copied().collect()
    }

    /// Still reading its prompt (or, after a preemption, its prompt and earlier output).
    pub fn in_prefill(&self) -> bool {
        self.computed < self.context_len()
    }
}

/// The generation record of a finished request.
pub(crate) fn generation_of(r: &mut Request, finish: FinishReason, now: f64, blocks: Vec<u32>) -> Generation {
    if finish != FinishReason::Stop {
        let rest = r.decoder.finish();
        r.text.push_str(&rest);
    }
    let prefill_done = r.prefill_done_ms.unwrap_or(now);
    Generation {
        prompt_tokens: r.prompt.clone(),
        tokens: r.generated.clone(),
        text: r.text.clone(),
        finish_reason: finish,
        prefix_hit_tokens: r.first_hit.unwrap_or(0),
        prefill_tokens: r.prompt.len() as u32 - r.first_hit.unwrap_or(0),
        ttft_ms: r.first_token_ms.map_or(0.0, |t| t - r.submitted_ms),
        prefill_ms: prefill_done - r.submitted_ms,
        decode_ms: now - prefill_done,
        blocks,
    }
}
