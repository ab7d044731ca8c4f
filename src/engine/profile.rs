//! The profile of a step ([`crate::profile`]): one prefill and one steady-state decode step,
//! through the engine's own paths, timed per kernel by GPU timestamps or kernel by kernel on the
//! host clock.

use std::sync::Arc;

use crate::backend;
use crate::error::EngineError;
use crate::gpu::{Context, Counters, TimingMethod};
use crate::model::Logits;
use crate::profile::{ColdStep, Profile, StepProfile, TimedRun};
use crate::request::{Event, GenerateRequest};
use crate::sampler::SamplingParams;

use super::Engine;

/// Decode steps [`Engine::profile`] runs before it measures (graphs built, pipelines compiled).
pub const PROFILE_WARMUP_DECODE: u32 = 4;
/// Decode steps [`Engine::profile`] measures; it reports the one of median wall time.
pub const PROFILE_DECODE_SAMPLES: u32 = 5;
/// Context [`Engine::profile`] needs beyond its prompt: the decode steps it runs (warm-up,
/// measured, and as many timed with timestamps), the first token's and a few to spare (a step
/// planned ahead, a call that yields no token).
pub const PROFILE_EXTRA_TOKENS: u32 = PROFILE_WARMUP_DECODE + 2 * PROFILE_DECODE_SAMPLES + 3;
/// Dispatches a capture is armed for beyond the measured step's (a step never records more than
/// its twin did; the slack only keeps a miscount from failing the profile).
const PROFILE_CAPTURE_SLACK: u32 = 64;

impl Engine {
    /// Profiles one prefill of `prompt_tokens` tokens and one steady-state decode step after it
    /// (see [`crate::profile`]), through the engine's own paths: a first prefill on a scratch
    /// sequence (graphs built, pipelines compiled); decode steps of a request run by the engine's
    /// own loop, steps planned ahead as in any generation (see `Engine::profile_decode`); then
    /// a second prefill, measured, and a third, timed per kernel. Per-kernel times come from GPU timestamps when the device has
    /// them and `timestamps` is true, else from each kernel run alone on the host clock.
    /// Needs an idle engine and a context of `prompt_tokens + PROFILE_EXTRA_TOKENS`.
    pub async fn profile(&mut self, prompt_tokens: u32, timestamps: bool) -> Result<Profile, EngineError> {
        let n = prompt_tokens;
        if self.has_work() {
            return Err(EngineError::InvalidArgument("requests are running: profile when they have finished".into()));
        }
        if n == 0 || n + PROFILE_EXTRA_TOKENS > self.kv.max_seq_len {
            return Err(EngineError::InvalidArgument(format!(
                "a profile of {n} prompt tokens needs a context of {} tokens and this engine holds {} (prompt tokens must be at least 1)",
                n + PROFILE_EXTRA_TOKENS,
                self.kv.max_seq_len
            )));
        }
        let has_timestamps = self.backend.device().is_some_and(|c| c.has_timestamps());
        let method = if timestamps && has_timestamps { TimingMethod::Timestamps } else { TimingMethod::WallClockPerKernel };
        let vocab = self.config().vocab;
        let tokens: Vec<u32> = (0..n).map(|i| (100 + i) % vocab).collect();
        let (prefill_cold, per_kernel) = self.profile_cold_prefill(&tokens, method).await?;
        let decode = self.profile_decode(&tokens, method, per_kernel).await?;
        let prefill = self.profile_prefill(&tokens, method).await?;
        Ok(Profile {
            adapter: self.adapter_name(),
            variant: self.variant_name(),
            method,
            prompt_tokens: n,
            prefill_chunk: self.options.prefill_chunk,
            lookahead: self.options.sched.lookahead,
            prefill_cold,
            prefill,
            decode_warmup_steps: PROFILE_WARMUP_DECODE,
            decode_samples: PROFILE_DECODE_SAMPLES,
            decode,
        })
    }

    /// On a scratch sequence: the cold prefill of `tokens` and, without timestamps, one decode
    /// step after it timed kernel by kernel.
    async fn profile_cold_prefill(&mut self, tokens: &[u32], method: TimingMethod) -> Result<(ColdStep, Option<TimedRun>), EngineError> {
        self.scratch_sequence(async |e: &mut Self, seq| {
            let last = tokens.len() as u32 - 1;
            let pipelines = |e: &Self| e.backend.device().map_or(0, |c| c.pipeline_count());
            let (before, mark) = (pipelines(e), e.mark());
            let (ids, _) = e.prefill(seq, tokens, 0, last, Logits::Argmax).await?;
            let (counters, wall) = e.since(mark);
            let cold = ColdStep::new(&counters, wall, (pipelines(e) - before) as u64);
            if method == TimingMethod::Timestamps {
                return Ok((cold, None));
            }
            let pos = e.kv.append(seq, 1)?;
            let rows = backend::rows_of(&e.kv, seq, &ids[ids.len() - 1..], pos);
            let dispatches = e.backend.time_kernels(&e.kv, &rows).await?;
            Ok((cold, Some(TimedRun { dispatches, span_ms: None })))
        })
        .await
    }

