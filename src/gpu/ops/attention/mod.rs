//! Causal attention (GQA, scale 1/sqrt(head_dim), softmax in f32, optionally a sliding window:
//! [`PoolShape::window`]) over the paged KV pool
//! ([`PoolShape`]: keys read through a block table; the contiguous cache is the one-block case),
//! f32 or INT8 ([`crate::quant::kv_int8`]). One kernel family, two kernels:
//! - [`Attention`] (`shaders/attention.wgsl`): every row of a dispatch belongs to ONE sequence;
//!   an invocation owns 4 query rows of one KV head (for SmolLM2's decode: the 3 query heads of
//!   a group), so prefill rows share every K/V load. Plans: split-K for decode, passes for
//!   prefill ([`AttentionPlan`]).
//! - [`AttentionBatch`] (`shaders/attention_batch.wgsl`): a row per sequence (continuous
//!   batching), the rows of a step described by the host in a small batch buffer. Plans:
//!   split-K with splits numbered across the batch, or one dispatch of workgroup splits ([`BatchPlan`]).
//!
//! Both bodies follow one prelude (`shaders/attention_common.wgsl`: the bindings they share, the
//! q/K/V loads, the key loop and the write-out) and their split-K reduces follow another
//! (`shaders/attention_reduce_common.wgsl`). Variants (split or not, INT8, chunk, workgroup size,
//! head_dim) are override constants of the same code. INT8 codes and scales are dequantized in
//! registers as the key loop loads them, never into an f32 copy of the cache.
//!
//! An invocation reads each K/V row once for its 4 lanes; no shared memory. Decode runs in one
//! dispatch at any context (workgroup splits, `WG_SPLIT`): the invocations of a workgroup split
//! one item's keys and combine their softmax states in the workgroup (subgroup reductions where
//! the device has subgroups, then a record per subgroup, or per invocation without them, in
//! storage and one barrier; none where the workgroup is one subgroup), so no reduce kernel
//! follows. Variants per adapter class ([`crate::gpu::AdapterClass`]): CPU adapters take
//! workgroups of 8 (one SIMD row of lavapipe's, one subgroup: no barrier at all), real GPUs 64
//! (integrated) or 128 (discrete) and, past 8,192 keys, splits over workgroups with a
//! reduce (more parallelism than one workgroup per KV head gives them).
//!
//! No variant computes in f16 (`shader-f16`): neither software adapter would run it faster
//! (lavapipe offers the feature but LLVM computes f16 on x86 as f32 with conversions around it;
//! SwiftShader lacks it), so no such variant can be measured here; and on a real GPU decode
//! attention at these sizes waits on dispatches and K/V bytes, not on arithmetic: an f16 product
//! with f32 accumulation saves nothing there unless the pools themselves hold f16 (a KV dtype of
//! its own, not a kernel variant), while INT8 codes times their scale are exact in f32 already.
//!
//! The kernels are large (their key loop is written out, see the prelude): a new pipeline
//! compiles at its first dispatch in about 0.8 s on lavapipe and 2-4 s on SwiftShader (head_dim
//! 64). Build attentions at load time and run them once there, never first in the decode loop.
//!
//! Why no invocation streams an unbounded context: lavapipe ends all loops of an invocation after
//! 65,535 back-edges in total (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, shared by every loop of a
//! shader), silently, leaving a wrong result. The key loop has no inner loop, so `chunk` keys
//! cost `chunk` back-edges; the plan checks keep them under that budget.

use std::sync::Arc;

use super::pool::{PoolBuffers, PoolShape};
use super::rope::check_rope;
use super::whole;
use crate::gpu::kernel::split_count;
use crate::gpu::{shape_err, AdapterClass, Context, GpuError, Kernel};
use crate::model::RopePairing;
use crate::quant::KvDtype;

mod batch;
#[cfg(feature = "testing")]
mod reference;
mod single;

