//! [`Attention`]: every row of a dispatch belongs to one sequence (one `table_base`), with two
//! plans:
//! - split-K (flash-decoding) for decode: up to `one_dispatch_max_keys` (every length on CPU
//!   adapters) one dispatch whose workgroups each split one item's keys over their invocations
//!   and combine them in the workgroup; past it the key range is cut into `chunk`-key splits
//!   spread over invocations, each keeping an online softmax, then a reduce kernel combines the
//!   splits. The number of splits follows the step's context (`set_kv_len`).
//! - passes for prefill: one dispatch per `chunk` keys, in order, each merging its keys into the
//!   normalized output (one dispatch up to `chunk` keys of context).
//!
//! Both are `shaders/attention.wgsl` specialized by override constants; the reduce is
//! `shaders/attention_reduce.wgsl`.
//!
//! [`Attention::appending_heads`] builds a decode attention that also does what
//! [`crate::gpu::ops::qkv_heads::qkv_heads`] does without head norms (RoPE of the step's q and k
//! heads, the KV write): where one workgroup owns each KV head's every query row and head dim
//! (the one dispatch of workgroup splits, at most 4 query rows x heads per KV head, heads of at
//! most 128 dims), that dispatch ropes and writes its KV head's heads before its key loop
//! (`shaders/attention_fresh.wgsl`), one dispatch fewer per layer and step.

use std::ops::Range;

use super::{
    check_fresh, check_plan, check_pool, check_rows, class_plan, main_kernel, main_pipeline, max_chunk, owns_kv_heads, records_bytes, reduce_pipeline,
    shares_loads, slices, workgroups, KernelMode, MainBindings, MainParams, LANES, MAX_CHUNK,
};
use crate::gpu::ops::pool::{PoolBuffers, PoolShape};
use crate::gpu::ops::rope::turn_table;
use crate::gpu::ops::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::model::RopePairing;

const OP: &str = "attention";
/// Split-K kernels are [one dispatch (workgroup splits), splits, reduce].
const SPLITS_KERNEL: usize = 1;
/// Most passes one attention may prebuild.
const MAX_PASSES: u32 = 1024;
/// Keys per dispatch of the default passes plan.
const PASS_KEYS: u32 = 8192;
/// Batches up to this many query rows take the split-K plan by default; above, the passes plan
/// has enough parallelism of its own and the split scratch would grow with the batch.
pub const SPLIT_MAX_TOKENS: u32 = 16;

/// Which kernel plan an [`Attention`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// One dispatch of workgroup splits up to `one_dispatch_max_keys`, else splits of `chunk`
    /// keys in parallel, then a reduce kernel (decode).
    SplitK,
    /// Sequential dispatches of `chunk` keys merging into the output (prefill).
    Passes,
}

/// Kernel plan. [`AttentionPlan::auto`] picks one from the batch and adapter; the fields are
/// public for tests and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    pub path: AttentionPath,
    /// Keys per invocation: per split (split-K) or per dispatch (passes); at most [`MAX_CHUNK`].
    pub chunk: u32,
    pub workgroup_size: u32,
    /// Split-K only: up to this kv_len one dispatch runs, its workgroups each splitting one
    /// item's keys over their invocations, instead of splits + reduce; at most `workgroup_size`
    /// times [`super::max_chunk`]. 0 always splits.
    pub one_dispatch_max_keys: u32,
    /// Split-K: combine the workgroup splits with subgroup reductions (needs
    /// [`Context::has_subgroups`]). Passes: the invocations of a subgroup attend the same keys
    /// and share each key's loads (subgroups of at least 8, a workgroup size a multiple of 8, a
    /// head of at most 128 dims).
    pub subgroups: bool,
}

