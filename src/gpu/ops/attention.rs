//! Causal llama attention (GQA, scale 1/sqrt(head_dim), softmax in f32) over the paged KV pool
//! (keys read through a block table; the contiguous cache is the one-block case), with two plans:
//! - split-K (flash-decoding) for decode: the key range is cut into `chunk`-key splits spread over
//!   invocations, each keeping an online softmax, then a reduce kernel combines the splits. The
//!   number of splits follows the step's context (`set_kv_len`); up to 256 keys one single-pass
//!   dispatch runs instead.
//! - passes for prefill: one dispatch per `chunk` keys, in order, each merging its keys into the
//!   normalized output (one dispatch up to `chunk` keys of context).
//!
//! Both are `shaders/attention.wgsl` specialized by override constants; the reduce is
//! `shaders/attention_reduce.wgsl`. The pools are f32 or INT8 ([`crate::quant::kv_int8`]); INT8 codes
//! and scales are dequantized in registers as the key loop loads them. An invocation owns 4 query rows of one KV head (for SmolLM2's
//! decode: the 3 query heads of a group) and reads each K/V row once for all of them; no shared
//! memory, no barriers, which are costly on CPU adapters (lavapipe, SwiftShader).
//!
//! The kernel is large (its key loop is written out, see the shader): a new pipeline compiles at
//! its first dispatch in about 0.8 s on lavapipe and 2-4 s on SwiftShader (head_dim 64). Build
//! attentions at load time and run them once there, never first in the decode loop.
//!
//! Why no invocation streams an unbounded context: lavapipe ends all loops of an invocation after
//! 65,535 back-edges in total (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, shared by every loop of a
//! shader), silently, leaving a wrong result. The key loop of attention.wgsl has no inner loop,
//! so `chunk` keys cost `chunk` back-edges; the plan check keeps them under that budget.

use std::sync::Arc;

use super::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::kv_int8::{dequantize_pool, Int8Layout};
use crate::quant::KvDtype;

const OP: &str = "attention";
/// attention.wgsl writes the key loop out for up to 32 vec4 of head_dim.
const MAX_HEAD_DIM: u32 = 128;
/// Query rows per invocation (the components of a vec4 in attention.wgsl).
const ROWS_PER_ITEM: u32 = 4;
/// Keys one invocation may take: lavapipe's 65,535 loop back-edges, less a margin for the
/// few other loop iterations of the shader.
pub const MAX_CHUNK: u32 = 65_000;
/// Split-K kernels are [single pass, splits, reduce].
const SPLITS_KERNEL: usize = 1;
/// Most passes one attention may prebuild.
const MAX_PASSES: u32 = 1024;
/// Keys per dispatch of the default passes plan.
const PASS_KEYS: u32 = 8192;
/// Batches up to this many query rows take the split-K plan by default; above, the passes plan
/// has enough parallelism of its own and the split scratch would grow with the batch.
pub const SPLIT_MAX_TOKENS: u32 = 16;

/// The problem size of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_tokens: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// The longest sequence in tokens (max_seq_len): positions are clamped below it and the
    /// plans size their splits / passes for it.
    pub max_len: u32,
    /// Keys per block of the pool.
    pub block_size: u32,
    /// Blocks in the pool.
    pub n_blocks: u32,
}

impl AttentionShape {
    fn check(&self) -> Result<(), GpuError> {
        let s = self;
        if s.n_tokens == 0 || s.n_heads == 0 || s.n_kv_heads == 0 || s.max_len == 0 || s.block_size == 0 || s.n_blocks == 0
        {
            return Err(shape_err(OP, format!("empty shape {s:?}")));
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
        Ok(())
    }

    /// f32 elements in one of the K / V pools.
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
}

/// Which kernel plan an [`Attention`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// Splits of `chunk` keys in parallel, then a reduce kernel (decode).
    SplitK,
    /// Sequential dispatches of `chunk` keys merging into the output (prefill).
    Passes,
}

