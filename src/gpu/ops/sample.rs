//! Sampling on the GPU for every sampler: repetition penalty, greedy, temperature, top-k, top-p
//! and a seeded counter-based draw, for each logit row of a step, choosing exactly the token of
//! [`crate::sampler`]'s definition (up to `exp` rounding) with no logits read back. The chosen id
//! is written to `out[out_offset + row * out_stride]`, so it can land in the next step's `ids`.
//!
//! **Interface.** [`sample`] builds the kernels once (per graph): they own their scratch buffers
//! and bind groups, and are recorded as they are every step. Per step the caller writes one
//! [`RowParams`] per row into the `params` buffer (a row whose `flags` lack
//! [`RowParams::ACTIVE`] is skipped and its `out` slot left alone) and keeps the `history` ring
//! of each row: `history[ring * history_capacity + slot]` (the row's `history_ring`, e.g. its
//! sequence's slot), the newest token at slot
//! `(history_head - 1) mod history_capacity`, `history_len` valid tokens before it (going
//! backwards). The penalty looks at the last `min(repetition_window, history_len)` of them.
//! With [`RowParams::APPEND_HISTORY`] the op also writes the chosen token at slot
//! `history_head`, so a GPU-resident loop only advances head and length in the next step's params.
//! The penalty is applied to `logits` in place, as [`crate::sampler::Sampler::sample`] does.
//! A row flagged [`RowParams::MASKED`] chooses among the tokens its row of `mask` allows
//! (constrained decoding: JSON Schema and grammar masks): the others' logits become `-inf` first, in
//! the same prepare pass, so greedy and sampled rows alike never choose them.
//!
//! **Algorithm** (details in `shaders/sample.wgsl`). After the penalty and the two-pass argmax
//! of [`super::argmax`], each row runs three searches in turn (the top-k cut by count, the top-p
//! cut by weight, the draw by weight), each finding the first token in ranking order whose
//! cumulative integer weight reaches a goal, without sorting: a step scans the row once,
//! histogramming the members of the current key range into 16 buckets with global atomics
//! (integer sums, so the result is the same whatever the order), and the next step narrows to the
//! bucket that holds the goal (the first step buckets by distance from the maximum, in units of
//! 1.72 temperatures, later ones by key). Once a bucket holds at most [`CAP`] tokens they are
//! gathered into a list (when the tokens above it are few too, the whole ranking prefix, and the
//! later searches run on that list alone), refined on the list down to 64 entries and ranked
//! pairwise in parallel; a bucket of one tied key too big to list is resolved by id with
//! per-part counts.
//!
//! **Cost.** A prepare, the argmax (one dispatch or two, [`super::argmax::ArgmaxPlan`]), up to
//! 33 steps and a finish. The steps are dispatched indirectly: each requests the next only while
//! some row has work, so the steps after
//! the last useful one cost an empty dispatch each (~7 us on lavapipe) instead of a launch. A
//! step on the row reads it once (`exp` only for members in its range, never in the top-k
//! search); the usual request reads the row 2-4 times after the argmax (a search's first pass,
//! perhaps one refinement, the gather), and searches that start on a prefix list not at all.
//! Rows are independent and share every dispatch. Measured on lavapipe in CPU time (all threads,
//! one submission, a busy 2-core machine): vocab 49,152: ~3 ms (T = 1), 262,144: ~9 ms (top-k 40
//! and top-p 0.95) to ~17 ms (top-p 0.9 over normal(0, 3) logits, whose nucleus has thousands of
//! tokens); greedy rows cost the argmax and a few empty steps, and a step whose rows are all
//! greedy records no steps at all ([`kernels_for`]).
//! Scratch: ~1 KB of atomics and ~9.3 KB of plain words per row.

use super::argmax::argmax;
use super::{check_binding, check_size, grid, whole as b};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::sampler::{RowParams, SampleShape};

/// Largest set of tokens a search ranks directly (`CAP` in `shaders/sample.wgsl`).
pub const CAP: u32 = 512;
const BUCKETS: u32 = 16;
const STAGES: u32 = 3;
/// Steps recorded: enough for every search to finish (`STEPS` in the shader).
const STEPS: u32 = 33;
const MAX_PARTS: u32 = 256;
/// Fewest parts per row: a part's invocation ranks CAP / parts list entries, each against the
/// whole list, within lavapipe's 65,535 loop back-edges per invocation.
const MIN_PARTS: u32 = 32;
/// Ids per part aimed at: 49,152 logits in 192 parts, 262,144 in 256 parts of 1,024.
const PART_LEN_TARGET: u32 = 256;
const BIN_WORDS: u32 = 5;
const BIN_SETS: u32 = 3;
const STATE_WORDS: u32 = 16;
/// u32 words of `work` per row: bins, the list's length, cuts.
const WORK_ROW: u32 = BIN_SETS * BUCKETS * BIN_WORDS + 1 + STAGES * 3;
/// u32 words of `scratch` per row, after the n_rows argmax ids: state, the list, part counts.
const SCRATCH_ROW: u32 = 2 * STATE_WORDS + 4 * CAP + MAX_PARTS;
const WG: u32 = 64;
/// Every kernel's shape lives in one storage buffer, one slot per kernel at this alignment
/// (WebGPU's minStorageBufferOffsetAlignment is at most 256). Not a uniform buffer: lavapipe
/// would recompile the kernels at every dispatch (see `shaders/sample.wgsl`).
const SHAPE_SLOT: u64 = 256;