impl AttentionPlan {
    /// The default plan for `n_tokens` query rows over `pool`: up to [`SPLIT_MAX_TOKENS`] split-K
    /// as the adapter class wants it (`class_plan` in the module: one dispatch at every length on
    /// CPU adapters); above, passes of 8192 keys (one pass for SmolLM2), or as many as the loop
    /// budget allows ([`super::max_chunk`]: 7222 for a head of 256). Subgroups wherever the
    /// device has them.
    pub fn auto(ctx: &Context, n_tokens: u32, pool: &PoolShape) -> AttentionPlan {
        let split = n_tokens <= SPLIT_MAX_TOKENS;
        let (workgroup_size, one_dispatch, chunk) = class_plan(ctx, pool.max_len);
        if !split {
            // Software adapters want small workgroups (many to spread over cores, no barriers).
            let workgroup_size = if ctx.is_cpu() { 8 } else { 64 };
            return AttentionPlan {
                path: AttentionPath::Passes,
                chunk: PASS_KEYS.min(max_chunk(pool)),
                workgroup_size,
                one_dispatch_max_keys: 0,
                subgroups: shares_loads(ctx, pool, workgroup_size),
            };
        }
        AttentionPlan {
            path: AttentionPath::SplitK,
            chunk,
            workgroup_size,
            one_dispatch_max_keys: one_dispatch.min(workgroup_size * max_chunk(pool)),
            subgroups: ctx.has_subgroups(1),
        }
    }
}

/// The buffers an [`Attention`] binds (n_tokens rows; pool shapes: [`PoolShape`]).
pub struct AttentionBuffers<'a> {
    /// [n_tokens, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped).
    pub qkv: &'a wgpu::Buffer,
    /// The layer's pool, holding the sequence's keys 0..=max(positions), the new tokens'
    /// included; key j is in physical block `block_table[table_base + j / block_size]`, slot
    /// j % block_size.
    pub pool: PoolBuffers<'a>,
    /// [n_tokens] u32, token t attends keys 0..=positions[t] (positions >= max_len are clamped
    /// to max_len - 1); read when the kernels run.
    pub positions: &'a wgpu::Buffer,
    /// Uniform buffer (>= 4 bytes) holding the sequence's `table_base` as u32 at offset 0,
    /// written by the engine per step and read when the kernels run.
    pub step: &'a wgpu::Buffer,
    /// [n_tokens, n_heads * head_dim] f32.
    pub out: &'a wgpu::Buffer,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReduceParams {
    n_rows: u32,
    n_heads: u32,
    max_len: u32,
    max_splits: u32,
}

/// Decode & prefill attention over the paged pool, built once per (layer, batch shape) and
/// recorded every step; only the dispatches change with the context, never the bind groups.
pub struct Attention {
    /// Every prebuilt dispatch. Split-K: [one dispatch, splits, reduce]; passes: one per `chunk`
    /// keys of max_len. A step records [`Attention::kernels`], the ones its kv_len needs.
    kernels: Vec<Kernel>,
    plan: AttentionPlan,
    pool: PoolShape,
    /// Invocations per split or pass: row quads x KV heads x head slices.
    items_per_split: u32,
    max_workgroups_per_dim: u32,
    kv_len: u32,
    /// The range of `kernels` one step at the current kv_len records.
    active: Range<usize>,
    /// The one dispatch of workgroup splits ropes and writes the step's heads
    /// ([`Attention::appending_heads`]).
    fresh: bool,
    /// Split-K partial states or the passes' running (max, sum); the bind groups use them.
    _scratch: wgpu::Buffer,
    _state: wgpu::Buffer,
}

impl Attention {
    /// Builds the kernels for `n_tokens` query rows of one sequence over `pool` (plan:
    /// [`AttentionPlan::auto`] when None). Buffers and their shapes: see [`AttentionBuffers`].
    /// Contract: all rows of one dispatch belong to ONE sequence (one table_base).
    /// Positions must stay below the `kv_len` of the last [`Attention::set_kv_len`] (initially
    /// max_len).
    pub fn new(ctx: &Context, buffers: &AttentionBuffers<'_>, pool: PoolShape, n_tokens: u32, plan: Option<AttentionPlan>) -> Result<Attention, GpuError> {
        Attention::build(ctx, buffers, pool, n_tokens, plan, None)
    }

