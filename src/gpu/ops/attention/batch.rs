//! [`AttentionBatch`]: batched decode attention for continuous batching, one dispatch over
//! `n_rows` query rows where each row belongs to its own sequence (its own block-table row and
//! key count), e.g. the decode token of every running sequence, plus any prefill rows of a new one
//! (a row per token, kv_len = position + 1).
//!
//! The rows of a step are described by the host in a small storage buffer (the *batch buffer*,
//! layout in [`AttentionBatch::step`]), written once per step and shared by every layer, so one
//! built attention serves any mix of sequences and lengths without new bind groups.
//!
//! Plans (`shaders/attention_batch.wgsl` + `attention_batch_reduce.wgsl`):
//! - split-K (flash-decoding): each row's keys are cut into `chunk`-key splits, numbered across
//!   the batch, one invocation each (per KV head and group of up to 4 query heads), then a reduce
//!   kernel combines them. The dispatch is sized by the step's total number of splits, so a row of
//!   4,000 keys gets 32 invocations per KV head and a row of 100 keys one, and no invocation is
//!   spent on the gap between a short row and the longest.
//! - one dispatch when every row has at most `one_dispatch_max_keys` keys (every step on CPU
//!   adapters): a workgroup per (row, KV head, head quad, slice) whose invocations split the
//!   row's keys and combine them in the workgroup, no reduce.
//!
//! Rows are never packed together because different sequences read different keys. Prefill rows
//! are correct here but each reads its keys alone; a long prefill chunk is cheaper through
//! [`super::Attention`]'s passes, which share every K/V load among 4 rows.
//!
//! [`AttentionBatch::appending_heads`] builds one whose one dispatch also ropes the step's heads
//! and writes their K/V ([`crate::gpu::ops::qkv_heads::qkv_heads`]' work without head norms, bit
//! for bit) in a step where each sequence has one row and a workgroup owns each (row, KV head):
//! `shaders/attention_fresh.wgsl`, as [`super::Attention::appending_heads`].
//!
//! Bindings: 8 storage buffers (WebGPU's default limit per stage: the prelude's 7 and the batch
//! buffer); K/V are bound as `vec4<u32>` for both dtypes (INT8 codes and scales in the same
//! buffers).

use std::ops::Range;

use super::{
    check_fresh, check_plan, check_pool, check_rows, class_plan, main_kernel, main_pipeline, max_chunk, owns_kv_heads, records_bytes, reduce_pipeline,
    workgroups, KernelMode, MainBindings, MainParams, LANES, MAX_CHUNK,
};
use crate::gpu::ops::pool::{PoolBuffers, PoolShape};
use crate::gpu::ops::rope::turn_table;
use crate::gpu::ops::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::model::RopePairing;

const OP: &str = "attention_batch";
/// Most rows of one batch (keeps the row search's back-edges and the u32 indices small).
pub const MAX_ROWS: u32 = 65_536;
/// Kernels are [one dispatch (workgroup splits), splits, reduce].
const ONE_KERNEL: usize = 0;
const SPLITS_KERNEL: usize = 1;

/// Kernel plan. [`BatchPlan::auto`] picks one from the adapter; the fields are public for tests
/// and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Keys per split; at most [`MAX_CHUNK`]. The batch buffer's `first_split` depends on it.
    pub chunk: u32,
    pub workgroup_size: u32,
    /// Steps whose longest row has at most this many keys run one dispatch, its workgroups each
    /// splitting one row's keys over their invocations, instead of splits + reduce (at most
    /// `workgroup_size` times [`super::max_chunk`]; 0 splits every step that has a key).
    pub one_dispatch_max_keys: u32,
    /// Combine the workgroup splits with subgroup reductions (needs [`Context::has_subgroups`]).
    pub subgroups: bool,
}

impl BatchPlan {
    /// The adapter class's plan over `pool` (`class_plan` in the module: one dispatch at every
    /// length on CPU adapters), subgroups wherever the device has them.
    pub fn auto(ctx: &Context, pool: &PoolShape) -> BatchPlan {
        let (workgroup_size, one_dispatch, chunk) = class_plan(ctx, pool.max_len);
        BatchPlan { chunk, workgroup_size, one_dispatch_max_keys: one_dispatch.min(workgroup_size * max_chunk(pool)), subgroups: ctx.has_subgroups(1) }
    }
}