    /// Steady-state decode through the engine's own loop ([`Engine::step`], steps planned ahead
    /// as configured): a greedy request of `tokens` that ignores end-of-generation tokens runs
    /// [`PROFILE_WARMUP_DECODE`] decode steps, then [`PROFILE_DECODE_SAMPLES`] measured ones
    /// (counters and wall time around each `step` call that yields its next token; the one of
    /// median wall time is reported), then with timestamps as many captured (the one of median
    /// GPU time gives the kernels), and is aborted. `per_kernel` gives the kernels otherwise.
    // Long: one loop over the request's steps, whose phases (warm-up, measured, captured) share its state.
    async fn profile_decode(&mut self, tokens: &[u32], method: TimingMethod, per_kernel: Option<TimedRun>) -> Result<StepProfile, EngineError> {
        let (warmup, samples_wanted) = (PROFILE_WARMUP_DECODE as usize, PROFILE_DECODE_SAMPLES as usize);
        // Decode steps of one token each (no drafts): the step a profile describes.
        let speculative = Some(crate::speculate::Speculative::Off);
        let request =
            GenerateRequest { max_tokens: PROFILE_EXTRA_TOKENS, sampling: SamplingParams::greedy(), ignore_eos: true, speculative, ..Default::default() };
        let id = self.submit(tokens.to_vec(), request)?;
        // Tokens the request has produced (the first comes from its prefill).
        let mut produced = 0usize;
        let mut samples: Vec<(Counters, f64, u32)> = Vec::new();
        let mut runs: Vec<TimedRun> = Vec::new();
        let measured = loop {
            let capturing = method == TimingMethod::Timestamps && samples.len() == samples_wanted;
            if samples.len() == samples_wanted && (!capturing || runs.len() == samples_wanted) {
                break Ok(());
            }
            if !self.has_work() {
                break Err(EngineError::InvalidArgument("the profile's request ended before its steps were measured".into()));
            }
            if capturing {
                let armed = samples.iter().map(|s| s.0.dispatches).max().unwrap_or(0) as u32 + PROFILE_CAPTURE_SLACK;
                if let Err(e) = self.gpu_ctx().begin_capture(armed) {
                    break Err(e.into());
                }
            }
            let mark = self.mark();
            let stepped = self.step().await;
            let (counters, wall) = self.since(mark);
            if capturing {
                // Ended whatever the step did, so that the next profile can arm one.
                match self.gpu_ctx().end_capture().await {
                    Ok(captured) => runs.push(TimedRun::from(captured)),
                    Err(e) => break Err(e.into()),
                }
            }
            let events = match stepped {
                Ok(events) => events,
                Err(e) => break Err(e),
            };
            let new = events.iter().filter(|e| matches!(e, Event::Token { id: of, .. } if *of == id)).count();
            if !capturing && produced > warmup && new == 1 {
                samples.push((counters, wall, tokens.len() as u32 + produced as u32));
            }
            produced += new;
        };
        // The request's K/V go to the prefix cache like any request's; nothing else stays behind.
        self.abort(id)?;
        measured?;
        samples.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (counters, wall, context) = samples[samples.len() / 2];
        let times = match per_kernel {
            Some(times) => times,
            None => {
                runs.sort_by(|a, b| a.total_ms().total_cmp(&b.total_ms()));
                runs.swap_remove(runs.len() / 2)
            }
        };
        Ok(StepProfile::new(1, context, (&counters, wall), &times))
    }

    /// A warm prefill of `tokens` measured on one scratch sequence, timed per kernel on another.
    async fn profile_prefill(&mut self, tokens: &[u32], method: TimingMethod) -> Result<StepProfile, EngineError> {
        let (n, last) = (tokens.len() as u32, tokens.len() as u32 - 1);
        let (counters, wall) = self
            .scratch_sequence(async |e: &mut Self, seq| {
                let mark = e.mark();
                e.prefill(seq, tokens, 0, last, Logits::Argmax).await?;
                Ok(e.since(mark))
            })
            .await?;
        let times = self
            .scratch_sequence(async |e: &mut Self, seq| match method {
                TimingMethod::Timestamps => {
                    let ctx = e.gpu_ctx();
                    ctx.begin_capture(counters.dispatches as u32 + PROFILE_CAPTURE_SLACK)?;
                    let stepped = e.prefill(seq, tokens, 0, last, Logits::Argmax).await;
                    let captured = ctx.end_capture().await;
                    stepped?;
                    Ok(TimedRun::from(captured?))
                }
                TimingMethod::WallClockPerKernel => {
                    e.kv.append(seq, n)?;
                    let rows = backend::rows_of(&e.kv, seq, tokens, 0);
                    Ok(TimedRun { dispatches: e.backend.time_kernels(&e.kv, &rows).await?, span_ms: None })
                }
            })
            .await?;
        Ok(StepProfile::new(n, n, (&counters, wall), &times))
    }

    /// The counters and the clock now, for [`Engine::since`].
    fn mark(&self) -> (Counters, f64) {
        (self.counters(), crate::time::now_ms())
    }

    /// The GPU context's counters (all zero on the CPU backend).
    fn counters(&self) -> Counters {
        self.backend.device().map(|c| c.counters()).unwrap_or_default()
    }

    /// The GPU context, for timestamp captures, which [`Engine::profile`] asks for only where
    /// the device has timestamps (so never on the CPU backend).
    fn gpu_ctx(&self) -> Arc<Context> {
        self.backend.device().expect("timestamps are a GPU's").clone()
    }

    /// What the context did and the milliseconds that passed since `mark`.
    fn since(&self, (counters, t0): (Counters, f64)) -> (Counters, f64) {
        (self.counters().since(&counters), crate::time::now_ms() - t0)
    }
}