    /// [`Attention::new`] over rows whose q and k heads are not roped yet and whose K/V are not
    /// in the pool yet, as the qkv matmul left them. Where the plan lets one workgroup own each
    /// KV head (split-K with its one dispatch of workgroup splits, `n_tokens * group <= 4`, a
    /// head of at most 128 dims), that dispatch first does for the step's rows what
    /// [`crate::gpu::ops::qkv_heads::qkv_heads`] without norms does, with `rope` = (base,
    /// pairing) and the same arithmetic (bit for bit): ropes the q and k heads in place, writes
    /// the roped k heads and the v heads into the pool at `positions[t]` through the
    /// sequence's table row (`step`). [`Attention::fuses_heads`] says whether a step at the
    /// current kv_len does; when it does not (a longer context on a GPU that then splits over
    /// workgroups, or a plan that never fuses), the caller runs qkv_heads before it.
    ///
    /// Contract: [`Attention::new`]'s, and qkv a buffer of its own (it is written), the pool's
    /// K and V two different buffers, the base finite and > 0.
    pub fn appending_heads(
        ctx: &Context,
        buffers: &AttentionBuffers<'_>,
        pool: PoolShape,
        n_tokens: u32,
        plan: Option<AttentionPlan>,
        rope: (f32, RopePairing),
    ) -> Result<Attention, GpuError> {
        let b = buffers;
        check_fresh(OP, (&pool, rope.0), (b.qkv, b.pool.k, b.pool.v), &[b.pool.block_table, b.positions, b.step, b.out])?;
        Attention::build(ctx, buffers, pool, n_tokens, plan, Some(rope))
    }

    fn build(
        ctx: &Context,
        buffers: &AttentionBuffers<'_>,
        pool: PoolShape,
        n_tokens: u32,
        plan: Option<AttentionPlan>,
        rope: Option<(f32, RopePairing)>,
    ) -> Result<Attention, GpuError> {
        check_pool(OP, &pool)?;
        check_rows(OP, "n_tokens", n_tokens)?;
        let plan = plan.unwrap_or_else(|| AttentionPlan::auto(ctx, n_tokens, &pool));
        check_plan(ctx, (OP, &pool), (plan.chunk, plan.one_dispatch_max_keys), (plan.workgroup_size, plan.subgroups))?;
        let scale_base = check_buffers(ctx, buffers, &pool, n_tokens)?;

        let split = plan.path == AttentionPath::SplitK;
        let shared = !split && plan.subgroups;
        if shared && !shares_loads(ctx, &pool, plan.workgroup_size) {
            return Err(shape_err(OP, "passes with subgroups need subgroups of 8 or more, workgroups of whole 8s and heads of at most 128 dims"));
        }
        let rows = n_tokens as u64 * pool.n_heads as u64;
        let mut quads = (n_tokens as u64 * pool.group() as u64).div_ceil(LANES as u64);
        if shared {
            // Whole workgroups per KV head: no subgroup straddles two.
            quads = quads.next_multiple_of(plan.workgroup_size as u64);
        }
        let items_per_split = quads * pool.n_kv_heads as u64 * slices(&pool) as u64;
        let n_chunks = pool.max_len.div_ceil(plan.chunk);
        let max_splits = if split { n_chunks } else { 1 };
        // attention_reduce.wgsl loops twice over a row's splits, under the same loop budget.
        if 2 * max_splits > MAX_CHUNK {
            return Err(shape_err(OP, format!("{max_splits} splits of {} keys are too many", plan.chunk)));
        }
        if items_per_split * max_splits as u64 > u32::MAX as u64 / 2 {
            return Err(shape_err(OP, format!("{items_per_split} row quads x {max_splits} splits is too many")));
        }
        // Each pass is a prebuilt dispatch with its own uniform and bind group.
        if !split && n_chunks > MAX_PASSES {
            return Err(shape_err(OP, format!("{n_chunks} passes of {} keys are too many", plan.chunk)));
        }
        let params = MainParams::new(&pool, scale_base, n_tokens, quads as u32, max_splits);
        let scratch_bytes = if split { rows * max_splits as u64 * (pool.head_dim as u64 / 4 + 1) * 16 } else { 4 };
        check_binding(ctx, OP, "the split scratch", scratch_bytes)?;
        let scratch = ctx.storage_zeroed("attention.splits", scratch_bytes);
        // Split-K: the workgroup splits' records; passes: each row's (m, l) so far.
        let state_bytes = match split {
            true => records_bytes(ctx, &pool, items_per_split, (plan.workgroup_size, plan.subgroups)),
            false => rows * slices(&pool) as u64 * 16,
        };
        check_binding(ctx, OP, "the workgroup splits' records", state_bytes)?;
        let state = ctx.storage_zeroed("attention.state", state_bytes);
        let fresh = rope.filter(|_| split && owns_kv_heads(plan.one_dispatch_max_keys, quads, &pool));
        let built = Built { buffers, pool: &pool, plan: &plan, params: &params, scratch: &scratch, state: &state };
        let kernels = if split { built.split_kernels(ctx, fresh)? } else { built.pass_kernels(ctx, n_chunks)? };
        let mut attention = Attention {
            kernels,
            plan,
            pool,
            items_per_split: items_per_split as u32,
            max_workgroups_per_dim: ctx.limits.max_compute_workgroups_per_dimension.max(1),
            kv_len: pool.max_len,
            active: 0..0,
            fresh: fresh.is_some(),
            _scratch: scratch,
            _state: state,
        };
        attention.set_kv_len(pool.max_len)?;
        Ok(attention)
    }