/// The buffers a sampling op binds, all caller-owned.
pub struct SampleBuffers<'a> {
    /// [n_rows, vocab] f32, penalized in place.
    pub logits: &'a wgpu::Buffer,
    /// [n_rows] [`RowParams`].
    pub params: &'a wgpu::Buffer,
    /// [n_rings, history_capacity] u32 rings (at least 4 bytes when the capacity is 0), read-write.
    pub history: &'a wgpu::Buffer,
    /// u32, at least `out_offset + (n_rows - 1) * out_stride + 1` of them.
    pub out: &'a wgpu::Buffer,
    /// [n_rows, ceil(vocab / 32)] u32: row r's allowed tokens (bit `t % 32` of word `t / 32`),
    /// read for rows flagged [`RowParams::MASKED`] only.
    pub mask: &'a wgpu::Buffer,
}

/// The shape of one kernel (`Shape` in the shader).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ShapeSlot {
    n_rows: u32,
    vocab: u32,
    n_parts: u32,
    part_len: u32,
    history_cap: u32,
    out_offset: u32,
    out_stride: u32,
    step: u32,
    prep_width: u32,
    step_workgroups: u32,
    n_rings: u32,
    _pad: u32,
}

/// Parts per row and ids per part.
fn parts(vocab: u32) -> (u32, u32) {
    let n_parts = vocab.div_ceil(PART_LEN_TARGET).clamp(MIN_PARTS, MAX_PARTS);
    (n_parts, vocab.div_ceil(n_parts))
}