/// One query row of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    /// The row's sequence's first entry in the block-table buffer (`KvCache::table_base`).
    pub table_base: u32,
    /// Keys the row attends: 0..kv_len of its sequence, i.e. its position + 1. 0 marks a padding
    /// row, whose output is zeros.
    pub kv_len: u32,
}

/// One step's rows, encoded for the batch buffer by [`AttentionBatch::step`]: write
/// [`BatchStep::bytes`] into the batch buffer once per step (all layers share it), and pass the
/// step to [`AttentionBatch::set_step`] of every layer before recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchStep {
    words: Vec<u32>,
    chunk: u32,
    n_rows: u32,
    total_splits: u32,
    max_kv_len: u32,
    /// No two rows with keys share a table_base: each sequence has one row.
    one_row_each: bool,
}

impl BatchStep {
    /// Bytes of a batch buffer for up to `max_rows` rows: a header and one record per row, 16
    /// bytes each.
    pub fn buffer_bytes(max_rows: u32) -> u64 {
        (1 + max_rows as u64) * 16
    }

    /// The batch buffer's contents: (n_rows, total_splits, one row per sequence (1) or not (0),
    /// 0), then per row
    /// (table_base, kv_len, first_split, 0), as u32.
    pub fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }

    pub fn n_rows(&self) -> u32 {
        self.n_rows
    }

    /// Splits of `chunk` keys over all rows (the split kernel's invocations per KV head and quad).
    pub fn total_splits(&self) -> u32 {
        self.total_splits
    }

    /// The longest row's kv_len.
    pub fn max_kv_len(&self) -> u32 {
        self.max_kv_len
    }
}

/// The buffers a batched attention binds (max_rows rows; pool shapes: [`PoolShape`]).
pub struct BatchBuffers<'a> {
    /// [max_rows, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped).
    pub qkv: &'a wgpu::Buffer,
    /// The layer's pool; key j of a row is in physical block `block_table[table_base + j /
    /// block_size]`, slot `j % block_size`.
    pub pool: PoolBuffers<'a>,
    /// [`BatchStep::buffer_bytes`] bytes (STORAGE | COPY_DST), holding [`BatchStep::bytes`] when
    /// the kernels run.
    pub batch: &'a wgpu::Buffer,
    /// [max_rows, n_heads * head_dim] f32; rows 0..n_rows of a step are written.
    pub out: &'a wgpu::Buffer,
    /// The scratch, [`AttentionBatch::scratch_bytes`] bytes (the split records, then the
    /// workgroup splits' records); None allocates one. Layers recorded one after the other in one
    /// submission may share one (each layer's kernels read it before the next layer's write it).
    pub scratch: Option<&'a wgpu::Buffer>,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReduceParams {
    max_rows: u32,
    n_heads: u32,
    max_len: u32,
    _pad: u32,
}

/// The split-K reduce of an [`AttentionBatch`] of `max_rows` rows over `pool` with `plan`,
/// reading the batch buffer and the split records in `scratch`, writing `out`. Its workgroups are
/// set per step.
fn reduce_kernel(
    ctx: &Context,
    (pool, plan, max_rows): (&PoolShape, &BatchPlan, u32),
    (batch, scratch, out): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
) -> Result<Kernel, GpuError> {
    let reduce_params = ReduceParams { max_rows, n_heads: pool.n_heads, max_len: pool.max_len, _pad: 0 };
    let reduce_buf = ctx.params_init("attention_batch.reduce.params", bytemuck::bytes_of(&reduce_params));
    let pipeline = reduce_pipeline(ctx, "attention_batch_reduce", pool, plan.chunk, plan.workgroup_size)?;
    let resources = [whole(batch), whole(scratch), whole(out), whole(&reduce_buf)];
    Ok(Kernel::new(ctx, "attention_batch.reduce", pipeline, &resources, [1, 1, 1], None).owning(reduce_buf))
}

/// Batched decode attention over the paged pool, built once per layer and recorded every step;
/// only the dispatch sizes change with the step's rows, never the bind groups.
pub struct AttentionBatch {
    /// [one dispatch, splits, reduce]. Record [`AttentionBatch::kernels`], the ones the current
    /// step needs.
    kernels: Vec<Kernel>,
    plan: BatchPlan,
    pool: PoolShape,
    max_rows: u32,
    /// Items per row (one dispatch) or per split: KV heads x head quads x head slices.
    items_per_split: u32,
    max_workgroups_per_dim: u32,
    active: Range<usize>,
    /// The one dispatch ropes and writes the step's heads ([`AttentionBatch::appending_heads`]),
    /// and the current step lets it.
    fresh: bool,
    fuses: bool,
    _scratch: Option<wgpu::Buffer>,
}