pub use batch::{AttentionBatch, BatchBuffers, BatchPlan, BatchRow, BatchStep, MAX_ROWS};
#[cfg(feature = "testing")]
pub use reference::{attention_batch_cpu, attention_cpu, attention_int8_cpu};
pub use single::{Attention, AttentionBuffers, AttentionPath, AttentionPlan, SPLIT_MAX_TOKENS};

/// attention_common.wgsl writes the key loop out for up to 32 vec4 of head_dim; wider heads are
/// cut into slices of that many ([`slices`]), up to this width.
const MAX_HEAD_DIM: u32 = 256;
/// Vec4 of head dims the written-out accumulator holds (a0..a31 in attention_common.wgsl).
const MAX_SLICE_VEC4: u32 = 32;

/// Invocations per lane quad: 1, or the slices of a head wider than [`MAX_SLICE_VEC4`] vec4.
pub(crate) fn slices(pool: &PoolShape) -> u32 {
    (pool.head_dim / 4).div_ceil(MAX_SLICE_VEC4)
}
/// Lanes of an invocation: query rows or heads, the components of a vec4.
const LANES: u32 = 4;
/// Keys one invocation may take: lavapipe's 65,535 loop back-edges, less a margin for the few
/// other loop iterations of the shaders (the batched kernel's row search, the write-out).
pub const MAX_CHUNK: u32 = 65_000;

/// Checks what the attention kernels add to [`PoolShape::check`]: a head_dim the written-out key
/// loop holds, a soft-cap that is 0 or finite and positive.
fn check_pool(op: &'static str, pool: &PoolShape) -> Result<(), GpuError> {
    pool.check(op)?;
    if !(pool.softcap.is_finite() && pool.softcap >= 0.0) {
        return Err(shape_err(op, format!("softcap must be 0 or finite and > 0, got {}", pool.softcap)));
    }
    // A sliced head is whole slices (and its score loop takes 8 vec4 per iteration).
    let sliced = pool.head_dim > 4 * MAX_SLICE_VEC4 && pool.head_dim % (4 * MAX_SLICE_VEC4) != 0;
    if pool.head_dim % 4 != 0 || pool.head_dim > MAX_HEAD_DIM || sliced {
        return Err(shape_err(
            op,
            format!(
                "head_dim {} must be a positive multiple of 4 up to {}, or of {} up to {MAX_HEAD_DIM}",
                pool.head_dim,
                4 * MAX_SLICE_VEC4,
                4 * MAX_SLICE_VEC4
            ),
        ));
    }
    Ok(())
}

/// Loop back-edges one key costs an invocation: 1, plus the score loop over the head dims of a
/// sliced head ([`slices`]).
fn key_cost(pool: &PoolShape) -> u32 {
    if slices(pool) > 1 {
        1 + pool.head_dim / 32
    } else {
        1
    }
}

/// The most keys one invocation may take over `pool` (lavapipe's loop budget).
pub fn max_chunk(pool: &PoolShape) -> u32 {
    MAX_CHUNK / key_cost(pool)
}

/// Checks the plan fields both kernels share: `one_dispatch_max_keys` keys split over a workgroup
/// stay within the loop budget per invocation, subgroups only where the device has them.
fn check_plan(
    ctx: &Context,
    (op, pool): (&'static str, &PoolShape),
    (chunk, one_dispatch_max_keys): (u32, u32),
    (workgroup_size, subgroups): (u32, bool),
) -> Result<(), GpuError> {
    let max = max_chunk(pool);
    if chunk == 0 || chunk > max {
        return Err(shape_err(op, format!("chunk {chunk} is outside 1..={max} keys (lavapipe's loop budget)")));
    }
    if workgroup_size == 0 || workgroup_size > ctx.limits.max_compute_invocations_per_workgroup {
        return Err(shape_err(op, format!("workgroup size {workgroup_size} is unsupported")));
    }
    let max_one = max as u64 * workgroup_size as u64;
    if one_dispatch_max_keys as u64 > max_one {
        return Err(shape_err(op, format!("one_dispatch_max_keys {one_dispatch_max_keys} is over {max_one}")));
    }
    if subgroups && !ctx.has_subgroups(1) {
        return Err(shape_err(op, "the plan uses subgroups, which this device lacks"));
    }
    Ok(())
}

/// How a main kernel spreads keys over invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KernelMode {
    /// One invocation per item over a range of keys (the passes; one pass over all keys).
    Whole,
    /// One invocation per item and split of `chunk` keys, writing split records for a reduce.
    Splits,
    /// One workgroup per item, its invocations splitting all its keys and combining them in the
    /// workgroup (`WG_SPLIT` in attention_common.wgsl): the normalized output, no reduce.
    WorkgroupSplits,
}