/// Kernel plan. [`AttentionPlan::auto`] picks one from the shape and adapter; the fields are
/// public for tests and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    pub path: AttentionPath,
    /// Keys per invocation: per split (split-K) or per dispatch (passes); at most [`MAX_CHUNK`].
    pub chunk: u32,
    pub workgroup_size: u32,
    /// Split-K only: up to this kv_len one single-pass dispatch replaces splits + reduce, which
    /// at short context cost more than they save (measured crossover about 256-512 keys on both
    /// software adapters). 0 always splits.
    pub single_pass_max_keys: u32,
}

impl AttentionPlan {
    /// The default plan: for up to [`SPLIT_MAX_TOKENS`] query tokens split-K in 128-key splits
    /// (one single pass up to 256 keys); above, passes of 8192 keys (one pass for SmolLM2).
    pub fn auto(ctx: &Context, shape: &AttentionShape) -> AttentionPlan {
        let split = shape.n_tokens <= SPLIT_MAX_TOKENS;
        AttentionPlan {
            path: if split { AttentionPath::SplitK } else { AttentionPath::Passes },
            chunk: if split { 128 } else { PASS_KEYS },
            // Software adapters want small workgroups (many to spread over cores, no barriers).
            workgroup_size: if ctx.is_cpu() { 8 } else { 64 },
            single_pass_max_keys: if split { 256 } else { 0 },
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

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    n_tokens: u32,
    n_heads: u32,
    group: u32,
    max_len: u32,
    qkv_stride4: u32,
    quads: u32,
    items_per_split: u32,
    max_splits: u32,
    scale: f32,
    pass_begin: u32,
    n_kv_heads: u32,
    block_size: u32,
    n_blocks: u32,
    scale_base: u32,
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
    /// Every prebuilt dispatch. Split-K: [single pass, splits, reduce]; passes: one per `chunk`
    /// keys of max_len. Record [`Attention::kernels`], the ones the current kv_len needs
    /// (recording all is still correct, only slower: later kernels overwrite or return at once).
    pub kernels: Vec<Kernel>,
    plan: AttentionPlan,
    shape: AttentionShape,
    /// Invocations per split or pass: row quads x KV heads.
    items_per_split: u32,
    max_workgroups_per_dim: u32,
    kv_len: u32,
    /// The range of `kernels` one step at the current kv_len records.
    active: std::ops::Range<usize>,
    /// Split-K partial states or the passes' running (max, sum); the bind groups use them.
    _scratch: wgpu::Buffer,
    _state: wgpu::Buffer,
}

impl Attention {
    /// Attention with the default plan ([`AttentionPlan::auto`]).
    /// qkv: [n_tokens, (n_heads+2*n_kv_heads)*head_dim] f32, q heads first in each row (roped);
    /// k_pool/v_pool: [n_blocks, n_kv_heads, block_size, head_dim] f32, element (b, h, s, d) at
    /// `((b * n_kv_heads + h) * block_size + s) * head_dim + d`, holding the sequence's keys
    /// 0..=max(positions), the new tokens' included;
    /// block_table: u32, key j is in physical block `block_table[table_base + j / block_size]`,
    /// slot j % block_size; a table index past its end or a block >= n_blocks masks those keys;
    /// step: uniform buffer (>= 4 bytes) holding `table_base` as u32 at offset 0, written by the
    /// engine per step and read when the kernels run;
    /// positions: [n_tokens] u32, token t attends keys 0..=positions[t];
    /// out: [n_tokens, n_heads*head_dim] f32.
    /// Contract: all rows of one dispatch belong to ONE sequence (one table_base).
    /// The contiguous cache [n_kv_heads, max_len, head_dim] is block_size = max_len, n_blocks = 1,
    /// table [0].
    /// Positions must stay below the `kv_len` of the last [`Attention::set_kv_len`] (initially
    /// max_seq_len); positions >= max_seq_len are clamped to max_seq_len - 1.
    #[allow(clippy::too_many_arguments)]
    pub fn paged(
        ctx: &Context,
        qkv: &wgpu::Buffer,
        k_pool: &wgpu::Buffer,
        v_pool: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        block_table: &wgpu::Buffer,
        step: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: u32,
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        block_size: u32,
        n_blocks: u32,
        max_seq_len: u32,
    ) -> Result<Attention, GpuError> {
        let shape =
            AttentionShape { n_tokens, n_heads, n_kv_heads, head_dim, max_len: max_seq_len, block_size, n_blocks };
        shape.check()?;
        let plan = AttentionPlan::auto(ctx, &shape);
        Attention::paged_with_plan(ctx, qkv, k_pool, v_pool, positions, block_table, step, out, shape, plan)
    }

    /// [`Attention::paged`] with an explicit plan (tests, benchmarks).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_with_plan(
        ctx: &Context,
        qkv: &wgpu::Buffer,
        k_pool: &wgpu::Buffer,
        v_pool: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        block_table: &wgpu::Buffer,
        step: &wgpu::Buffer,
        out: &wgpu::Buffer,
        shape: AttentionShape,
        plan: AttentionPlan,
    ) -> Result<Attention, GpuError> {
        Attention::paged_dtype(ctx, qkv, k_pool, v_pool, positions, block_table, step, out, shape, KvDtype::F32, Some(plan))
    }

    /// [`Attention::paged`] over pools of either dtype, with the default plan for `None`.
    /// k_pool/v_pool, f32: as in [`Attention::paged`]; INT8: [`Int8Layout`] buffers of
    /// (n_blocks, n_kv_heads, block_size, head_dim), head_dim a multiple of 16. Every other
    /// contract is [`Attention::paged`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_dtype(
        ctx: &Context,
        qkv: &wgpu::Buffer,
        k_pool: &wgpu::Buffer,
        v_pool: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        block_table: &wgpu::Buffer,
        step: &wgpu::Buffer,
        out: &wgpu::Buffer,
        shape: AttentionShape,
        dtype: KvDtype,
        plan: Option<AttentionPlan>,
    ) -> Result<Attention, GpuError> {
        shape.check()?;
        let plan = plan.unwrap_or_else(|| AttentionPlan::auto(ctx, &shape));
        plan.check(ctx)?;
        let s = shape;
        let qkv_bytes = s.n_tokens as u64 * s.qkv_row() * 4;
        let (pool_bytes, scale_base) = match dtype {
            KvDtype::F32 => {
                // The shader's vec4 indices are u32.
                if s.pool_len() / 4 > u32::MAX as u64 {
                    return Err(shape_err(OP, format!("a pool of {} elements overflows u32 indices", s.pool_len())));
                }
                (s.pool_len() * 4, 0)
            }
            KvDtype::Int8 => {
                let layout = Int8Layout::new(s.n_blocks, s.n_kv_heads, s.block_size, s.head_dim)
                    .map_err(|e| shape_err(OP, e.to_string()))?;
                (layout.buffer_bytes(), layout.data_words() as u32)
            }
        };
        let out_bytes = s.n_tokens as u64 * s.n_heads as u64 * s.head_dim as u64 * 4;
        check_size(OP, "qkv", qkv, qkv_bytes)?;
        check_size(OP, "k_pool", k_pool, pool_bytes)?;
        check_size(OP, "v_pool", v_pool, pool_bytes)?;
        check_size(OP, "positions", positions, s.n_tokens as u64 * 4)?;
        check_size(OP, "block_table", block_table, 4)?;
        check_size(OP, "step", step, 4)?;
        check_size(OP, "out", out, out_bytes)?;
        // The whole buffers are bound; check what is bound, not just what is needed.
        for (what, buf) in
            [("qkv", qkv), ("k_pool", k_pool), ("v_pool", v_pool), ("out", out), ("block_table", block_table)]
        {
            check_binding(ctx, OP, what, buf.size())?;
        }

        let d4 = s.head_dim / 4;
        let rows = s.n_tokens as u64 * s.n_heads as u64;
        let quads = (s.n_tokens as u64 * s.group() as u64).div_ceil(ROWS_PER_ITEM as u64);
        let items_per_split = quads * s.n_kv_heads as u64;
        let split = plan.path == AttentionPath::SplitK;
        let n_chunks = s.max_len.div_ceil(plan.chunk);
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
        let items_per_split = items_per_split as u32;
        let params = AttentionParams {
            n_tokens: s.n_tokens,
            n_heads: s.n_heads,
            group: s.group(),
            max_len: s.max_len,
            qkv_stride4: (s.qkv_row() / 4) as u32,
            quads: quads as u32,
            items_per_split,
            max_splits,
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            pass_begin: 0,
            n_kv_heads: s.n_kv_heads,
            block_size: s.block_size,
            n_blocks: s.n_blocks,
            scale_base,
        };
        let int8 = if dtype == KvDtype::Int8 { 1.0 } else { 0.0 };
        let constants = [
            ("D4", d4 as f64),
            ("SPLIT", if split { 1.0 } else { 0.0 }),
            ("CHUNK", plan.chunk as f64),
            ("WG", plan.workgroup_size as f64),
            ("INT8", int8),
        ];
        let pipeline = ctx.pipeline("attention", "main", &constants)?;
        let scratch_bytes = if split { rows * max_splits as u64 * (d4 as u64 + 1) * 16 } else { 4 };
        check_binding(ctx, OP, "the split scratch", scratch_bytes)?;
        let scratch = ctx.storage_zeroed("attention.splits", scratch_bytes);
        let state = ctx.storage_zeroed("attention.state", rows * 8);
        let max_workgroups_per_dim = ctx.limits.max_compute_workgroups_per_dimension.max(1);
        let groups = workgroups(max_workgroups_per_dim, plan.workgroup_size, items_per_split as u64);

        let main_kernel = |name: &'static str,
                           params: &AttentionParams,
                           dst: &wgpu::Buffer,
                           pipeline: &Arc<wgpu::ComputePipeline>| {
            let params_buf = ctx.uniform_init(name, bytemuck::bytes_of(params));
            let resources = [
                whole(qkv),
                whole(k_pool),
                whole(v_pool),
                whole(positions),
                whole(&params_buf),
                whole(dst),
                whole(&state),
                whole(block_table),
                whole(step),
            ];
            Kernel::new(ctx, name, pipeline.clone(), &resources, groups, None).owning(params_buf)
        };
        let kernels = if split {
            // The single pass for short contexts: the prefill pipeline, one pass over all keys.
            let single_chunk = plan.single_pass_max_keys.max(1);
            let single_pipeline = ctx.pipeline(
                "attention",
                "main",
                &[
                    ("D4", d4 as f64),
                    ("SPLIT", 0.0),
                    ("CHUNK", PASS_KEYS.max(single_chunk) as f64),
                    ("WG", plan.workgroup_size as f64),
                    ("INT8", int8),
                ],
            )?;
            let single = main_kernel("attention.single", &params, out, &single_pipeline);
            let main = main_kernel("attention.splits", &params, &scratch, &pipeline);
            let reduce_params =
                ReduceParams { n_rows: rows as u32, n_heads: s.n_heads, max_len: s.max_len, max_splits };
            let reduce_buf = ctx.uniform_init("attention.reduce.params", bytemuck::bytes_of(&reduce_params));
            let reduce_pipeline = ctx.pipeline(
                "attention_reduce",
                "main",
                &[("D4", d4 as f64), ("CHUNK", plan.chunk as f64), ("WG", plan.workgroup_size as f64)],
            )?;
            let reduce = Kernel::new(
                ctx,
                "attention.reduce",
                reduce_pipeline,
                &[whole(positions), whole(&scratch), whole(out), whole(&reduce_buf)],
                workgroups(max_workgroups_per_dim, plan.workgroup_size, rows * d4 as u64),
                None,
            )
            .owning(reduce_buf);
            vec![single, main, reduce]
        } else {
            (0..n_chunks)
                .map(|p| {
                    main_kernel(
                        "attention.pass",
                        &AttentionParams { pass_begin: p * plan.chunk, ..params },
                        out,
                        &pipeline,
                    )
                })
                .collect()
        };
        let mut attention = Attention {
            kernels,
            plan,
            shape,
            items_per_split,
            max_workgroups_per_dim,
            kv_len: s.max_len,
            active: 0..0,
            _scratch: scratch,
            _state: state,
        };
        attention.set_kv_len(s.max_len)?;
        Ok(attention)
    }

