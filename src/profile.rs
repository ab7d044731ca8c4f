//! Where a step's time goes: the figures the engine's `profile` measures for one
//! prefill and one steady-state decode step, natively and in the browser alike.
//!
//! Counts (dispatches, submits, readbacks, bytes read back, buffers and bind groups created) and
//! host times come from the context's counters around a step run through the engine's own path;
//! per-kernel GPU times from a second, captured run of the same step (GPU timestamps), or, on a
//! device without timestamp queries, from every kernel submitted and waited for on its own.

use serde::Serialize;

use crate::gpu::{Captured, Counters, KernelTime, TimingMethod};

/// One measured step (a decode step) or run of steps (a prefill of several chunks).
#[derive(Clone, Debug, Serialize)]
pub struct StepProfile {
    /// Tokens the step computed (1 for a decode step).
    pub tokens: u32,
    /// The sequence's length after the step (the decode step's context).
    pub context: u32,
    /// Dispatches recorded.
    pub dispatches: u64,
    /// `queue.submit` calls.
    pub submits: u64,
    /// Buffers mapped for reading, each a wait for the GPU (one per forward pass today).
    pub readbacks: u64,
    /// Readbacks that left the GPU without queued work while the host waited
    /// ([`Counters::blocking_readbacks`]).
    pub blocking_readbacks: u64,
    pub bytes_read_back: u64,
    pub bytes_read_back_per_token: f64,
    pub buffers_created: u64,
    pub buffer_bytes_created: u64,
    pub bind_groups_created: u64,
    /// Host time from starting to record to `queue.submit` returning, summed over the step's
    /// submissions.
    pub host_ms: f64,
    /// The part of `host_ms` inside `queue.submit` (where a driver may wait for earlier work).
    pub submit_ms: f64,
    /// The whole step as its caller sees it: inputs written, recorded, submitted, read back.
    pub wall_ms: f64,
    /// Sum of [`StepProfile::kernels`]' times (from the captured or per-kernel run).
    pub gpu_ms: f64,
    /// With timestamps: the captured run's GPU timeline, from its first dispatch's beginning to
    /// its last one's end (gaps between dispatches included); `gpu_ms` is the busy part of it.
    pub gpu_span_ms: Option<f64>,
    /// Per kernel name, slowest first.
    pub kernels: Vec<KernelTime>,
}

impl StepProfile {
    /// The figures of a step of `tokens` tokens ending at length `context`, from the counters
    /// around it, its wall time and its timed run (per-dispatch times, and their span when
    /// captured).
    pub fn new(tokens: u32, context: u32, (counters, wall_ms): (&Counters, f64), timed: &TimedRun) -> StepProfile {
        let kernels = KernelTime::by_name(&timed.dispatches);
        StepProfile {
            tokens,
            context,
            dispatches: counters.dispatches,
            submits: counters.submits,
            readbacks: counters.readbacks,
            blocking_readbacks: counters.blocking_readbacks,
            bytes_read_back: counters.bytes_read_back,
            bytes_read_back_per_token: counters.bytes_read_back as f64 / tokens.max(1) as f64,
            buffers_created: counters.buffers_created,
            buffer_bytes_created: counters.buffer_bytes_created,
            bind_groups_created: counters.bind_groups_created,
            host_ms: counters.record_submit_ms(),
            submit_ms: counters.submit_ns as f64 / 1e6,
            wall_ms,
            gpu_ms: kernels.iter().map(|k| k.ms).sum(),
            gpu_span_ms: timed.span_ms,
            kernels,
        }
    }
}