/// The attention plans' choices that depend on the adapter class ([`crate::gpu::AdapterClass`]):
/// (workgroup size, keys up to which one workgroup-split dispatch runs, keys per split past it).
/// CPU adapters: workgroups of 8 (lavapipe runs 8 invocations as one SIMD row, and a subgroup is 8
/// there), one dispatch at every length (a workgroup per KV head and quad keeps both cores busy
/// on SmolLM2's 3 KV heads, and a reduce dispatch costs more than the imbalance). Real GPUs: 64
/// (integrated) or 128 (discrete) invocations per workgroup, one dispatch up to 8,192 keys, and
/// past that splits of 128 (integrated) or 64 (discrete) keys over workgroups with a reduce.
/// Measured on an NVIDIA H200 (README, "On a real GPU"), same run, decode at 4,096 keys: one
/// dispatch 54 tok/s, splits of 64 + reduce 14.4 (192 invocations for the whole GPU, each walking
/// 64 keys alone); the `integrated` plan forced there 38 against 11.6. Past 8,192 keys a workgroup's
/// invocations would each walk 64 keys and more, where the splits spread as many. This kernel
/// family is still ~70% of a decode step there (its invocations hold a whole head of q and
/// accumulators for 4 rows, which spills on a GPU): a real-GPU variant is still to come.
fn class_plan(ctx: &Context, max_len: u32) -> (u32, u32, u32) {
    match ctx.class() {
        AdapterClass::Cpu => (8, max_len, 128),
        AdapterClass::Integrated => (64, 8192.min(max_len), 128),
        AdapterClass::Discrete => (128, 8192.min(max_len), 64),
    }
}

/// Whether a workgroup of `workgroup_size` invocations is one subgroup on this device (no
/// subgroup is smaller), so that with subgroup reductions its splits combine in registers alone
/// (`ONE_GROUP` in attention_common.wgsl: no records, no barrier).
fn one_group(ctx: &Context, (workgroup_size, subgroups): (u32, bool)) -> bool {
    subgroups && ctx.has_subgroups(workgroup_size)
}

/// Lanes that share each key's loads in a passes kernel with subgroups (`SHARED_KV` in
/// attention_common.wgsl): the smallest subgroup it needs.
const SHARED_LANES: u32 = 8;

/// Whether the passes of a `workgroup_size` plan may share each key's loads over subgroups
/// (`SHARED_KV`): subgroups of at least [`SHARED_LANES`], whole groups of them per workgroup, and
/// a head that is not sliced (its score loop reads q and K itself).
fn shares_loads(ctx: &Context, pool: &PoolShape, workgroup_size: u32) -> bool {
    ctx.has_subgroups(SHARED_LANES) && workgroup_size % SHARED_LANES == 0 && slices(pool) == 1
}

/// Bytes of the records of a [`KernelMode::WorkgroupSplits`] kernel: per item and invocation,
/// (2 + 4 * D4S) vec4 (attention_common.wgsl's `state`); a placeholder's 16 bytes where the
/// workgroup is [`one_group`] and writes none.
fn records_bytes(ctx: &Context, pool: &PoolShape, items: u64, variant: (u32, bool)) -> u64 {
    if one_group(ctx, variant) {
        return 16;
    }
    let d4s = (pool.head_dim / 4).min(MAX_SLICE_VEC4) as u64;
    items * variant.0 as u64 * (2 + 4 * d4s) * 16
}