impl AttentionBatch {
    /// Builds the kernels for steps of up to `max_rows` rows (at most [`MAX_ROWS`]) over `pool`
    /// (plan: [`BatchPlan::auto`] when None). Buffers and their shapes: see [`BatchBuffers`]. No
    /// step is set: [`AttentionBatch::kernels`] is empty until [`AttentionBatch::set_step`].
    pub fn new(ctx: &Context, buffers: &BatchBuffers<'_>, pool: PoolShape, max_rows: u32, plan: Option<BatchPlan>) -> Result<AttentionBatch, GpuError> {
        AttentionBatch::build(ctx, buffers, pool, max_rows, plan, None)
    }

    /// [`AttentionBatch::new`] over rows whose q and k heads are not roped yet and whose K/V are
    /// not in the pool yet, as the qkv matmul left them. Where a workgroup owns each (row, KV
    /// head) (at most 4 query heads per KV head, a head of at most 128 dims), the one dispatch of
    /// a step in which each sequence has one row first does for its row what
    /// [`crate::gpu::ops::qkv_heads::qkv_heads`] without norms does, with `rope` = (base,
    /// pairing) and the same arithmetic (bit for bit): ropes the q and k heads in place, writes
    /// the roped k heads and the v heads into the pool at position kv_len - 1 of the row's
    /// sequence. [`AttentionBatch::fuses_heads`] says whether the current step does; when it does
    /// not, the caller runs qkv_heads before it.
    ///
    /// Contract: [`AttentionBatch::new`]'s, and qkv a buffer of its own (it is written), the
    /// pool's K and V two different buffers, the base finite and > 0.
    pub fn appending_heads(
        ctx: &Context,
        buffers: &BatchBuffers<'_>,
        pool: PoolShape,
        max_rows: u32,
        plan: Option<BatchPlan>,
        rope: (f32, RopePairing),
    ) -> Result<AttentionBatch, GpuError> {
        let b = buffers;
        let others: Vec<&wgpu::Buffer> = [b.pool.block_table, b.batch, b.out].into_iter().chain(b.scratch).collect();
        check_fresh(OP, (&pool, rope.0), (b.qkv, b.pool.k, b.pool.v), &others)?;
        AttentionBatch::build(ctx, buffers, pool, max_rows, plan, Some(rope))
    }

