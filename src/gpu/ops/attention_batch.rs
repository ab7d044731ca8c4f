//! Batched decode attention for continuous batching: one dispatch over `n_rows` query rows where
//! each row belongs to its own sequence (its own block-table row and key count), e.g. the decode
//! token of every running sequence, plus any prefill rows of a new one (a row per token, kv_len =
//! position + 1). Causal llama attention, GQA, scale 1/sqrt(head_dim), softmax in f32, over the
//! same paged pool and block-table buffer as [`super::attention::Attention`].
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
//! - a single pass when every row has at most `single_pass_max_keys` keys: one invocation per
//!   (row, KV head, head quad), no reduce.
//!
//! An invocation reads each K/V vec4 once for the up to 4 query heads of its KV head (SmolLM2: the
//! 3 heads of a group); rows are never packed together because different sequences read
//! different keys. No shared memory, no barriers (costly on lavapipe and SwiftShader). Prefill
//! rows are correct here but each reads its keys alone; a long prefill chunk is cheaper through
//! [`super::attention::Attention`]'s passes, which share every K/V load among 4 rows.
//!
//! The pools are f32 or INT8 ([`crate::quant::kv_int8`], [`BatchShape::dtype`]), as in
//! [`super::attention::Attention::paged_dtype`]: INT8 codes are dequantized in registers as they
//! are loaded (the key's scale multiplies its scores once, the value's scale folds into its
//! softmax weight), never into an f32 copy of the cache. The dtype is an override constant, so
//! the f32 pipeline is the same code as without INT8 support.
//!
//! Bindings: 6 storage buffers (of WebGPU's default 8 per stage) and a uniform; K/V are bound
//! as `vec4<u32>` for both dtypes (INT8 codes and scales in the same buffers).
//!
//! Loop budget: lavapipe ends all loops of an invocation after 65,535 back-edges in total,
//! silently; an invocation here takes at most `chunk` keys (plus a row search of
//! log2(max_rows) + 1 steps), and the reduce loops twice over a row's splits.
//!
//! Like [`super::attention::Attention`], the key loop is written out per vec4 of head_dim: a new
//! pipeline compiles at its first dispatch in about a second on lavapipe and seconds on
//! SwiftShader; build and run once at load time.

use std::ops::Range;

use super::attention::{attention_cpu, AttentionShape};
use super::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::kv_int8::Int8Layout;
use crate::quant::KvDtype;

const OP: &str = "attention_batch";
/// attention_batch.wgsl writes the key loop out for up to 32 vec4 of head_dim.
const MAX_HEAD_DIM: u32 = 128;
/// Query heads per invocation (the components of a vec4).
const HEADS_PER_ITEM: u32 = 4;
/// Keys one invocation may take: lavapipe's 65,535 loop back-edges, less a margin for the row
/// search and the write-out.
pub const MAX_CHUNK: u32 = 65_000;
/// Most rows of one batch (keeps the row search's back-edges and the u32 indices small).
pub const MAX_ROWS: u32 = 65_536;
/// Kernels are [single pass, splits, reduce].
const SINGLE_KERNEL: usize = 0;
const SPLITS_KERNEL: usize = 1;

/// The fixed sizes of a batched attention, chosen when it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    /// Query rows the qkv, out and batch buffers hold; a step may use fewer.
    pub max_rows: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// The longest sequence in keys (max_seq_len): no row attends more; sizes the split scratch.
    pub max_len: u32,
    /// Keys per block of the pool.
    pub block_size: u32,
    /// Blocks in the pool.
    pub n_blocks: u32,
    /// The pools' element type: f32, or INT8 ([`Int8Layout`] buffers; head_dim a multiple of 16).
    pub dtype: KvDtype,
}