    /// Called before recording a step whose longest key range is `kv_len` (max position + 1):
    /// sizes the split dispatch to ceil(kv_len / chunk) splits, or selects ceil(kv_len / chunk)
    /// passes. Bind groups are untouched. kv_len must be in 1..=max_len.
    pub fn set_kv_len(&mut self, kv_len: u32) -> Result<(), GpuError> {
        if kv_len == 0 || kv_len > self.shape.max_len {
            return Err(shape_err(OP, format!("kv_len {kv_len} is outside 1..={}", self.shape.max_len)));
        }
        self.kv_len = kv_len;
        let chunks = kv_len.div_ceil(self.plan.chunk);
        match self.plan.path {
            AttentionPath::SplitK => {
                let items = self.items_per_split as u64 * chunks as u64;
                self.kernels[SPLITS_KERNEL].workgroups =
                    workgroups(self.max_workgroups_per_dim, self.plan.workgroup_size, items);
                self.active = if kv_len <= self.plan.single_pass_max_keys { 0..1 } else { SPLITS_KERNEL..3 };
            }
            AttentionPath::Passes => self.active = 0..chunks as usize,
        }
        Ok(())
    }

    /// The kv_len the dispatches are currently sized for.
    pub fn kv_len(&self) -> u32 {
        self.kv_len
    }