    /// Called before recording a step whose longest key range is `kv_len` (max position + 1):
    /// sizes the split dispatch to ceil(kv_len / chunk) splits, or selects ceil(kv_len / chunk)
    /// passes. Bind groups are untouched. kv_len must be in 1..=max_len.
    pub fn set_kv_len(&mut self, kv_len: u32) -> Result<(), GpuError> {
        if kv_len == 0 || kv_len > self.pool.max_len {
            return Err(shape_err(OP, format!("kv_len {kv_len} is outside 1..={}", self.pool.max_len)));
        }
        self.kv_len = kv_len;
        let chunks = kv_len.div_ceil(self.plan.chunk);
        match self.plan.path {
            AttentionPath::SplitK => {
                let items = self.items_per_split as u64 * chunks as u64;
                self.kernels[SPLITS_KERNEL].workgroups = workgroups(self.max_workgroups_per_dim, self.plan.workgroup_size, items);
                self.active = if kv_len <= self.plan.one_dispatch_max_keys { 0..1 } else { SPLITS_KERNEL..3 };
            }
            AttentionPath::Passes => self.active = 0..chunks as usize,
        }
        Ok(())
    }

    /// Whether a step at the current kv_len ropes and writes its heads itself (see
    /// [`Attention::appending_heads`]); if not, qkv_heads must run before it.
    pub fn fuses_heads(&self) -> bool {
        self.fresh && self.active == (0..1)
    }

    /// The kv_len the dispatches are currently sized for.
    pub fn kv_len(&self) -> u32 {
        self.kv_len
    }

    pub fn plan(&self) -> &AttentionPlan {
        &self.plan
    }

    pub fn pool(&self) -> &PoolShape {
        &self.pool
    }

    /// The dispatches of one step at the current kv_len, in order.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels[self.active.clone()]
    }
}

/// Checks the buffers against the shape; returns the word where an INT8 pool's scales start.
fn check_buffers(ctx: &Context, b: &AttentionBuffers<'_>, pool: &PoolShape, n_tokens: u32) -> Result<u32, GpuError> {
    let n = n_tokens as u64;
    check_size(OP, "qkv", b.qkv, n * pool.qkv_row() * 4)?;
    let scale_base = pool.check_buffers(ctx, OP, &b.pool)?;
    check_size(OP, "positions", b.positions, n * 4)?;
    check_size(OP, "step", b.step, 4)?;
    check_size(OP, "out", b.out, n * pool.out_row() * 4)?;
    // The whole buffers are bound; check what is bound, not just what is needed.
    check_binding(ctx, OP, "qkv", b.qkv.size())?;
    check_binding(ctx, OP, "out", b.out.size())?;
    Ok(scale_base)
}