impl BatchShape {
    fn check(&self) -> Result<(), GpuError> {
        let s = self;
        if s.max_rows == 0
            || s.n_heads == 0
            || s.n_kv_heads == 0
            || s.max_len == 0
            || s.block_size == 0
            || s.n_blocks == 0
        {
            return Err(shape_err(OP, format!("empty shape {s:?}")));
        }
        if s.max_rows > MAX_ROWS {
            return Err(shape_err(OP, format!("max_rows {} is over {MAX_ROWS}", s.max_rows)));
        }
        if s.n_heads % s.n_kv_heads != 0 {
            return Err(shape_err(OP, format!("n_kv_heads {} does not divide n_heads {}", s.n_kv_heads, s.n_heads)));
        }
        if s.head_dim == 0 || s.head_dim % 4 != 0 || s.head_dim > MAX_HEAD_DIM {
            return Err(shape_err(
                OP,
                format!("head_dim {} must be a positive multiple of 4 up to {MAX_HEAD_DIM}", s.head_dim),
            ));
        }
        if s.dtype == KvDtype::Int8 {
            s.int8_layout()?;
        }
        Ok(())
    }

    fn int8_layout(&self) -> Result<Int8Layout, GpuError> {
        Int8Layout::new(self.n_blocks, self.n_kv_heads, self.block_size, self.head_dim)
            .map_err(|e| shape_err(OP, e.to_string()))
    }

    /// Bytes of one of the K / V pool buffers for the shape's dtype, and the word where an INT8
    /// pool's scales start (0 for f32). Errors: a pool whose vec4 indices overflow u32.
    fn pool_bytes(&self) -> Result<(u64, u32), GpuError> {
        match self.dtype {
            KvDtype::F32 => {
                if self.pool_len() / 4 > u32::MAX as u64 {
                    return Err(shape_err(OP, format!("a pool of {} elements overflows u32 indices", self.pool_len())));
                }
                Ok((self.pool_len() * 4, 0))
            }
            KvDtype::Int8 => {
                let layout = self.int8_layout()?;
                Ok((layout.buffer_bytes(), layout.data_words() as u32))
            }
        }
    }

    /// Elements (keys x head dims) in one of the K / V pools, whatever the dtype.
    pub fn pool_len(&self) -> u64 {
        self.n_blocks as u64 * self.n_kv_heads as u64 * self.block_size as u64 * self.head_dim as u64
    }

    /// Query heads per KV head.
    pub fn group(&self) -> u32 {
        self.n_heads / self.n_kv_heads
    }

    /// f32 elements in one row of the fused qkv buffer.
    pub fn qkv_row(&self) -> u64 {
        (self.n_heads + 2 * self.n_kv_heads) as u64 * self.head_dim as u64
    }

    /// f32 elements in one row of the output.
    pub fn out_row(&self) -> u64 {
        self.n_heads as u64 * self.head_dim as u64
    }

    /// Bytes of the batch buffer: a header and one record per row, 16 bytes each.
    pub fn batch_bytes(&self) -> u64 {
        (1 + self.max_rows as u64) * 16
    }
}

/// Kernel plan. [`BatchPlan::auto`] picks one from the adapter; the fields are public for tests
/// and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Keys per split; at most [`MAX_CHUNK`]. The batch buffer's `first_split` depends on it.
    pub chunk: u32,
    pub workgroup_size: u32,
    /// Steps whose longest row has at most this many keys run one single-pass dispatch instead
    /// of splits + reduce (at most [`MAX_CHUNK`]; 0 splits every step that has a key).
    pub single_pass_max_keys: u32,
}

impl BatchPlan {
    /// 128-key splits, one single pass up to 256 keys: the crossover measured for the
    /// single-sequence kernel on both software adapters (about 256-512 keys).
    pub fn auto(ctx: &Context) -> BatchPlan {
        BatchPlan {
            chunk: 128,
            // Software adapters want small workgroups (many to spread over cores, no barriers).
            workgroup_size: if ctx.is_cpu() { 8 } else { 64 },
            single_pass_max_keys: 256,
        }
    }