/// What an attention that ropes and writes its step's heads (`appending_heads`) adds to its
/// kernel's contract: a valid rope base, qkv a buffer of its own (it is written: none of
/// `others`, the other bindings), the pool's K and V two buffers.
fn check_fresh(
    op: &'static str,
    (pool, base): (&PoolShape, f32),
    (qkv, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    others: &[&wgpu::Buffer],
) -> Result<(), GpuError> {
    check_rope(op, pool.head_dim, base)?;
    if others.contains(&qkv) || [k, v].contains(&qkv) {
        return Err(shape_err(op, "qkv is written: it must be a buffer of its own"));
    }
    if k == v {
        return Err(shape_err(op, "the pool's K and V must be two buffers"));
    }
    Ok(())
}

/// Whether one workgroup owns every query row, head and head dim of its KV head (the one
/// dispatch of workgroup splits, one lane quad per KV head, one slice), so that it may write what
/// it alone reads: the condition of an attention that ropes and writes its step's heads.
fn owns_kv_heads(one_dispatch_max_keys: u32, quads: u64, pool: &PoolShape) -> bool {
    one_dispatch_max_keys > 0 && quads == 1 && slices(pool) == 1
}

/// Refuses a count of rows (tokens, or a batch's capacity) of 0.
fn check_rows(op: &'static str, what: &str, rows: u32) -> Result<(), GpuError> {
    if rows == 0 {
        return Err(shape_err(op, format!("empty shape: {what} must be at least 1")));
    }
    Ok(())
}

/// The parameters of both attention kernels (`Params` in attention_common.wgsl, before the fresh
/// kernel's turn table).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MainParams {
    rows: u32,
    n_heads: u32,
    group: u32,
    quads: u32,
    items_per_split: u32,
    qkv_stride4: u32,
    n_kv_heads: u32,
    block_size: u32,
    n_blocks: u32,
    max_len: u32,
    scale: f32,
    scale_base: u32,
    max_splits: u32,
    pass_begin: u32,
    window: u32,
    slices: u32,
}

impl MainParams {
    /// `rows` query rows, `quads` lane quads per KV head, `max_splits` split records per row
    /// (1 when the kernel does not split); `pass_begin` 0.
    fn new(pool: &PoolShape, scale_base: u32, rows: u32, quads: u32, max_splits: u32) -> MainParams {
        MainParams {
            rows,
            n_heads: pool.n_heads,
            group: pool.group(),
            quads,
            items_per_split: quads * pool.n_kv_heads * slices(pool),
            qkv_stride4: (pool.qkv_row() / 4) as u32,
            n_kv_heads: pool.n_kv_heads,
            block_size: pool.block_size,
            n_blocks: pool.n_blocks,
            max_len: pool.max_len,
            scale: 1.0 / (pool.head_dim as f32).sqrt(),
            scale_base,
            max_splits,
            pass_begin: 0,
            window: pool.window,
            slices: slices(pool),
        }
    }
}