/// What the kernels of one [`Attention`] are built from.
struct Built<'a> {
    buffers: &'a AttentionBuffers<'a>,
    pool: &'a PoolShape,
    plan: &'a AttentionPlan,
    params: &'a MainParams,
    scratch: &'a wgpu::Buffer,
    state: &'a wgpu::Buffer,
}

impl Built<'_> {
    /// A main kernel of attention.wgsl writing `dst`, with its own parameters (`params`, then the
    /// fresh kernel's `turns`), sized for one split's or pass's invocations (`per_workgroup` items
    /// per workgroup: the workgroup size, or 1 for workgroup splits).
    fn main(
        &self,
        ctx: &Context,
        (name, pipeline): (&'static str, &std::sync::Arc<wgpu::ComputePipeline>),
        (params, turns, per_workgroup): (&MainParams, &[u32], u32),
        dst: &wgpu::Buffer,
    ) -> Kernel {
        let b = self.buffers;
        let extra = [b.positions, self.state, b.step];
        let bindings = MainBindings { qkv: b.qkv, pool: &b.pool, dst, extra: &extra };
        let mut kernel = main_kernel(ctx, name, pipeline, &bindings, (params, turns));
        let max = ctx.limits.max_compute_workgroups_per_dimension.max(1);
        kernel.workgroups = workgroups(max, per_workgroup, self.params.items_per_split as u64);
        kernel
    }

    /// [one dispatch (workgroup splits), splits, reduce]; with `fresh` (the rope's base and
    /// pairing) the first ropes and writes the step's heads.
    fn split_kernels(&self, ctx: &Context, fresh: Option<(f32, RopePairing)>) -> Result<Vec<Kernel>, GpuError> {
        let (pool, plan, out) = (self.pool, self.plan, self.buffers.out);
        let wg = plan.workgroup_size;
        let variant = (wg, plan.subgroups);
        let pairing = fresh.map(|(_, pairing)| pairing);
        let one_pipeline = main_pipeline(ctx, ("attention", pool), KernelMode::WorkgroupSplits, plan.chunk, variant, pairing)?;
        let turns = fresh.map(|(base, _)| turn_table(base, pool.head_dim).to_vec()).unwrap_or_default();
        let one = self.main(ctx, ("attention.one", &one_pipeline), (self.params, &turns, 1), out);
        let splits_pipeline = main_pipeline(ctx, ("attention", pool), KernelMode::Splits, plan.chunk, variant, None)?;
        let splits = self.main(ctx, ("attention.splits", &splits_pipeline), (self.params, &[], wg), self.scratch);
        let rows = self.params.rows * pool.n_heads;
        let reduce_params = ReduceParams { n_rows: rows, n_heads: pool.n_heads, max_len: pool.max_len, max_splits: self.params.max_splits };
        let reduce_buf = ctx.params_init("attention.reduce.params", bytemuck::bytes_of(&reduce_params));
        let max = ctx.limits.max_compute_workgroups_per_dimension.max(1);
        let reduce = Kernel::new(
            ctx,
            "attention.reduce",
            reduce_pipeline(ctx, "attention_reduce", pool, plan.chunk, wg)?,
            &[whole(self.buffers.positions), whole(self.scratch), whole(out), whole(&reduce_buf)],
            workgroups(max, wg, rows as u64 * pool.head_dim as u64 / 4),
            None,
        )
        .owning(reduce_buf);
        Ok(vec![one, splits, reduce])
    }

    /// One pass per `chunk` keys of max_len.
    fn pass_kernels(&self, ctx: &Context, n_chunks: u32) -> Result<Vec<Kernel>, GpuError> {
        let wg = self.plan.workgroup_size;
        let variant = (wg, self.plan.subgroups);
        let pipeline = main_pipeline(ctx, ("attention", self.pool), KernelMode::Whole, self.plan.chunk, variant, None)?;
        let pass = |p: u32| {
            let params = MainParams { pass_begin: p * self.plan.chunk, ..*self.params };
            self.main(ctx, ("attention.pass", &pipeline), (&params, &[], wg), self.buffers.out)
        };
        Ok((0..n_chunks).map(pass).collect())
    }
}