    fn check(&self, ctx: &Context) -> Result<(), GpuError> {
        if self.chunk == 0 || self.chunk > MAX_CHUNK {
            return Err(shape_err(
                OP,
                format!("chunk {} is outside 1..={MAX_CHUNK} keys (lavapipe's loop budget)", self.chunk),
            ));
        }
        if self.single_pass_max_keys > MAX_CHUNK {
            return Err(shape_err(
                OP,
                format!("single_pass_max_keys {} is over {MAX_CHUNK}", self.single_pass_max_keys),
            ));
        }
        if self.workgroup_size == 0 || self.workgroup_size > ctx.limits.max_compute_invocations_per_workgroup {
            return Err(shape_err(OP, format!("workgroup size {} is unsupported", self.workgroup_size)));
        }
        Ok(())
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
}

impl BatchStep {
    /// The batch buffer's contents: (n_rows, total_splits, 0, 0), then per row
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

/// The buffers a batched attention binds. Shapes are those of [`AttentionBatch::new`].
pub struct BatchBuffers<'a> {
    /// [max_rows, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped).
    pub qkv: &'a wgpu::Buffer,
    /// f32: [n_blocks, n_kv_heads, block_size, head_dim] f32: element (b, h, s, d) at
    /// `((b * n_kv_heads + h) * block_size + s) * head_dim + d`. INT8: an [`Int8Layout`] buffer of
    /// (n_blocks, n_kv_heads, block_size, head_dim), codes in the same order, then the scales.
    pub k_pool: &'a wgpu::Buffer,
    /// Same layout as `k_pool`.
    pub v_pool: &'a wgpu::Buffer,
    /// u32: key j of a row is in physical block `block_table[table_base + j / block_size]`, slot
    /// `j % block_size`; an index past the buffer's end or a block >= n_blocks masks those keys.
    pub block_table: &'a wgpu::Buffer,
    /// [`BatchShape::batch_bytes`] bytes (STORAGE | COPY_DST), holding [`BatchStep::bytes`] when
    /// the kernels run.
    pub batch: &'a wgpu::Buffer,
    /// [max_rows, n_heads * head_dim] f32; rows 0..n_rows of a step are written.
    pub out: &'a wgpu::Buffer,
    /// The split scratch, [`AttentionBatch::scratch_bytes`] bytes; None allocates one. Layers
    /// recorded one after the other in one submission may share one (each layer's reduce reads
    /// it before the next layer's splits write it).
    pub scratch: Option<&'a wgpu::Buffer>,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MainParams {
    max_rows: u32,
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
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReduceParams {
    max_rows: u32,
    n_heads: u32,
    max_len: u32,
    _pad: u32,
}

/// Batched decode attention over the paged pool, built once per layer and recorded every step;
/// only the dispatch sizes change with the step's rows, never the bind groups.
pub struct AttentionBatch {
    /// [single pass, splits, reduce]. Record [`AttentionBatch::kernels`], the ones the current
    /// step needs.
    kernels: Vec<Kernel>,
    plan: BatchPlan,
    shape: BatchShape,
    /// Invocations per row (single pass) or per split: KV heads x head quads.
    items_per_split: u32,
    max_workgroups_per_dim: u32,
    active: Range<usize>,
    _scratch: Option<wgpu::Buffer>,
}

impl AttentionBatch {
    /// Builds the kernels (plan: [`BatchPlan::auto`] when None). Buffers and their shapes: see
    /// [`BatchBuffers`]. No step is set: [`AttentionBatch::kernels`] is empty until
    /// [`AttentionBatch::set_step`].
    pub fn new(
        ctx: &Context,
        buffers: &BatchBuffers<'_>,
        shape: BatchShape,
        plan: Option<BatchPlan>,
    ) -> Result<AttentionBatch, GpuError> {
        shape.check()?;
        let plan = plan.unwrap_or_else(|| BatchPlan::auto(ctx));
        plan.check(ctx)?;
        let s = shape;
        let b = buffers;
        let (pool_bytes, scale_base) = s.pool_bytes()?;
        check_size(OP, "qkv", b.qkv, s.max_rows as u64 * s.qkv_row() * 4)?;
        check_size(OP, "k_pool", b.k_pool, pool_bytes)?;
        check_size(OP, "v_pool", b.v_pool, pool_bytes)?;
        check_size(OP, "block_table", b.block_table, 4)?;
        check_size(OP, "batch", b.batch, s.batch_bytes())?;
        check_size(OP, "out", b.out, s.max_rows as u64 * s.out_row() * 4)?;
        let max_splits = s.max_len.div_ceil(plan.chunk);
        // attention_batch_reduce.wgsl loops twice over a row's splits, under the same budget.
        if 2 * max_splits > MAX_CHUNK {
            return Err(shape_err(OP, format!("{max_splits} splits of {} keys are too many", plan.chunk)));
        }
        let quads = s.group().div_ceil(HEADS_PER_ITEM);
        let items_per_split = quads * s.n_kv_heads;
        let scratch_bytes = AttentionBatch::scratch_bytes(&s, &plan);
        if s.max_rows as u64 * max_splits as u64 * items_per_split as u64 > u32::MAX as u64 / 2 {
            return Err(shape_err(OP, format!("{} rows x {max_splits} splits is too many", s.max_rows)));
        }
        check_binding(ctx, OP, "the split scratch", scratch_bytes)?;
        let owned_scratch = match b.scratch {
            Some(buf) => {
                check_size(OP, "scratch", buf, scratch_bytes)?;
                None
            }
            None => Some(ctx.storage_zeroed("attention_batch.splits", scratch_bytes)),
        };
        let scratch = b.scratch.or(owned_scratch.as_ref()).ok_or_else(|| shape_err(OP, "no split scratch"))?;
        // The whole buffers are bound; check what is bound, not just what is needed.
        for (what, buf) in [
            ("qkv", b.qkv),
            ("k_pool", b.k_pool),
            ("v_pool", b.v_pool),
            ("block_table", b.block_table),
            ("batch", b.batch),
            ("out", b.out),
            ("scratch", scratch),
        ] {
            check_binding(ctx, OP, what, buf.size())?;
        }

        let d4 = s.head_dim / 4;
        let wg = plan.workgroup_size as f64;
        let params = MainParams {
            max_rows: s.max_rows,
            n_heads: s.n_heads,
            group: s.group(),
            quads,
            items_per_split,
            qkv_stride4: (s.qkv_row() / 4) as u32,
            n_kv_heads: s.n_kv_heads,
            block_size: s.block_size,
            n_blocks: s.n_blocks,
            max_len: s.max_len,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            scale_base,
        };
        let int8 = if s.dtype == KvDtype::Int8 { 1.0 } else { 0.0 };
        let main_kernel = |name: &'static str, split: bool, chunk: u32, dst: &wgpu::Buffer| {
            let constants = [
                ("D4", d4 as f64),
                ("SPLIT", if split { 1.0 } else { 0.0 }),
                ("CHUNK", chunk as f64),
                ("WG", wg),
                ("INT8", int8),
            ];
            let pipeline = ctx.pipeline("attention_batch", "main", &constants)?;
            let params_buf = ctx.uniform_init(name, bytemuck::bytes_of(&params));
            let resources = [
                whole(b.qkv),
                whole(b.k_pool),
                whole(b.v_pool),
                whole(b.block_table),
                whole(b.batch),
                whole(&params_buf),
                whole(dst),
            ];
            Ok::<_, GpuError>(Kernel::new(ctx, name, pipeline, &resources, [1, 1, 1], None).owning(params_buf))
        };
        // Built even when single_pass_max_keys is 0: a step without keys (only padding rows)
        // still writes its zeros through it.
        let single = main_kernel("attention_batch.single", false, plan.single_pass_max_keys.max(1), b.out)?;
        let splits = main_kernel("attention_batch.splits", true, plan.chunk, scratch)?;
        let reduce_params = ReduceParams { max_rows: s.max_rows, n_heads: s.n_heads, max_len: s.max_len, _pad: 0 };
        let reduce_buf = ctx.uniform_init("attention_batch.reduce.params", bytemuck::bytes_of(&reduce_params));
        let reduce_pipeline = ctx.pipeline(
            "attention_batch_reduce",
            "main",
            &[("D4", d4 as f64), ("CHUNK", plan.chunk as f64), ("WG", wg)],
        )?;
        let reduce = Kernel::new(
            ctx,
            "attention_batch.reduce",
            reduce_pipeline,
            &[whole(b.batch), whole(scratch), whole(b.out), whole(&reduce_buf)],
            [1, 1, 1],
            None,
        )
        .owning(reduce_buf);
        Ok(AttentionBatch {
            kernels: vec![single, splits, reduce],
            plan,
            shape,
            items_per_split,
            max_workgroups_per_dim: ctx.limits.max_compute_workgroups_per_dimension.max(1),
            active: 0..0,
            _scratch: owned_scratch,
        })
    }