    pub fn plan(&self) -> &AttentionPlan {
        &self.plan
    }

    /// The dispatches of one step at the current kv_len, in order.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels[self.active.clone()]
    }
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

/// Naive f64 reference over the same layouts as [`Attention::paged`] (positions clamped
/// to max_len - 1 like the kernels; keys whose table entry is missing or >= n_blocks skipped).
/// Returns out: [n_tokens, n_heads*head_dim].
pub fn attention_cpu(
    shape: &AttentionShape,
    qkv: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
) -> Result<Vec<f32>, GpuError> {
    shape.check()?;
    let s = shape;
    let (hd, row, bs) = (s.head_dim as usize, s.qkv_row() as usize, s.block_size as usize);
    let pool_len = s.pool_len() as usize;
    if qkv.len() < s.n_tokens as usize * row
        || k_pool.len() < pool_len
        || v_pool.len() < pool_len
        || positions.len() < s.n_tokens as usize
    {
        return Err(shape_err(OP, "a CPU input slice is shorter than the shape needs"));
    }
    // Element offset of key j's head-0 row in its physical block, or None when unmapped.
    let key_base = |j: usize| -> Option<usize> {
        let block = *block_table.get((table_base as usize).checked_add(j / bs)?)? as usize;
        (block < s.n_blocks as usize).then(|| block * s.n_kv_heads as usize * bs * hd + (j % bs) * hd)
    };
    let group = s.group() as usize;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; s.n_tokens as usize * s.n_heads as usize * hd];
    let mut scores = Vec::new();
    for t in 0..s.n_tokens as usize {
        let keys = positions[t].min(s.max_len - 1) as usize + 1;
        let bases: Vec<usize> = (0..keys).filter_map(key_base).collect();
        for h in 0..s.n_heads as usize {
            let q = &qkv[t * row + h * hd..][..hd];
            let head_off = (h / group) * bs * hd;
            scores.clear();
            for &b in &bases {
                let k = &k_pool[b + head_off..][..hd];
                let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                scores.push(dot * scale);
            }
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(t * s.n_heads as usize + h) * hd..][..hd];
            for (d, slot) in o.iter_mut().enumerate() {
                let sum: f64 =
                    weights.iter().zip(&bases).map(|(w, &b)| w * v_pool[b + head_off + d] as f64).sum();
                *slot = (sum / total) as f32;
            }
        }
    }
    Ok(out)
}

/// [`attention_cpu`] over INT8 pools: `k_words`, `v_words` are the words of two [`Int8Layout`]
/// buffers of the shape's pool, dequantized exactly as the kernels do (`code · scale`).
pub fn attention_int8_cpu(
    shape: &AttentionShape,
    qkv: &[f32],
    k_words: &[u32],
    v_words: &[u32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
) -> Result<Vec<f32>, GpuError> {
    let layout = Int8Layout::new(shape.n_blocks, shape.n_kv_heads, shape.block_size, shape.head_dim)
        .map_err(|e| shape_err(OP, e.to_string()))?;
    let k_pool = dequantize_pool(&layout, k_words).map_err(|e| shape_err(OP, e.to_string()))?;
    let v_pool = dequantize_pool(&layout, v_words).map_err(|e| shape_err(OP, e.to_string()))?;
    attention_cpu(shape, qkv, &k_pool, &v_pool, positions, block_table, table_base)
}