    fn build(
        ctx: &Context,
        buffers: &BatchBuffers<'_>,
        pool: PoolShape,
        max_rows: u32,
        plan: Option<BatchPlan>,
        rope: Option<(f32, RopePairing)>,
    ) -> Result<AttentionBatch, GpuError> {
        check_pool(OP, &pool)?;
        check_rows(OP, "max_rows", max_rows)?;
        if max_rows > MAX_ROWS {
            return Err(shape_err(OP, format!("max_rows {max_rows} is over {MAX_ROWS}")));
        }
        let plan = plan.unwrap_or_else(|| BatchPlan::auto(ctx, &pool));
        check_plan(ctx, (OP, &pool), (plan.chunk, plan.one_dispatch_max_keys), (plan.workgroup_size, plan.subgroups))?;
        let b = buffers;
        check_size(OP, "qkv", b.qkv, max_rows as u64 * pool.qkv_row() * 4)?;
        let scale_base = pool.check_buffers(ctx, OP, &b.pool)?;
        check_size(OP, "batch", b.batch, BatchStep::buffer_bytes(max_rows))?;
        check_size(OP, "out", b.out, max_rows as u64 * pool.out_row() * 4)?;
        let max_splits = pool.max_len.div_ceil(plan.chunk);
        // attention_batch_reduce.wgsl loops twice over a row's splits, under the same budget.
        if 2 * max_splits > MAX_CHUNK {
            return Err(shape_err(OP, format!("{max_splits} splits of {} keys are too many", plan.chunk)));
        }
        let quads = pool.group().div_ceil(LANES);
        let params = MainParams::new(&pool, scale_base, max_rows, quads, 1);
        if max_rows as u64 * max_splits as u64 * params.items_per_split as u64 > u32::MAX as u64 / 2 {
            return Err(shape_err(OP, format!("{max_rows} rows x {max_splits} splits is too many")));
        }
        let scratch_bytes = AttentionBatch::scratch_bytes(ctx, &pool, max_rows, &plan);
        check_binding(ctx, OP, "the scratch", scratch_bytes)?;
        let owned_scratch = match b.scratch {
            Some(buf) => {
                check_size(OP, "scratch", buf, scratch_bytes)?;
                None
            }
            None => Some(ctx.storage_zeroed("attention_batch.splits", scratch_bytes)),
        };
        let scratch = b.scratch.or(owned_scratch.as_ref()).ok_or_else(|| shape_err(OP, "no split scratch"))?;
        // The whole buffers are bound; check what is bound, not just what is needed.
        for (what, buf) in [("qkv", b.qkv), ("batch", b.batch), ("out", b.out), ("scratch", scratch)] {
            check_binding(ctx, OP, what, buf.size())?;
        }

        let wg = plan.workgroup_size;
        // The splits kernel never touches the records binding; a buffer of its own stands in
        // there (not the scratch, which it writes through another binding).
        let unused = ctx.storage_zeroed("attention_batch.unused", 16);
        // One workgroup per (row, KV head) in the one dispatch: it may write what it alone reads.
        let fresh = rope.filter(|_| owns_kv_heads(plan.one_dispatch_max_keys, quads as u64, &pool));
        let main = |name: &'static str, mode: KernelMode, (dst, state): (&wgpu::Buffer, &wgpu::Buffer), fresh: Option<(f32, RopePairing)>| {
            let pairing = fresh.map(|(_, pairing)| pairing);
            let pipeline = main_pipeline(ctx, ("attention_batch", &pool), mode, plan.chunk, (wg, plan.subgroups), pairing)?;
            let bindings = MainBindings { qkv: b.qkv, pool: &b.pool, dst, extra: &[b.batch, state] };
            let turns = fresh.map(|(base, _)| turn_table(base, pool.head_dim).to_vec()).unwrap_or_default();
            Ok::<_, GpuError>(main_kernel(ctx, name, &pipeline, &bindings, (&params, &turns)))
        };
        // Built even when one_dispatch_max_keys is 0: a step without keys (only padding rows)
        // still writes its zeros through it.
        let one = main("attention_batch.one", KernelMode::WorkgroupSplits, (b.out, scratch), fresh)?;
        let splits = main("attention_batch.splits", KernelMode::Splits, (scratch, &unused), None)?.owning(unused);
        let reduce = reduce_kernel(ctx, (&pool, &plan, max_rows), (b.batch, scratch, b.out))?;
        Ok(AttentionBatch {
            kernels: vec![one, splits, reduce],
            plan,
            pool,
            max_rows,
            items_per_split: params.items_per_split,
            max_workgroups_per_dim: ctx.limits.max_compute_workgroups_per_dimension.max(1),
            active: 0..0,
            fresh: fresh.is_some(),
            fuses: false,
            _scratch: owned_scratch,
        })
    }

    /// Bytes of the scratch on this device for a pool, a batch capacity and a plan: the larger
    /// of the split records of the worst step, max_rows rows of max_len keys, as [max_rows *
    /// ceil(max_len / chunk) * n_heads, 1 + head_dim/4] vec4, and the workgroup splits' records
    /// of max_rows rows (attention_common.wgsl's `state`; none where a workgroup is one subgroup).
    pub fn scratch_bytes(ctx: &Context, pool: &PoolShape, max_rows: u32, plan: &BatchPlan) -> u64 {
        let max_splits = pool.max_len.div_ceil(plan.chunk.max(1)) as u64;
        let splits = max_rows as u64 * max_splits * pool.n_heads as u64 * (pool.head_dim as u64 / 4 + 1) * 16;
        let items = pool.group().div_ceil(LANES) as u64 * pool.n_kv_heads as u64 * super::slices(pool) as u64;
        splits.max(records_bytes(ctx, pool, max_rows as u64 * items, (plan.workgroup_size.max(1), plan.subgroups)))
    }

    /// Encodes a step's rows (row r = qkv row r = out row r) for the batch buffer:
    /// - `batch[0] = (n_rows, total_splits, one_row_each, 0)`, one_row_each 1 when no two rows
    ///   with keys share a table_base (the fresh kernel ropes and writes the heads only then),
    /// - `batch[1 + r] = (table_base, kv_len, first_split, 0)` where `first_split` is the sum of
    ///   ceil(kv_len / chunk) over rows 0..r (row r's splits are the global splits
    ///   first_split..first_split + ceil(kv_len / chunk); the kernels find a split's row by
    ///   binary search over this ascending field),
    ///
    /// as u32 words, 16 bytes per record. It depends on the plan's chunk only: every layer built
    /// with the same shape and plan accepts the same step. Errors: more rows than max_rows, a
    /// kv_len over max_len.
    pub fn step(&self, rows: &[BatchRow]) -> Result<BatchStep, GpuError> {
        if rows.len() > self.max_rows as usize {
            return Err(shape_err(OP, format!("{} rows do not fit a batch of {}", rows.len(), self.max_rows)));
        }
        let mut words = vec![0u32; 4];
        let mut total_splits = 0u32;
        let mut max_kv_len = 0;
        // No earlier row with keys shares a later one's table_base (a batch is a few rows: a scan,
        // nothing allocated).
        let one_row_each =
            rows.iter().enumerate().filter(|(_, a)| a.kv_len > 0).all(|(i, a)| rows[..i].iter().all(|b| b.kv_len == 0 || b.table_base != a.table_base));
        for (r, row) in rows.iter().enumerate() {
            if row.kv_len > self.pool.max_len {
                return Err(shape_err(OP, format!("row {r}: kv_len {} is over max_len {}", row.kv_len, self.pool.max_len)));
            }
            words.extend([row.table_base, row.kv_len, total_splits, 0]);
            // Bounded by max_rows * ceil(max_len / chunk), checked against u32 when built.
            total_splits += row.kv_len.div_ceil(self.plan.chunk);
            max_kv_len = max_kv_len.max(row.kv_len);
        }
        words[0] = rows.len() as u32;
        words[1] = total_splits;
        words[2] = one_row_each as u32;
        Ok(BatchStep { words, chunk: self.plan.chunk, n_rows: rows.len() as u32, total_splits, max_kv_len, one_row_each })
    }

    /// Sizes the dispatches for `step` (encoded by [`AttentionBatch::step`] of an attention with
    /// the same shape and chunk, and written into the batch buffer before the kernels run): a
    /// one dispatch when its longest row has at most `one_dispatch_max_keys` keys, else splits +
    /// reduce. Bind groups are untouched.
    pub fn set_step(&mut self, step: &BatchStep) -> Result<(), GpuError> {
        if step.chunk != self.plan.chunk || step.n_rows > self.max_rows {
            return Err(shape_err(
                OP,
                format!("a step encoded for chunk {} and {} rows does not fit chunk {} and {} rows", step.chunk, step.n_rows, self.plan.chunk, self.max_rows),
            ));
        }
        let wg = self.plan.workgroup_size;
        let max = self.max_workgroups_per_dim;
        let items = self.items_per_split as u64;
        if step.n_rows == 0 {
            self.active = 0..0;
        } else if step.max_kv_len <= self.plan.one_dispatch_max_keys || step.total_splits == 0 {
            // A workgroup per row's item.
            self.kernels[ONE_KERNEL].workgroups = workgroups(max, 1, step.n_rows as u64 * items);
            self.active = ONE_KERNEL..ONE_KERNEL + 1;
        } else {
            self.kernels[SPLITS_KERNEL].workgroups = workgroups(max, wg, step.total_splits as u64 * items);
            let reduce_items = step.n_rows as u64 * self.pool.out_row() / 4;
            self.kernels[SPLITS_KERNEL + 1].workgroups = workgroups(max, wg, reduce_items);
            self.active = SPLITS_KERNEL..SPLITS_KERNEL + 2;
        }
        self.fuses = self.fresh && step.one_row_each && self.active == (ONE_KERNEL..ONE_KERNEL + 1);
        Ok(())
    }

    /// Whether the current step's one dispatch ropes and writes its heads itself (see
    /// [`AttentionBatch::appending_heads`]); if not, qkv_heads must run before it.
    pub fn fuses_heads(&self) -> bool {
        self.fuses
    }

    /// The dispatches of the current step, in order (none before the first
    /// [`AttentionBatch::set_step`] or for a step of 0 rows).
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels[self.active.clone()]
    }

    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    pub fn pool(&self) -> &PoolShape {
        &self.pool
    }

    /// Rows the qkv, out and batch buffers hold; a step may use fewer.
    pub fn max_rows(&self) -> u32 {
        self.max_rows
    }
}