    /// Bytes of the split scratch for a shape and plan: the worst step, max_rows rows of max_len
    /// keys, as [max_rows * ceil(max_len / chunk) * n_heads, 1 + head_dim/4] vec4.
    pub fn scratch_bytes(shape: &BatchShape, plan: &BatchPlan) -> u64 {
        let max_splits = shape.max_len.div_ceil(plan.chunk.max(1)) as u64;
        shape.max_rows as u64 * max_splits * shape.n_heads as u64 * (shape.head_dim as u64 / 4 + 1) * 16
    }

    /// Encodes a step's rows (row r = qkv row r = out row r) for the batch buffer:
    /// - `batch[0] = (n_rows, total_splits, 0, 0)`,
    /// - `batch[1 + r] = (table_base, kv_len, first_split, 0)` where `first_split` is the sum of
    ///   ceil(kv_len / chunk) over rows 0..r (row r's splits are the global splits
    ///   first_split..first_split + ceil(kv_len / chunk); the kernels find a split's row by
    ///   binary search over this ascending field),
    ///
    /// as u32 words, 16 bytes per record. It depends on the plan's chunk only: every layer built
    /// with the same shape and plan accepts the same step. Errors: more rows than max_rows, a
    /// kv_len over max_len.
    pub fn step(&self, rows: &[BatchRow]) -> Result<BatchStep, GpuError> {
        encode_step(&self.shape, self.plan.chunk, rows)
    }