/// A buffer of the steps' indirect dispatch arguments (three u32 per step), written by kernels.
fn args_buffer(ctx: &Context, label: &str, steps: u32) -> wgpu::Buffer {
    ctx.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: steps as u64 * 12,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// The kernels that write each active row's sampled token to `out`, to record in order every
/// step after `logits` is computed and `params` (and the rings) written. See the module docs for
/// the contract; shapes are checked here, never at dispatch.
/// logits: [n_rows, vocab] f32 (read-write), params: [n_rows] RowParams,
/// history: [n_rings, history_capacity] u32, out: u32, mask: [n_rows, ceil(vocab / 32)] u32
/// (see [`SampleBuffers`]).
// Long: the shape checks, then the op's scratch, shape slots and its 36 or 37 kernels in recording
// order; they share the buffers built here.
pub fn sample(ctx: &Context, buffers: SampleBuffers<'_>, shape: SampleShape) -> Result<Vec<Kernel>, GpuError> {
    const OP: &str = "sample";
    let SampleShape { n_rows, vocab, history_capacity, n_rings, out_offset, out_stride } = shape;
    let SampleBuffers { logits, params, history, out, mask } = buffers;
    if n_rows == 0 || vocab == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and vocab ({vocab}) must be at least 1")));
    }
    if n_rows > 1 && out_stride == 0 {
        return Err(shape_err(OP, "out_stride 0 would write every row's token to one slot"));
    }
    let distinct = [logits, params, history, out, mask];
    if (0..5).any(|i| (i + 1..5).any(|j| distinct[i] == distinct[j])) {
        return Err(shape_err(OP, "logits, params, history, out and mask must be different buffers"));
    }
    let n = n_rows as u64;
    let work_bytes = n * WORK_ROW as u64 * 4;
    let scratch_bytes = (n + n * SCRATCH_ROW as u64) * 4;
    check_binding(ctx, OP, &format!("the scratch of {n_rows} rows"), work_bytes.max(scratch_bytes))?;
    check_size(OP, "logits", logits, n * vocab as u64 * 4)?;
    check_size(OP, "params", params, n * std::mem::size_of::<RowParams>() as u64)?;
    check_size(OP, "history", history, (n_rings as u64 * history_capacity as u64 * 4).max(4))?;
    check_size(OP, "out", out, (out_offset as u64 + (n - 1) * out_stride as u64 + 1) * 4)?;
    check_size(OP, "mask", mask, n * vocab.div_ceil(32) as u64 * 4)?;
    for (what, buffer) in [("logits", logits), ("params", params), ("history", history), ("out", out), ("mask", mask)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }

    let (n_parts, part_len) = parts(vocab);
    let step_workgroups = (n * n_parts as u64).div_ceil(WG as u64);
    if step_workgroups > ctx.limits.max_compute_workgroups_per_dimension as u64 {
        return Err(shape_err(OP, format!("{n_rows} rows need {step_workgroups} workgroups per step, over the device's limit")));
    }
    let prep_width = WORK_ROW.max(history_capacity);
    let work = ctx.storage_zeroed("sample.work", work_bytes);
    let scratch = ctx.storage_zeroed("sample.scratch", scratch_bytes);
    // Even steps are dispatched from args_even, odd ones from args_odd; a step writes the other.
    let args_even = args_buffer(ctx, "sample.args_even", STEPS.div_ceil(2));
    let args_odd = args_buffer(ctx, "sample.args_odd", STEPS / 2);
    let args_of = |step: u32| if step % 2 == 0 { &args_even } else { &args_odd };

    // One shape slot per kernel: prepare, the steps, finish.
    let mut shape_bytes = vec![0u8; ((STEPS + 2) as u64 * SHAPE_SLOT) as usize];
    let base = ShapeSlot {
        n_rows,
        vocab,
        n_parts,
        part_len,
        history_cap: history_capacity,
        out_offset,
        out_stride,
        step: 0,
        prep_width,
        step_workgroups: step_workgroups as u32,
        n_rings,
        _pad: 0,
    };
    for slot in 0..STEPS + 2 {
        let at = (slot as u64 * SHAPE_SLOT) as usize;
        let value = ShapeSlot { step: slot.saturating_sub(1), ..base };
        shape_bytes[at..at + std::mem::size_of::<ShapeSlot>()].copy_from_slice(bytemuck::bytes_of(&value));
    }
    let shapes = ctx.storage_init("sample.shape", &shape_bytes);
    let shape_at = |slot: u32| {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &shapes,
            offset: slot as u64 * SHAPE_SLOT,
            size: std::num::NonZeroU64::new(std::mem::size_of::<ShapeSlot>() as u64),
        })
    };

    let constants = [("WG", WG as f64), ("CAP", CAP as f64)];
    let pipeline = |entry: &str| ctx.pipeline("sample", entry, &constants);
    let (prepare, step, finish) = (pipeline("prepare")?, pipeline("search_step")?, pipeline("finish")?);
    let mut kernels = vec![Kernel::with_bindings(
        ctx,
        "sample.prepare",
        prepare,
        &[(0, b(logits)), (1, b(params)), (2, b(&work)), (4, shape_at(0)), (5, b(history)), (8, b(&args_even)), (9, b(&args_odd)), (10, b(mask))],
        grid(ctx, n * prep_width as u64, WG as u64),
    )
    .owning(work.clone())];
    // The argmax ids land in scratch[0..n_rows].
    kernels.extend(argmax(ctx, logits, &scratch, n_rows, vocab)?);
    let first_step = kernels.len();
    for i in 0..STEPS {
        let bindings = [(0, b(logits)), (1, b(params)), (2, b(&work)), (3, b(&scratch)), (4, shape_at(i + 1)), (7, b(args_of(i + 1)))];
        let mut kernel = Kernel::with_bindings(ctx, "sample.step", step.clone(), &bindings, [step_workgroups as u32, 1, 1]);
        kernel.indirect = Some((args_of(i).clone(), (i / 2) as u64 * 12));
        kernels.push(kernel);
    }
    let bindings = [(0, b(logits)), (1, b(params)), (2, b(&work)), (3, b(&scratch)), (4, shape_at(STEPS + 1)), (5, b(history)), (6, b(out))];
    kernels.push(Kernel::with_bindings(ctx, "sample.finish", finish, &bindings, grid(ctx, n, WG as u64)).owning(scratch.clone()));
    // The bind groups hold the scratch buffers; the kernels keep handles to them too.
    kernels[first_step].params = Some(shapes);
    Ok(kernels)
}

/// The kernels of [`sample`] a step with `params` records: all of them, or when no row samples
/// (every active row's temperature is 0: greedy, perhaps penalized or masked) all but the
/// searches, which would find nothing to do: the prepare pass (penalty, mask), the argmax and
/// the finish choose the same tokens. The skipped steps are empty indirect dispatches, but each
/// still costs a launch (~75 us on lavapipe: 33 of them took ~2.5 ms per step).
pub fn kernels_for<'k>(kernels: &'k [Kernel], params: &[RowParams]) -> impl Iterator<Item = &'k Kernel> {
    let search = params.iter().any(|p| p.flags & RowParams::ACTIVE != 0 && p.temperature > 0.0);
    kernels.iter().filter(move |k| search || k.name != "sample.step")
}