/// The per-kernel run of a step: each dispatch's `(kernel name, ms)` and, from a capture, their
/// GPU span.
#[derive(Clone, Debug)]
pub struct TimedRun {
    pub dispatches: Vec<(&'static str, f64)>,
    pub span_ms: Option<f64>,
}

impl TimedRun {
    /// The dispatches' summed time.
    pub fn total_ms(&self) -> f64 {
        self.dispatches.iter().map(|d| d.1).sum()
    }
}

impl From<Captured> for TimedRun {
    fn from(c: Captured) -> TimedRun {
        TimedRun { dispatches: c.dispatches, span_ms: Some(c.span_ms) }
    }
}

/// The first prefill of a prompt length: what building its graphs and compiling its pipelines
/// costs on top of the steady state.
#[derive(Clone, Debug, Serialize)]
pub struct ColdStep {
    pub wall_ms: f64,
    pub host_ms: f64,
    pub buffers_created: u64,
    pub buffer_bytes_created: u64,
    pub bind_groups_created: u64,
    pub pipelines_compiled: u64,
}

impl ColdStep {
    pub fn new(counters: &Counters, wall_ms: f64, pipelines_compiled: u64) -> ColdStep {
        ColdStep {
            wall_ms,
            host_ms: counters.record_submit_ms(),
            buffers_created: counters.buffers_created,
            buffer_bytes_created: counters.buffer_bytes_created,
            bind_groups_created: counters.bind_groups_created,
            pipelines_compiled,
        }
    }
}

/// A profile of one prefill of `prompt_tokens` tokens and one steady-state decode step after it.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    pub adapter: String,
    /// The kernel variants in use (`Context::variant_name`).
    pub variant: String,
    /// Where the per-kernel times come from.
    pub method: TimingMethod,
    pub prompt_tokens: u32,
    /// Rows per prefill pass (a prompt longer than this runs in several passes).
    pub prefill_chunk: u32,
    /// Whether decode steps are planned ahead (the scheduler's `lookahead` option).
    pub lookahead: bool,
    /// The first prefill of this length (graphs built, pipelines compiled).
    pub prefill_cold: ColdStep,
    /// A prefill of the same length once its graphs exist.
    pub prefill: StepProfile,
    /// Decode steps run after the prefill before the measured ones.
    pub decode_warmup_steps: u32,
    /// Decode steps measured; `decode` is the one of median wall time, its kernels those of
    /// the captured step of median GPU time (as many were captured).
    pub decode_samples: u32,
    pub decode: StepProfile,
}

/// The steady-state decode step's headline figures (what CONTRACTS names for `pagedlm
/// profile`), printed next to the profile by the CLI and the browser alike.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileSummary {
    pub dispatches_per_decode_step: u64,
    pub host_ms_per_decode_step: f64,
    pub gpu_ms_per_decode_step: f64,
    pub wall_ms_per_decode_step: f64,
    pub blocking_readbacks_per_token: f64,
    /// Host time to record and submit a decode step over its wall time (goal: ≤ 0.1 natively).
    pub host_share_of_decode_step: f64,
    /// The same without the time inside `queue.submit`: recording alone. On lavapipe a submit
    /// behind a running step waits for it, so with steps planned ahead `host_share` holds that
    /// wait and this share is the engine's own.
    pub record_share_of_decode_step: f64,
    /// A decode step's wall time over the sum of its kernels' GPU times (goal: ≤ 1.25).
    pub decode_wall_over_gpu: f64,
}

impl Profile {
    pub fn summary(&self) -> ProfileSummary {
        let d = &self.decode;
        ProfileSummary {
            dispatches_per_decode_step: d.dispatches,
            host_ms_per_decode_step: d.host_ms,
            gpu_ms_per_decode_step: d.gpu_ms,
            wall_ms_per_decode_step: d.wall_ms,
            blocking_readbacks_per_token: d.blocking_readbacks as f64 / d.tokens.max(1) as f64,
            host_share_of_decode_step: d.host_ms / d.wall_ms.max(f64::MIN_POSITIVE),
            record_share_of_decode_step: (d.host_ms - d.submit_ms).max(0.0) / d.wall_ms.max(f64::MIN_POSITIVE),
            decode_wall_over_gpu: d.wall_ms / d.gpu_ms.max(f64::MIN_POSITIVE),
        }
    }
}
