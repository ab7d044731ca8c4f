//! The one object a user drives: load a model, generate with a token stream, run many requests
//! together, score (teacher forcing), move K/V snapshots, and report.
//!
//! The engine is the wiring between three parts that never see each other: the scheduler
//! ([`crate::sched`]: every request's life, the KV cache's sequences), the backend
//! ([`crate::backend`]: rows through the model, on the GPU or the CPU) and the KV cache
//! ([`crate::kv`]). A step is: the scheduler admits and plans, the backend runs the plan's rows,
//! the scheduler commits their outputs. [`Engine::generate`] is one submitted request stepped
//! to its end: there is one token loop.
//!
//! In steady decoding the loop keeps the backend ahead of the engine: before a step's tokens
//! are read, the next decode step is planned (`Scheduler::plan_ahead`) and
//! submitted, its input tokens handed over on the backend ([`StepRow::FED`](crate::model::StepRow::FED)); end of
//! generation, stop strings and token limits are found in the tokens read behind it, and the row
//! planned past an end is undone through the KV cache, so nothing a caller sees or the cache
//! keeps changes. What is in flight has one owner (`flight.rs`).
//!
//! The rest of the engine, by concern: its options and their defaults (`options.rs`), loading a
//! model and fitting the KV pool to a memory cap (`load.rs`), what it reports (`info.rs`),
//! prompts (`prompt.rs`), one-shot work on one sequence outside the scheduler (`oneshot.rs`:
//! scoring, benchmarks, snapshots) and the profile of a step (`profile.rs`).

mod estimate;
mod flight;
mod info;
mod load;
mod oneshot;
mod options;
mod profile;
mod prompt;
pub use estimate::{estimate, DeviceBudget, MemoryEstimate};
pub use load::LoadEvent;
pub use prompt::prepare_chat;

use std::collections::BTreeMap;

use crate::backend::Backend;
use crate::constraint::Grammars;
use crate::kv::KvCache;
use crate::request::Handling;
use crate::sampler::Sampler;
use crate::sched::Scheduler;
use crate::speculate::{Drafter, MAX_DRAFT_LIMIT};
use crate::tokenizer::Tokenizer;

use flight::Flight;

// The engine's public surface: everything a caller (the CLI, web.rs, tests) needs comes from here.
pub use crate::constraint::{Constraint, ConstraintError};
pub use crate::error::{EngineError, ErrorKind};
pub use crate::gpu::{AdapterClass, Context, DeviceLimits};
pub use crate::kv::{KvDtype, KvLayout};
pub use crate::model::ModelConfig;
pub use crate::profile::{ColdStep, Profile, ProfileSummary, StepProfile, TimedRun};
pub use crate::reasoning::Reasoning;
pub use crate::request::{Event, FinishReason, GenerateRequest, Generation, Prediction, RequestId, TokenEvent};
pub use crate::sampler::SamplingParams;
pub use crate::sched::{RunningInfo, SchedConfig, SchedStats};
pub use crate::speculate::Speculative;
pub use crate::tokenizer::{ChatFormatKind, ChatMessage};
pub use crate::tools::{Message, ToolCall, ToolChoice, ToolFormat, Tools};
pub use info::{EngineStats, MemoryUse, SequenceInfo};
pub use load::kv_shape;
pub use oneshot::ScoreMode;
pub use options::{BackendChoice, EngineOptions, CPU_INT8_ACTIVATIONS};
pub use profile::{PROFILE_DECODE_SAMPLES, PROFILE_EXTRA_TOKENS, PROFILE_WARMUP_DECODE};

pub struct Engine {
    /// The model on its backend (WebGPU or the CPU).
    backend: Box<dyn Backend>,
    /// Which backend runs and why ([`Engine::backend`]).
    backend_reason: String,
    tokenizer: Tokenizer,
    kv: KvCache,
    options: EngineOptions,
    sched: Scheduler,
    /// Tensors of each type in the model file (`Gguf::tensor_type_counts`).
    weight_types: BTreeMap<String, u32>,
    /// The steps submitted and not yet read back.
    flight: Flight,
    /// Events of other requests that a [`Engine::generate`] call stepped past; the next
    /// [`Engine::step`] returns them first.
    backlog: Vec<Event>,
    /// The constraint engine over this model's vocabulary, built at the first constrained
    /// request, and the milliseconds that took.
    grammars: Option<(Grammars, f64)>,
}