/// The pipeline of an attention kernel's main entry (`shader`: "attention" or "attention_batch"),
/// specialized for the pool, the mode, `chunk` keys per invocation (not [`KernelMode::WorkgroupSplits`]),
/// a workgroup size, and subgroup reductions or not (the `_subgroup` source). With `fresh` (the
/// rope pairing; [`KernelMode::WorkgroupSplits`] only) the `_fresh` source, which ropes and writes
/// the step's heads before its key loop.
fn main_pipeline(
    ctx: &Context,
    (shader, pool): (&str, &PoolShape),
    mode: KernelMode,
    chunk: u32,
    (workgroup_size, subgroups): (u32, bool),
    fresh: Option<RopePairing>,
) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    let d4 = pool.head_dim / 4;
    let wg_split = mode == KernelMode::WorkgroupSplits;
    // Whole (passes) with subgroups: the subgroup shares each key's loads.
    let shared = subgroups && mode == KernelMode::Whole;
    let mut constants = vec![
        ("D4", d4 as f64),
        ("D4S", d4.min(MAX_SLICE_VEC4) as f64),
        ("SLICED", flag(slices(pool) > 1)),
        ("SPLIT", flag(mode == KernelMode::Splits)),
        ("CHUNK", chunk as f64),
        ("WG", workgroup_size as f64),
        ("INT8", flag(pool.dtype == KvDtype::Int8)),
        ("WG_SPLIT", flag(wg_split)),
        ("ONE_GROUP", flag(wg_split && one_group(ctx, (workgroup_size, subgroups)))),
        ("SHARED_KV", flag(shared)),
    ];
    if let Some(pairing) = fresh {
        constants.push(("NEOX", flag(pairing == RopePairing::Neox)));
    }
    if pool.softcap > 0.0 {
        constants.push(("SOFTCAP", pool.softcap as f64));
    }
    // The subgroup source only where its reductions or shared loads run: the split records
    // never reach them.
    let name = match (shader, fresh.is_some(), subgroups && (wg_split || shared)) {
        ("attention", true, true) => "attention_fresh_subgroup",
        ("attention", true, false) => "attention_fresh",
        ("attention", false, true) => "attention_subgroup",
        ("attention_batch", true, true) => "attention_batch_fresh_subgroup",
        ("attention_batch", true, false) => "attention_batch_fresh",
        ("attention_batch", false, true) => "attention_batch_subgroup",
        (other, _, _) => other,
    };
    ctx.pipeline(name, "main", &constants)
}

/// The pipeline of a split-K reduce (`shader`: "attention_reduce" or "attention_batch_reduce").
fn reduce_pipeline(ctx: &Context, shader: &str, pool: &PoolShape, chunk: u32, workgroup_size: u32) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
    let constants = [("D4", (pool.head_dim / 4) as f64), ("CHUNK", chunk as f64), ("WG", workgroup_size as f64)];
    ctx.pipeline(shader, "main", &constants)
}

/// What a main kernel binds: the prelude's bindings 0-5, then the body's own from 6 on.
struct MainBindings<'a> {
    qkv: &'a wgpu::Buffer,
    pool: &'a PoolBuffers<'a>,
    dst: &'a wgpu::Buffer,
    extra: &'a [&'a wgpu::Buffer],
}

/// A main kernel with its own parameters: `params`, then `turns` (the fresh kernel's turn table,
/// `Params::turns` in attention_common.wgsl; empty for the others, which bind one zero entry:
/// a runtime-sized array binds one element at least). Its workgroups are set per step.
fn main_kernel(
    ctx: &Context,
    name: &'static str,
    pipeline: &Arc<wgpu::ComputePipeline>,
    bindings: &MainBindings<'_>,
    (params, turns): (&MainParams, &[u32]),
) -> Kernel {
    let turns = if turns.is_empty() { &[0u32; 4][..] } else { turns };
    let bytes = [bytemuck::bytes_of(params), bytemuck::cast_slice(turns)].concat();
    let params_buf = ctx.params_init(name, &bytes);
    let b = bindings;
    let mut resources = vec![whole(b.qkv), whole(b.pool.k), whole(b.pool.v), whole(b.pool.block_table), whole(&params_buf), whole(b.dst)];
    resources.extend(b.extra.iter().map(|buffer| whole(buffer)));
    Kernel::new(ctx, name, pipeline.clone(), &resources, [1, 1, 1], None).owning(params_buf)
}

/// Workgroups for `items` invocations, split over x/y past the per-dimension limit
/// (the shaders recover the linear index as gid.x + gid.y * num_workgroups.x * WG).
fn workgroups(max_per_dim: u32, workgroup_size: u32, items: u64) -> [u32; 3] {
    split_count(max_per_dim, items.div_ceil(workgroup_size as u64).max(1) as u32)
}