    /// Sizes the dispatches for `step` (encoded by [`AttentionBatch::step`] of an attention with
    /// the same shape and chunk, and written into the batch buffer before the kernels run): a
    /// single pass when its longest row has at most `single_pass_max_keys` keys, else splits +
    /// reduce. Bind groups are untouched.
    pub fn set_step(&mut self, step: &BatchStep) -> Result<(), GpuError> {
        if step.chunk != self.plan.chunk || step.n_rows > self.shape.max_rows {
            return Err(shape_err(
                OP,
                format!(
                    "a step encoded for chunk {} and {} rows does not fit chunk {} and {} rows",
                    step.chunk, step.n_rows, self.plan.chunk, self.shape.max_rows
                ),
            ));
        }
        let wg = self.plan.workgroup_size;
        let max = self.max_workgroups_per_dim;
        let items = self.items_per_split as u64;
        if step.n_rows == 0 {
            self.active = 0..0;
        } else if step.max_kv_len <= self.plan.single_pass_max_keys || step.total_splits == 0 {
            self.kernels[SINGLE_KERNEL].workgroups = workgroups(max, wg, step.n_rows as u64 * items);
            self.active = SINGLE_KERNEL..SINGLE_KERNEL + 1;
        } else {
            self.kernels[SPLITS_KERNEL].workgroups = workgroups(max, wg, step.total_splits as u64 * items);
            let reduce_items = step.n_rows as u64 * self.shape.out_row() / 4;
            self.kernels[SPLITS_KERNEL + 1].workgroups = workgroups(max, wg, reduce_items);
            self.active = SPLITS_KERNEL..SPLITS_KERNEL + 2;
        }
        Ok(())
    }