impl Engine {
    /// Refuses an empty prompt, a token outside the vocabulary and a prompt longer than the
    /// context.
    fn check_tokens(&self, ids: &[u32]) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.config().vocab;
        if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        if ids.len() > self.kv.max_seq_len as usize {
            return Err(EngineError::ContextOverflow { prompt: ids.len(), limit: self.kv.max_seq_len as usize });
        }
        Ok(())
    }

    /// Checks the KV cache's invariants after a step when the options ask for it.
    fn verify(&self) -> Result<(), EngineError> {
        if self.options.check_integrity {
            self.kv.check_integrity().map_err(crate::kv::KvError::from)?;
        }
        Ok(())
    }

    /// Queues a request for [`Engine::step`]; returns its id. The prompt and the sampling
    /// parameters are checked now.
    pub fn submit(&mut self, prompt: Vec<u32>, request: GenerateRequest) -> Result<RequestId, EngineError> {
        if let Some(message) = self.lost_reason() {
            return Err(EngineError::DeviceLost { message, tokens: Vec::new(), text: String::new() });
        }
        self.check_tokens(&prompt)?;
        let sampler = Sampler::new(request.sampling.clone())?;
        let constrained = match &request.output_constraint()? {
            Some(c) => Some(self.grammars()?.start(c)?),
            None => None,
        };
        let handling = Handling { sampler, decoder: self.tokenizer.stream_decoder(), constrained, drafter: self.drafter(&request)? };
        Ok(self.sched.submit(prompt, request, handling))
    }

    /// A request's drafter ([`crate::speculate`]): its prediction tokenized (as text that follows
    /// the prompt, no special tokens), drafting up to its or the engine's `max_draft` tokens a
    /// step unless speculation is off for it.
    fn drafter(&self, request: &GenerateRequest) -> Result<Drafter, EngineError> {
        let sched = &self.options.sched;
        let on = request.speculative.unwrap_or(sched.speculative) != Speculative::Off;
        let max_draft = if on { request.max_draft.unwrap_or(sched.max_draft).min(MAX_DRAFT_LIMIT) } else { 0 };
        let predicted = match &request.prediction {
            Some(Prediction::Text(text)) if on && !text.is_empty() => self.tokenizer.encode(text)?,
            Some(Prediction::Tokens(ids)) if on => ids.clone(),
            _ => Vec::new(),
        };
        let vocab = self.config().vocab;
        if let Some(&id) = predicted.iter().find(|&&id| id >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        Ok(Drafter::new(max_draft, predicted, true))
    }

    /// The constraint engine of this model's vocabulary, built at its first use.
    pub fn grammars(&mut self) -> Result<&Grammars, EngineError> {
        if self.grammars.is_none() {
            let t0 = crate::time::now_ms();
            let grammars = Grammars::new(&self.tokenizer, self.config().vocab)?;
            self.grammars = Some((grammars, crate::time::now_ms() - t0));
        }
        Ok(&self.grammars.as_ref().expect("built above").0)
    }

    /// Milliseconds it took to build the constraint engine (the token trie and llguidance's
    /// tables), once a constrained request has been submitted.
    pub fn grammar_build_ms(&self) -> Option<f64> {
        self.grammars.as_ref().map(|g| g.1)
    }

    /// Whether any submitted request has not finished (or has events not yet returned).
    pub fn has_work(&self) -> bool {
        !self.sched.is_idle() || !self.backlog.is_empty() || !self.flight.is_empty()
    }

    /// Ends a request now, wherever it is: its computed K/V go to the prefix cache and its
    /// sequence's blocks are released before this returns. Returns its generation so far
    /// (finish reason `abort`), or `None` for an unknown or already finished id.
    pub fn abort(&mut self, id: RequestId) -> Result<Option<Generation>, EngineError> {
        let generation = self.sched.abort(&mut self.kv, id)?;
        self.flight.drop_orphans(&self.sched);
        Ok(generation)
    }

    /// Running and waiting requests, preemptions and each running sequence's block table.
    pub fn sched_stats(&self) -> SchedStats {
        self.sched.stats(&self.kv)
    }

    /// Runs one scheduling step: admits waiting requests, runs one forward over the batch (each
    /// running sequence's next token plus at most one prefill chunk) and returns what happened:
    /// admissions, tokens and finished requests. Does nothing when there is no work.
    pub async fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = std::mem::take(&mut self.backlog);
        events.extend(self.step_once().await?);
        Ok(events)
    }

    async fn step_once(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        if self.is_lost() {
            return self.lose_device(events);
        }
        if self.flight.is_empty() {
            events.extend(self.sched.admit(&mut self.kv));
            let plan = self.sched.reserve(&mut self.kv, &mut events)?;
            if plan.rows().is_empty() {
                return Ok(events);
            }
            self.flight.launch((&mut *self.backend, &mut self.kv, &mut self.sched), plan, &mut events)?;
        }
        // The next decode step goes to the backend before this one's tokens come back, fed with
        // them there; this one's tokens are read behind it. When its constrained rows' masks
        // need those tokens, only its forward pass goes now, its choice after the commit.
        if self.flight.len() == 1 {
            if let Some(plan) = self.sched.plan_ahead(&mut self.kv)? {
                self.flight.launch((&mut *self.backend, &mut self.kv, &mut self.sched), plan, &mut events)?;
            }
        }
        let Some((plan, pending)) = self.flight.next() else { return Ok(events) };
        let read = pending.read().await;
        if read.is_err() && self.confirm_lost().await {
            // The device went: every request, in this step or not, ends with what it has.
            return self.lose_device(events);
        }
        // An error the device reported for this step's work (an allocation it refused, a
        // validation error): what it read back cannot be trusted, so its requests fail.
        let read = match self.backend.device().and_then(|c| c.take_reported()) {
            Some(e) => Err(e.into()),
            None => read,
        };
        let committed = match read {
            Ok(outputs) => self.verify().and_then(|()| self.sched.commit(&mut self.kv, &plan, outputs, &self.tokenizer.eos_ids())),
            // The step failed as a whole: every request in it ends with the error.
            Err(e) => {
                let mut failed = Vec::new();
                Flight::fail((&mut self.kv, &mut self.sched), &plan, &e, &mut failed).map(|()| failed)
            }
        };
        let mut chosen = Vec::new();
        let choose = self.flight.choose_open((&mut *self.backend, &mut self.kv, &mut self.sched), &mut chosen);
        events.extend(committed?);
        choose?;
        events.extend(chosen);
        self.flight.drop_orphans(&self.sched);
        Ok(events)
    }

    /// The device is lost: the steps in flight are dropped and every running and waiting request
    /// ends with [`EngineError::DeviceLost`] and what it had generated (after `events`, the
    /// step's so far). Later submissions are refused the same way.
    fn lose_device(&mut self, mut events: Vec<Event>) -> Result<Vec<Event>, EngineError> {
        self.flight.clear();
        let reason = self.lost_reason().unwrap_or_default();
        events.extend(self.sched.lose_all(&mut self.kv, &reason)?);
        Ok(events)
    }

    /// Whether the engine's GPU device is lost: it runs nothing more (see
    /// [`EngineError::DeviceLost`]). Never on the CPU backend.
    pub fn is_lost(&self) -> bool {
        self.backend.device().is_some_and(|c| c.is_lost())
    }

    /// Why the device was lost, once it is.
    fn lost_reason(&self) -> Option<String> {
        self.backend.device().and_then(|c| c.lost_reason())
    }

    /// After a failed read: whether the device is lost ([`Context::confirm_lost`]).
    async fn confirm_lost(&self) -> bool {
        match self.backend.device() {
            Some(ctx) => ctx.confirm_lost().await,
            None => false,
        }
    }

    /// Runs steps until every submitted request has finished, calling `on_event` for each event.
    pub async fn run_to_completion(&mut self, on_event: &mut dyn FnMut(&Event)) -> Result<(), EngineError> {
        while self.has_work() {
            for e in self.step().await? {
                on_event(&e);
            }
        }
        Ok(())
    }

    /// Generates from prompt token ids, calling `on_token` for every token; `on_token` returning
    /// false aborts the generation (finish reason `abort`). This is [`Engine::submit`] and
    /// [`Engine::step`] until the request ends; other requests' events meanwhile are kept for
    /// the next `step`.
    ///
    /// The request starts from the longest prefix of `prompt` whose K/V the prefix cache holds
    /// (earlier turns of a conversation, a shared system prompt) and computes only the rest; when
    /// it ends (finished, stopped or aborted) its K/V go to the cache for later requests.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        let id = self.submit(prompt.to_vec(), request.clone())?;
        loop {
            let mut events = match self.step_once().await {
                Ok(events) => events.into_iter(),
                Err(e) => {
                    // The caller gets the error; the request must not run on without it.
                    let _ = self.abort(id);
                    return Err(e);
                }
            };
            while let Some(event) = events.next() {
                match event {
                    Event::Token { id: of, token, text, reasoning } if of == id => {
                        if !on_token(&TokenEvent { id: token, text: &text, reasoning: &reasoning }) {
                            self.backlog.extend(events);
                            return self.abort(id)?.ok_or_else(|| EngineError::InvalidArgument(format!("request {id:?} vanished")));
                        }
                    }
                    Event::Finished { id: of, result } if of == id => {
                        self.backlog.extend(events);
                        return result;
                    }
                    Event::Admitted { id: of, .. } if of == id => {}
                    other => self.backlog.push(other),
                }
            }
        }
    }
}