    /// The dispatches of the current step, in order (none before the first
    /// [`AttentionBatch::set_step`] or for a step of 0 rows).
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels[self.active.clone()]
    }

    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    pub fn shape(&self) -> &BatchShape {
        &self.shape
    }
}

fn encode_step(shape: &BatchShape, chunk: u32, rows: &[BatchRow]) -> Result<BatchStep, GpuError> {
    if rows.len() > shape.max_rows as usize {
        return Err(shape_err(OP, format!("{} rows do not fit a batch of {}", rows.len(), shape.max_rows)));
    }
    let mut words = vec![0u32; 4];
    let mut total_splits = 0u32;
    let mut max_kv_len = 0;
    for (r, row) in rows.iter().enumerate() {
        if row.kv_len > shape.max_len {
            return Err(shape_err(OP, format!("row {r}: kv_len {} is over max_len {}", row.kv_len, shape.max_len)));
        }
        words.extend([row.table_base, row.kv_len, total_splits, 0]);
        // Bounded by max_rows * ceil(max_len / chunk), checked against u32 when built.
        total_splits += row.kv_len.div_ceil(chunk);
        max_kv_len = max_kv_len.max(row.kv_len);
    }
    words[0] = rows.len() as u32;
    words[1] = total_splits;
    Ok(BatchStep { words, chunk, n_rows: rows.len() as u32, total_splits, max_kv_len })
}

/// Workgroups for `items` invocations, split over x/y past the per-dimension limit
/// (the shaders recover the linear index as gid.x + gid.y * num_workgroups.x * WG).
fn workgroups(max_per_dim: u32, workgroup_size: u32, items: u64) -> [u32; 3] {
    let count = items.div_ceil(workgroup_size as u64).max(1) as u32;
    if count <= max_per_dim {
        [count, 1, 1]
    } else {
        let y = count.div_ceil(max_per_dim);
        [count.div_ceil(y), y, 1]
    }
}

/// Naive f64 reference over the same layouts as [`AttentionBatch`]: row r is the single-token
/// attention of [`attention_cpu`] for its sequence (table row at `table_base`, keys
/// 0..kv_len); a row of kv_len 0 is zeros. qkv: [rows.len(), qkv_row]; returns
/// [rows.len(), n_heads*head_dim]. k_pool/v_pool are f32 whatever `shape.dtype` says: for an
/// INT8 pool, pass its dequantized values ([`crate::quant::kv_int8::dequantize_pool`]).
pub fn attention_batch_cpu(
    shape: &BatchShape,
    qkv: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    block_table: &[u32],
    rows: &[BatchRow],
) -> Result<Vec<f32>, GpuError> {
    shape.check()?;
    let s = shape;
    let (qkv_row, out_row) = (s.qkv_row() as usize, s.out_row() as usize);
    if qkv.len() < rows.len() * qkv_row {
        return Err(shape_err(OP, "the CPU qkv slice is shorter than the rows need"));
    }
    let single = AttentionShape {
        n_tokens: 1,
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        max_len: s.max_len,
        block_size: s.block_size,
        n_blocks: s.n_blocks,
    };
    let mut out = vec![0f32; rows.len() * out_row];
    for (r, row) in rows.iter().enumerate() {
        if row.kv_len == 0 {
            continue;
        }
        if row.kv_len > s.max_len {
            return Err(shape_err(OP, format!("row {r}: kv_len {} is over max_len {}", row.kv_len, s.max_len)));
        }
        let q = &qkv[r * qkv_row..][..qkv_row];
        let got = attention_cpu(&single, q, k_pool, v_pool, &[row.kv_len - 1], block_table, row.table_base)?;
        out[r * out_row..][..out_row].copy_from_slice(&got);
    }
    Ok(out)
}
