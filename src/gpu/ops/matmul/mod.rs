//! Matrix multiply with GGUF weights of every supported type kept in their formats on the GPU
//! and dequantized in registers inside the kernel.
//!
//! Weights are repacked once at upload ([`layout`]): the blocks of G adjacent rows that cover the
//! same columns are stored side by side, so one invocation computing G output rows reads one
//! contiguous run per block; f16 scales are read through `unpack2x16float` (no `shader-f16`).
//! Q4_1 and Q8_0 have matmul bodies of their own (`shaders/matmul_q4_1.wgsl`,
//! `shaders/matmul_q8_0.wgsl`: scales of a group first, vector loads of quants, an int8-activation
//! path); every other type runs one body (`shaders/matmul_blocks.wgsl`) with its block format as a
//! prelude (`shaders/quant_<type>.wgsl`, a `decode` function per type).
//!
//! A [`QuantMatrix`] is a list of parts, each a run of rows of one type in one buffer: a matrix is
//! split where it would exceed the device's `maxStorageBufferBindingSize` or `maxBufferSize`, and
//! a stack of matrices of different types (q|k|v of a mixed "Q4_K_M" file) keeps one part per type.
//! A matmul is one dispatch per part, each writing its own columns of y; an embedding lookup one
//! dispatch per part, each writing the ids it holds.
//!
//! One kernel per format serves decode (1 activation row), small batches and prefill: an
//! invocation computes TM activation rows × G output rows, TM chosen from `n_rows` (register
//! tiling: every weight block is dequantized once per TM rows). On CPU adapters each invocation
//! walks a whole row (no shared memory, no barriers: see the README's Kernels on emulated GPUs) and, where the device has
//! subgroups of 8 or more, the 8 lanes of a subgroup load each activation block together and
//! broadcast it ([`MatmulConfig::subgroup`]): on lavapipe every storage load is a loop over the
//! SIMD lanes, so the words an invocation loads are what a matmul costs. On other adapters KSPLIT
//! invocations split the blocks of a row and reduce through workgroup memory. All are override
//! constants or activation preludes of the same bodies. Accumulation is f32. With f32 activations
//! the result equals the f32 dot product of the dequantized weights up to summation order
//! (relative error ~1e-6 of Σ|w·x|). [`MatmulConfig::int8_activations`] (asked for through
//! [`ContextOptions::int8_activations`](crate::gpu::ContextOptions)) is llama.cpp's trick instead
//! for the Q4_1 and Q8_0 parts: activations quantized to
//! int8 per 32-value block, by a dispatch of their own or by the norm that produces them
//! ([`Input::Int8`]), products through `dot4I8Packed`; fewer words to load, within
//! [`int8_error_bound`] of the exact result. Parts of other types keep f32 activations.
//!
//! With f32 activations a matmul may normalize its input itself ([`Input::Norm`], the RMSNorm
//! prologue): the forward graph's pre-norms then need no dispatch, and no buffer holds the
//! normalized rows.
// Long: a weight matrix from its allocation and chunked fill to the kernels that run it, one type that the rest of the GPU code sees.

pub(crate) mod layout;
#[cfg(feature = "testing")]
mod reference;

use super::{check_binding, check_size, whole};
use crate::gguf::GgmlType;
use crate::gpu::kernel::split_workgroups;
use crate::gpu::{shape_err, AdapterClass, Context, GpuError, Kernel};
use crate::model::Activation;
use crate::quant::QK;
use layout::Layout;
#[cfg(feature = "testing")]
pub use reference::{int8_error_bound, matmul_cpu, matmul_int8_cpu};

/// One run of rows of a [`QuantMatrix`]: one type, one buffer.
pub struct Part {
    pub ggml_type: GgmlType,
    /// The matrix row this part's row 0 is.
    pub row0: u32,
    pub rows: u32,
    /// Row groups, the last one padded with zero rows.
    pub(crate) groups: u32,
    /// The repacked blocks of [`layout`].
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) layout: Layout,
}

impl Part {
    /// GPU bytes of this part.
    pub fn buffer_bytes(&self) -> u64 {
        self.buffer.size()
    }
}

/// A weight matrix y = x · Wᵀ with W: [rows (out features), cols (in features)], uploaded once,
/// kept in its GGUF formats in the repacked layouts of [`layout`], as one or more [`Part`]s.
pub struct QuantMatrix {
    pub rows: u32,
    pub cols: u32,
    pub parts: Vec<Part>,
    /// The rows are a gate and an up matrix interleaved for [`Epilogue::Gated`]
    /// ([`QuantMatrix::upload_gated`]); such a matrix runs with that epilogue only.
    pub gated: bool,
}

/// What a matmul does with its results, fused into its stores (`EPILOGUE` in
/// `shaders/matmul_common.wgsl`) so that no kernel runs after it for that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// y = x · Wᵀ.
    Store,
    /// y += x · Wᵀ: the residual add.
    Accumulate,
    /// y = act(x · Gᵀ) ⊙ (x · Uᵀ) for a matrix from [`QuantMatrix::upload_gated`] (gate G and
    /// up U): the gated FFN's activation; y: [n_rows, rows / 2].
    Gated(Activation),
}

/// The layout of `t`, or an error naming it.
fn layout_of(op: &'static str, t: GgmlType) -> Result<Layout, GpuError> {
    Layout::of(t).ok_or_else(|| shape_err(op, format!("weight type {} is not supported", t.name())))
}

impl QuantMatrix {
    /// raw: GGUF bytes of a `t` matrix with ne0 = cols, ne1 = rows (row after row of blocks).
    pub fn upload(ctx: &Context, label: &str, t: GgmlType, raw: &[u8], rows: u32, cols: u32) -> Result<QuantMatrix, GpuError> {
        QuantMatrix::upload_stacked(ctx, label, &[(t, raw, rows)], cols)
    }

    /// The gate and up matrices of a gated FFN ([ffn, cols] each, GGUF bytes of one type `t`),
    /// their rows interleaved in fours (gate 2c, 2c+1, up 2c, 2c+1) so that every group of the
    /// kernel holds both operands of its outputs, for [`Epilogue::Gated`]. `None` when that
    /// layout does not apply: the two differ in type or `ffn` is odd (stack them instead, and
    /// run the activation as a kernel of its own).
    pub fn upload_gated(
        ctx: &Context,
        label: &str,
        (gate_type, gate): (GgmlType, &[u8]),
        (up_type, up): (GgmlType, &[u8]),
        ffn: u32,
        cols: u32,
    ) -> Result<Option<QuantMatrix>, GpuError> {
        if gate_type != up_type || ffn % 2 != 0 {
            return Ok(None);
        }
        let layout = layout_of("QuantMatrix::upload_gated", gate_type)?;
        for (what, bytes) in [("gate", gate), ("up", up)] {
            layout.check_raw(bytes, ffn, cols).map_err(|e| shape_err("QuantMatrix::upload_gated", format!("{label} {what}: {e}")))?;
        }
        let raw = interleave_gate_up(gate, up, layout.row_bytes(cols) as usize);
        let mut m = QuantMatrix::upload(ctx, label, gate_type, &raw, 2 * ffn, cols)?;
        m.gated = true;
        Ok(Some(m))
    }

    /// Several matrices with the same cols stacked along rows (fused q|k|v, fused gate|up):
    /// the output of the stack is the concatenation of each part's outputs, in order.
    /// parts: (type, GGUF bytes, rows) of each matrix; they may differ in type.
    pub fn upload_stacked(ctx: &Context, label: &str, parts: &[(GgmlType, &[u8], u32)], cols: u32) -> Result<QuantMatrix, GpuError> {
        QuantMatrix::upload_stacked_limited(ctx, label, parts, cols, max_part_bytes(ctx))
    }

    /// [`QuantMatrix::upload_stacked`] with parts of at most `max_part_bytes` (at most the
    /// device's [`max_part_bytes`]; tests split small matrices with a smaller one).
    pub fn upload_stacked_limited(
        ctx: &Context,
        label: &str,
        parts: &[(GgmlType, &[u8], u32)],
        cols: u32,
        max_part_bytes: u64,
    ) -> Result<QuantMatrix, GpuError> {
        const OP: &str = "QuantMatrix::upload";
        // Each part checked first, so that nothing is uploaded for a bad stack.
        for (i, &(t, bytes, part_rows)) in parts.iter().enumerate() {
            layout_of(OP, t)?.check_raw(bytes, part_rows, cols).map_err(|e| shape_err(OP, format!("{label} part {i}: {e}")))?;
        }
        let shape: Vec<(GgmlType, u32)> = parts.iter().map(|&(t, _, rows)| (t, rows)).collect();
        let m = QuantMatrix::allocate(ctx, label, &shape, cols, max_part_bytes)?;
        for (first, n) in m.fill_chunks(FILL_CHUNK_BYTES) {
            let mut raw = Vec::new();
            let mut row0 = 0;
            for &(t, bytes, rows) in parts {
                let row_bytes = layout_of(OP, t)?.row_bytes(cols) as usize;
                let (from, to) = (first.max(row0), (first + n).min(row0 + rows));
                if from < to {
                    raw.extend_from_slice(&bytes[(from - row0) as usize * row_bytes..(to - row0) as usize * row_bytes]);
                }
                row0 += rows;
            }
            m.write_rows(ctx, first, n, &raw)?;
        }
        Ok(m)
    }

    /// A matrix of `parts` ((type, rows) of each, in row order) stacked along rows, its buffers
    /// allocated (runs of one type, each split into parts of at most `max_part_bytes` at row-group
    /// boundaries) and zeroed, to fill with [`QuantMatrix::write_rows`].
    pub fn allocate(ctx: &Context, label: &str, parts: &[(GgmlType, u32)], cols: u32, max_part_bytes: u64) -> Result<QuantMatrix, GpuError> {
        const OP: &str = "QuantMatrix::upload";
        let max = max_part_bytes.min(self::max_part_bytes(ctx));
        if parts.is_empty() {
            return Err(shape_err(OP, format!("{label}: no parts")));
        }
        // Runs of one type: (layout, rows).
        let mut runs: Vec<(Layout, u32)> = Vec::new();
        let mut rows = 0u32;
        for &(t, part_rows) in parts {
            let layout = layout_of(OP, t)?;
            if part_rows == 0 || cols == 0 || cols % layout.block_values != 0 {
                return Err(shape_err(OP, format!("{label}: {} {part_rows} rows × {cols} cols", t.name())));
            }
            rows = rows.checked_add(part_rows).ok_or_else(|| shape_err(OP, format!("{label}: more than 2^32 rows")))?;
            match runs.last_mut() {
                Some((l, r)) if *l == layout => *r += part_rows,
                _ => runs.push((layout, part_rows)),
            }
        }
        let mut out = Vec::new();
        let mut row0 = 0;
        for (layout, rows) in runs {
            allocate_run(ctx, Run { label, layout, row0, rows, cols, max }, &mut out)?;
            row0 += rows;
        }
        Ok(QuantMatrix { rows, cols, parts: out, gated: false })
    }

    /// The row ranges `(first, n)` to fill the matrix in: each within one part, starting at a
    /// row group, of at most about `max_bytes` GGUF bytes (at least one row group).
    pub fn fill_chunks(&self, max_bytes: u64) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for p in &self.parts {
            let group_raw = p.layout.row_bytes(self.cols) * p.layout.group_rows as u64;
            let step = ((max_bytes / group_raw.max(1)).max(1) * p.layout.group_rows as u64).min(u32::MAX as u64) as u32;
            let mut first = 0;
            while first < p.rows {
                let n = step.min(p.rows - first);
                out.push((p.row0 + first, n));
                first += n;
            }
        }
        out
    }

    /// Repacks GGUF rows `first..first + n` (`raw`: their bytes, one range from
    /// [`QuantMatrix::fill_chunks`]) into their part's layout and writes them to its buffer.
    pub fn write_rows(&self, ctx: &Context, first: u32, n: u32, raw: &[u8]) -> Result<(), GpuError> {
        const OP: &str = "QuantMatrix::write_rows";
        let part = self.parts.iter().find(|p| first >= p.row0 && first + n <= p.row0 + p.rows);
        let Some(p) = part.filter(|p| (first - p.row0) % p.layout.group_rows == 0 && n > 0) else {
            return Err(shape_err(OP, format!("rows {first}..{} are not a row-group range of one part", first + n)));
        };
        p.layout.check_raw(raw, n, self.cols).map_err(|e| shape_err(OP, e))?;
        let packed = p.layout.repack(raw, n, self.cols);
        let offset = ((first - p.row0) / p.layout.group_rows) as u64 * p.layout.group_bytes(self.cols);
        ctx.queue.write_buffer(&p.buffer, offset, bytemuck::cast_slice(&packed));
        Ok(())
    }

    /// GPU bytes a `t` matrix of `rows` × `cols` takes once uploaded (row groups completed).
    pub fn planned_bytes(t: GgmlType, rows: u32, cols: u32) -> Result<u64, GpuError> {
        let layout = layout_of("QuantMatrix::planned_bytes", t)?;
        Ok(rows.div_ceil(layout.group_rows) as u64 * layout.group_bytes(cols))
    }

    /// GPU bytes held.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(Part::buffer_bytes).sum()
    }

    /// The weight types of the parts, in row order, each once.
    pub fn types(&self) -> Vec<GgmlType> {
        let mut out: Vec<GgmlType> = Vec::new();
        for p in &self.parts {
            if !out.contains(&p.ggml_type) {
                out.push(p.ggml_type);
            }
        }
        out
    }
}

/// Gate and up rows (`row_bytes` each, as many of each) interleaved in fours: gate 2c, 2c+1, up
/// 2c, 2c+1 (the layout of a matrix for [`Epilogue::Gated`]).
pub fn interleave_gate_up(gate: &[u8], up: &[u8], row_bytes: usize) -> Vec<u8> {
    let mut raw = Vec::with_capacity(gate.len() + up.len());
    for (g, u) in gate.chunks(2 * row_bytes).zip(up.chunks(2 * row_bytes)) {
        raw.extend_from_slice(g);
        raw.extend_from_slice(u);
    }
    raw
}

/// The most bytes one part may hold on this device: one binding, one buffer, and at most
/// [`MAX_PART_BYTES`].
pub fn max_part_bytes(ctx: &Context) -> u64 {
    ctx.limits.max_storage_buffer_binding_size.min(ctx.limits.max_buffer_size).min(MAX_PART_BYTES)
}

/// The largest part whatever the limits say: drivers refuse single allocations below the
/// adapter's `maxBufferSize` (Chromium's SwiftShader reports 1 GiB and fails to allocate 1 GiB
/// − 4 bytes, as Vulkan's `maxMemoryAllocationSize` allows), and a matrix this large costs one
/// more dispatch per 512 MiB, not per token.
pub const MAX_PART_BYTES: u64 = 512 << 20;

/// GGUF bytes a fill chunk holds at most ([`QuantMatrix::fill_chunks`]): what a load holds of a
/// matrix at a time, twice (its GGUF bytes and their repacked words).
pub const FILL_CHUNK_BYTES: u64 = 8 << 20;

/// Rows of one type, to allocate as matrix rows row0.. .
struct Run<'a> {
    label: &'a str,
    layout: Layout,
    row0: u32,
    rows: u32,
    cols: u32,
    /// Bytes one part may hold.
    max: u64,
}

/// Allocates a run as zeroed parts no larger than `run.max`, split at row-group boundaries,
/// appending them to `out`.
fn allocate_run(ctx: &Context, run: Run<'_>, out: &mut Vec<Part>) -> Result<(), GpuError> {
    let Run { label, layout, row0, rows, cols, max } = run;
    let group_bytes = layout.group_bytes(cols);
    let groups_per_part = max / group_bytes;
    if groups_per_part == 0 {
        return Err(shape_err(
            "QuantMatrix::upload",
            format!("{label}: one group of {} rows takes {group_bytes} bytes, over the device's {max}-byte binding limit", layout.group_rows),
        ));
    }
    let rows_per_part = (groups_per_part * layout.group_rows as u64).min(rows as u64) as u32;
    let mut start = 0u32;
    while start < rows {
        let n = rows_per_part.min(rows - start);
        let name = if n == rows { label.to_string() } else { format!("{label}[{start}..{}]", start + n) };
        let groups = n.div_ceil(layout.group_rows);
        let buffer = ctx.storage_zeroed(&name, groups as u64 * group_bytes);
        out.push(Part { ggml_type: layout.ggml_type, row0: row0 + start, rows: n, groups, buffer, layout });
        start += n;
    }
    Ok(())
}

/// How the matmul kernel is specialized. [`MatmulConfig::for_device`] picks one per adapter class;
/// tests and benchmarks set fields to exercise the other variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    /// Activation rows per invocation (1..=16).
    pub tile_rows: u32,
    /// Row groups per invocation (1, 2 or 4; `tile_rows · group_tile` ≤ the variant's slots,
    /// [`Preludes::max_slots`]): each activation block an invocation loads serves this many
    /// groups' rows (`TG` in `shaders/matmul_common.wgsl`).
    pub group_tile: u32,
    /// Invocations splitting the blocks of one row group (1 = no workgroup memory, no barriers).
    pub k_split: u32,
    /// Invocations per workgroup, a multiple of `k_split`.
    pub workgroup: u32,
    /// Use subgroups ([`Context::has_subgroups`]): with `k_split` 1, load each activation block
    /// once per 8 lanes and broadcast it (`shaders/matmul_x_subgroup.wgsl`; subgroups of at least
    /// 8 and a workgroup of a multiple of 8); with `k_split` > 1 (a power of two), sum the split
    /// rows within a subgroup by shuffles instead of through workgroup memory
    /// (`shaders/matmul_split_subgroup.wgsl`; subgroups of at least `k_split`).
    pub subgroup: bool,
    /// Multiply int8-quantized activations (per 32-value block) with `dot4I8Packed`, as llama.cpp
    /// does, in the parts with an int8 body (Q4_1, Q8_0). Not exact: see [`int8_error_bound`].
    pub int8_activations: bool,
}

/// The largest `tile_rows` the shaders hold registers for (`MAX_TM` in WGSL).
pub const MAX_TILE_ROWS: u32 = 16;

/// The most slots (`tile_rows · group_tile`) of a tile in the wide kernels of the variant without
/// shared loads or split sums ([`Preludes::PlainWide`], `shaders/matmul_slots32.wgsl`); the others
/// hold [`MAX_TILE_ROWS`] (`matmul_slots16.wgsl`).
const MAX_WIDE_SLOTS: u32 = 32;

/// The fewest workgroups a part's matmul should make on the plain CPU variant
/// ([`MatmulConfig::for_part`]).
const MIN_WORKGROUPS: u32 = 16;

/// Lanes of a subgroup that load an activation block together (`matmul_x_subgroup.wgsl`).
const SUBGROUP_LANES: u32 = 8;

/// The activation preludes a matmul kernel is built with (`src/gpu/shaders.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Preludes {
    /// `matmul_split` + `matmul_x`: every invocation loads what it multiplies, split rows summed
    /// through workgroup memory.
    Plain,
    /// [`Preludes::Plain`] with tiles of up to 32 slots (`matmul_slots32`; the `_wide` shaders),
    /// for the plain variant's tiles past 16 slots only: SwiftShader compiles every slot a
    /// shader writes out, reached or not (Chromium's first SmolLM2 prefill took ~5 s longer with
    /// 32 slots in every plain kernel).
    PlainWide,
    /// `matmul_x_subgroup`: activation blocks shared through subgroup broadcasts, no split.
    SharedLoads,
    /// `matmul_split_subgroup` + `matmul_x`: split rows summed within a subgroup.
    SubgroupSum,
}

impl Preludes {
    /// The most slots of a tile (`tile_rows · group_tile`) in this variant: only the wide plain
    /// kernels compile slots past 16 (`matmul_slots32.wgsl`), so that no other kernel pays for
    /// them when it is compiled.
    pub(crate) fn max_slots(self) -> u32 {
        match self {
            Preludes::PlainWide => MAX_WIDE_SLOTS,
            Preludes::Plain | Preludes::SharedLoads | Preludes::SubgroupSum => MAX_TILE_ROWS,
        }
    }
}

impl MatmulConfig {
    /// The variant for this adapter's class ([`Context::class`]) and batch.
    ///
    /// CPU adapters: register tiles of up to 16 activation rows, whole rows per invocation in
    /// workgroups of 16, activation blocks shared through subgroups where there are some
    /// (lavapipe); measured on lavapipe (medians of 5 alternating rounds, CPU time): a 512-row
    /// Q4_1 prefill (576→1536) 2.7× faster than the 8-row tiles before, decode matvecs 1.35-1.5×.
    ///
    /// Real GPUs (not measured: no real GPU at hand; the choices follow what GPU matvec kernels
    /// do, e.g. llama.cpp's Vulkan and Metal ones): a row group's blocks split over `k_split`
    /// invocations, so that a decode matvec keeps many invocations busy on few rows and adjacent
    /// invocations read adjacent blocks; the split summed within a subgroup where the device's
    /// subgroups hold it (`has_subgroups(k_split)`: NVIDIA, AMD, Apple; no barriers, no workgroup
    /// memory) and through workgroup memory otherwise. Integrated GPUs: 8-way splits in
    /// workgroups of 64 (8 groups, 32 output rows per workgroup), tiles of up to 4 rows;
    /// discrete GPUs: 16-way splits in workgroups of 256 (16 groups, 64 rows), tiles of up to 8
    /// rows (more registers per invocation). No `shader-f16` variant: a decode matvec on a GPU is
    /// bound by the bytes of weights it streams, which f16 arithmetic does not change (the
    /// weights stay packed and are converted by one instruction per word, `unpack2x16float`,
    /// `unpack4xU8`), while f16 products would round each activation to 11 bits, ~100× the f32
    /// kernels' error; a prefill on a GPU would gain from f16 math only in a shared-memory tiled
    /// kernel, which this register-tiled one is not.
    ///
    /// Activations stay f32 unless asked otherwise: int8 activations are faster on CPU adapters
    /// (with shared loads at most 5% in decode and 1.36× in prefill; without them, SwiftShader's
    /// case, they cut the words loaded per block from 32 to 10: 2.2× in prefill and 1.2× in
    /// decode on lavapipe's plain path), but their rounding, like llama.cpp's, moves SmolLM2's
    /// logits by up to ~2.5 and misses 3 of llama.cpp's clear steps in tests/golden.rs (96.0%
    /// top-1 agreement against 98.1% with f32; the fidelity bar is all of them); on GPUs they
    /// would add a quantizing dispatch where the attention output and the FFN activation feed a
    /// matmul. [`ContextOptions::int8_activations`](crate::gpu::ContextOptions) overrides the
    /// int8 choice on any adapter.
    ///
    /// This is the variant of a Q4_1 part; given it, [`matmul_input`] runs each part of another
    /// type with [`MatmulConfig::for_device_type`] instead (their int8 choice as given), so that the
    /// graph asks for one variant per step shape and every body gets its own. A variant asked for
    /// explicitly runs as given, in every body.
    pub fn for_device(ctx: &Context, n_rows: u32) -> MatmulConfig {
        MatmulConfig::for_device_type(ctx, n_rows, GgmlType::Q4_1)
    }

    /// The variant for this adapter's class and batch ([`MatmulConfig::for_device`]) for a part of
    /// type `t`. On CPU adapters without shared activation loads (SwiftShader; lavapipe without
    /// subgroups), where every invocation loads each activation block itself, the Q4_1 body takes
    /// two row groups per invocation (`group_tile` 2, tiles of up to 8 activation rows, workgroups of
    /// 8), four with tiles of 8 rows (32 slots, in its `_wide` kernels only): measured in
    /// headless Chromium on SwiftShader (`bench_matmul`, medians of 5 alternating rounds),
    /// 576→1536 decode 1.12× and 1536→576 decode 1.13× faster with two groups than one; a 512-row
    /// prefill 1.25× faster with two groups and tiles of 8 than one group and tiles of 16, and
    /// 1.39× faster again with four groups (253 against 352 ms; tiles of 16 × 2 groups: 309). The
    /// other bodies keep one group: there it changed little (Q8_0, Q5_x, K-quants ±5%) or lost
    /// (F32/F16/BF16 decode 0.83-0.89×, Q4_0 0.95×).
    pub fn for_device_type(ctx: &Context, n_rows: u32, t: GgmlType) -> MatmulConfig {
        let tile_rows = match n_rows {
            0..=1 => 1,
            2 => 2,
            3..=4 => 4,
            5..=8 => 8,
            _ => MAX_TILE_ROWS,
        };
        let int8_activations = ctx.int8_activations.unwrap_or(false);
        let (max_tile, k_split, workgroup) = match ctx.class() {
            AdapterClass::Cpu => {
                let subgroup = ctx.has_subgroups(SUBGROUP_LANES);
                if !subgroup && t == GgmlType::Q4_1 {
                    let tile_rows = tile_rows.min(MAX_TILE_ROWS / 2);
                    let group_tile = if tile_rows == MAX_TILE_ROWS / 2 { 4 } else { 2 };
                    return MatmulConfig { tile_rows, group_tile, k_split: 1, workgroup: 8, subgroup, int8_activations };
                }
                return MatmulConfig { tile_rows, group_tile: 1, k_split: 1, workgroup: 16, subgroup, int8_activations };
            }
            AdapterClass::Integrated => (4, 8, 64),
            AdapterClass::Discrete => (8, 16, 256),
        };
        // A device may offer fewer invocations per workgroup (WebGPU's default is 256).
        let workgroup = workgroup.min(ctx.limits.max_compute_invocations_per_workgroup / k_split * k_split);
        MatmulConfig { tile_rows: tile_rows.min(max_tile), group_tile: 1, k_split, workgroup, subgroup: ctx.has_subgroups(k_split), int8_activations }
    }

    /// The variant `part` runs with this one over `n_rows` rows: the device's own variant (whatever
    /// its int8 choice) is tuned per body ([`MatmulConfig::for_device_type`], its int8 choice kept)
    /// and, on the plain CPU variant, per size: workgroups halved down to 4 invocations while the
    /// part would make fewer than [`MIN_WORKGROUPS`] (a CPU adapter runs whole workgroups on its
    /// threads, and 9 workgroups on 2 threads leave one waiting for the last: SmolLM2's 576-row
    /// matrices in decode; measured in Chromium, 1536→576 with two groups per invocation in
    /// workgroups of 4 (18 of them) 1.57 ms against 1.66 in 8 and 1.98 in 16). Any other variant
    /// runs as it is.
    fn for_part(self, ctx: &Context, n_rows: u32, part: &Part) -> MatmulConfig {
        let int8_activations = self.int8_activations;
        if self != (MatmulConfig { int8_activations, ..MatmulConfig::for_device(ctx, n_rows) }) {
            return self;
        }
        let mut config = MatmulConfig { int8_activations, ..MatmulConfig::for_device_type(ctx, n_rows, part.ggml_type) };
        if ctx.class() == AdapterClass::Cpu && matches!(config.preludes(), Preludes::Plain | Preludes::PlainWide) {
            let workgroups = |c: &MatmulConfig| {
                let (per_tile, tiles) = c.grid(part.groups, n_rows);
                per_tile * tiles
            };
            while config.workgroup > 4 && workgroups(&config) < MIN_WORKGROUPS {
                config.workgroup /= 2;
            }
        }
        config
    }

    /// The workgroups this variant dispatches over `groups` row groups and `n_rows` activation
    /// rows: (workgroups per tile of `tile_rows` rows, tiles).
    fn grid(&self, groups: u32, n_rows: u32) -> (u32, u32) {
        (groups.div_ceil(self.workgroup / self.k_split * self.group_tile), n_rows.div_ceil(self.tile_rows))
    }

    /// The activation preludes of this variant.
    pub(crate) fn preludes(&self) -> Preludes {
        match (self.subgroup, self.k_split) {
            (false, _) if self.tile_rows * self.group_tile > MAX_TILE_ROWS => Preludes::PlainWide,
            (false, _) => Preludes::Plain,
            (true, 1) => Preludes::SharedLoads,
            (true, _) => Preludes::SubgroupSum,
        }
    }

    /// Checks the variant against the shaders' limits and the device, describing what is wrong.
    fn check(&self, ctx: &Context) -> Result<(), String> {
        let MatmulConfig { tile_rows, group_tile, k_split, workgroup, subgroup, .. } = *self;
        let tile_fits = (1..=MAX_TILE_ROWS).contains(&tile_rows) && [1, 2, 4].contains(&group_tile) && tile_rows * group_tile <= self.preludes().max_slots();
        if !tile_fits || k_split == 0 || workgroup == 0 || workgroup % k_split != 0 {
            return Err(format!("invalid kernel configuration {self:?}"));
        }
        if workgroup > ctx.limits.max_compute_invocations_per_workgroup {
            return Err(format!("workgroup of {workgroup} exceeds the device's {}", ctx.limits.max_compute_invocations_per_workgroup));
        }
        let lanes = match self.preludes() {
            Preludes::Plain | Preludes::PlainWide => return Ok(()),
            Preludes::SharedLoads if workgroup % SUBGROUP_LANES != 0 => {
                return Err(format!("invalid kernel configuration {self:?}: shared activation loads need a workgroup of a multiple of {SUBGROUP_LANES}"));
            }
            Preludes::SharedLoads => SUBGROUP_LANES,
            Preludes::SubgroupSum if !k_split.is_power_of_two() => {
                return Err(format!("invalid kernel configuration {self:?}: split rows summed within a subgroup need k_split a power of two"));
            }
            Preludes::SubgroupSum => k_split,
        };
        if subgroup && !ctx.has_subgroups(lanes) {
            return Err(format!("kernel configuration {self:?} needs subgroups of at least {lanes} invocations, which this device lacks"));
        }
        Ok(())
    }
}

/// Whether a matmul with `config` on this adapter is better off normalizing its input in its
/// prologue ([`Input::Norm`]) than reading it from a norm dispatch: everywhere but on CPU adapters
/// without shared activation loads. The prologue loads the norm weight's block with every
/// activation block; where 8 lanes share those loads (lavapipe) that costs about what the norm
/// dispatch did (measured on lavapipe, medians of 7 alternating rounds of CPU time, norm +
/// matmul against the prologue: decode 576→960 1.07×, 576→3072 1.00×; a 512-row prefill 0.99×
/// and 0.96×), so the dispatch is saved for nothing; where each invocation loads everything
/// itself (SwiftShader, lavapipe's plain path) it loads 21 words per Q4_1 block instead of 13
/// and loses (0.78× in decode, 0.90-0.92× in prefill). On real GPUs the norm weight stays in
/// cache and the dispatch is what a small layer pays for (not measured: no GPU at hand).
pub fn norm_prologue_pays(ctx: &Context, config: &MatmulConfig) -> bool {
    !ctx.is_cpu() || config.subgroup
}

/// Where a matmul's activations come from.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// f32 `[n_rows, cols]`; with `int8_activations`, quantized for the int8 parts by a dispatch
    /// of the matmul's own.
    F32(&'a wgpu::Buffer),
    /// Quantized by the kernel that produced them (`norm::rms_norm_to`, [`quantize`]): `q` the
    /// int8 blocks, [`int8_bytes`]`(n_rows, cols)`, in `shaders/quantize_common.wgsl`'s layout; `f32` the same
    /// activations unquantized, needed by the parts without an int8 path
    /// ([`QuantMatrix::needs_f32`]) and by a config without `int8_activations`.
    Int8 { q: &'a wgpu::Buffer, f32: Option<&'a wgpu::Buffer> },
    /// f32 `[n_rows, cols]` rows normalized by the kernel itself before it multiplies them (the
    /// RMSNorm prologue, `NORM` in `shaders/matmul_common.wgsl`): the matmul of
    /// `norm::rms_norm(x, weight, eps)` without that dispatch and its output buffer (weight:
    /// `[cols]` f32, eps finite and ≥ 0). Each invocation sums the squares of the rows it reads
    /// and scales its finished sums by 1/rms; x itself is left as it is. f32 activations only: a
    /// matrix that reads int8 ([`QuantMatrix::reads_int8`]) is refused (its norm quantizes, in a
    /// dispatch of its own: `norm::rms_norm_to`).
    Norm { x: &'a wgpu::Buffer, weight: &'a wgpu::Buffer, eps: f32 },
}

/// Bytes of the int8 blocks of `n_rows` activation rows of `cols` values: 3 vec4<u32> (48 bytes)
/// per 32 values.
pub fn int8_bytes(n_rows: u32, cols: u32) -> u64 {
    n_rows as u64 * (cols / QK as u32) as u64 * 48
}

impl QuantMatrix {
    /// Whether a matmul with `config` over this matrix reads f32 activations: some part has no
    /// int8 body, or the config has no `int8_activations`.
    pub fn needs_f32(&self, config: &MatmulConfig) -> bool {
        !config.int8_activations || self.parts.iter().any(|p| !p.layout.has_int8_path())
    }

    /// Whether a matmul with `config` over this matrix reads int8 activations.
    pub fn reads_int8(&self, config: &MatmulConfig) -> bool {
        config.int8_activations && self.parts.iter().any(|p| p.layout.has_int8_path())
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    rows: u32,
    nb: u32,
    n_rows: u32,
    groups: u32,
    wgs_per_tile: u32,
    tiles: u32,
    y_stride: u32,
    row_base: u32,
    eps: f32,
}

/// y[r, :] = W · x[r, :] for r in 0..n_rows.
/// x: [n_rows, cols] f32, y: [n_rows, rows] f32 (y may be a larger buffer).
/// Builds the kernels once (the uniforms they read are allocated here); the caller records them
/// every step: one per part, plus the activation quantization with `int8_activations`.
pub fn matmul(ctx: &Context, w: &QuantMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, n_rows: u32) -> Result<Vec<Kernel>, GpuError> {
    matmul_into(ctx, w, (x, y), n_rows, Epilogue::Store)
}

/// [`matmul`] with an [`Epilogue`]: y += x · Wᵀ, or the gated activation (y: [n_rows, rows / 2]).
pub fn matmul_into(ctx: &Context, w: &QuantMatrix, (x, y): (&wgpu::Buffer, &wgpu::Buffer), n_rows: u32, epilogue: Epilogue) -> Result<Vec<Kernel>, GpuError> {
    matmul_configured(ctx, w, (x, y), n_rows, MatmulConfig::for_device(ctx, n_rows), epilogue)
}

/// [`matmul`] with an explicit kernel variant.
pub fn matmul_with(ctx: &Context, w: &QuantMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, n_rows: u32, config: MatmulConfig) -> Result<Vec<Kernel>, GpuError> {
    matmul_configured(ctx, w, (x, y), n_rows, config, Epilogue::Store)
}

/// [`matmul_into`] with an explicit kernel variant.
pub fn matmul_configured(
    ctx: &Context,
    w: &QuantMatrix,
    (x, y): (&wgpu::Buffer, &wgpu::Buffer),
    n_rows: u32,
    config: MatmulConfig,
    epilogue: Epilogue,
) -> Result<Vec<Kernel>, GpuError> {
    matmul_input(ctx, w, (Input::F32(x), y), n_rows, config, epilogue)
}

/// The most general matmul: activations from an [`Input`] (f32, or quantized by their producer),
/// an explicit kernel variant and an [`Epilogue`]. y: [n_rows, rows] f32 ([n_rows, rows / 2] gated).
pub fn matmul_input(
    ctx: &Context,
    w: &QuantMatrix,
    (input, y): (Input<'_>, &wgpu::Buffer),
    n_rows: u32,
    config: MatmulConfig,
    epilogue: Epilogue,
) -> Result<Vec<Kernel>, GpuError> {
    const OP: &str = "matmul";
    if w.gated != matches!(epilogue, Epilogue::Gated(_)) {
        return Err(shape_err(OP, format!("{epilogue:?} needs a matrix {} interleaved gate and up rows", if w.gated { "without" } else { "of" })));
    }
    config.check(ctx).map_err(|e| shape_err(OP, e))?;
    if n_rows == 0 {
        return Err(shape_err(OP, "n_rows must be positive"));
    }
    let (x, given_q, norm) = match input {
        Input::F32(x) => (Some(x), None, None),
        Input::Int8 { q, f32 } => (f32, Some(q), None),
        Input::Norm { x, weight, eps } => (Some(x), None, Some((weight, eps))),
    };
    if [x, given_q, norm.map(|n| n.0)].into_iter().flatten().any(|b| b == y) {
        return Err(shape_err(OP, "y must be a different buffer from x and the norm weight"));
    }
    if let Some(norm) = norm {
        check_norm(ctx, w, &config, norm)?;
    }
    let y_width = if w.gated { w.rows / 2 } else { w.rows };
    check_size(OP, "y", y, n_rows as u64 * y_width as u64 * 4)?;
    check_binding(ctx, OP, "y", y.size())?;
    let x = match x {
        Some(x) => {
            check_size(OP, "x", x, n_rows as u64 * w.cols as u64 * 4)?;
            check_binding(ctx, OP, "x", x.size())?;
            Some(x)
        }
        None if w.needs_f32(&config) => {
            let types: Vec<String> = w.types().iter().map(|t| t.name()).collect();
            return Err(shape_err(OP, format!("a {} matrix with {config:?} needs f32 activations, none were given", types.join("|"))));
        }
        None => None,
    };
    let mut kernels = Vec::with_capacity(w.parts.len() + 1);
    // The quantized activations (see quantize_common.wgsl): the producer's, or quantized here into a
    // scratch buffer that the bind groups keep alive as long as the kernels.
    let xq = if w.reads_int8(&config) {
        let bytes = int8_bytes(n_rows, w.cols);
        check_binding(ctx, OP, "quantized x", bytes)?;
        match (given_q, x) {
            (Some(q), _) => {
                check_size(OP, "quantized x", q, bytes)?;
                Some(q.clone())
            }
            (None, Some(x)) => {
                let xq = ctx.storage_zeroed("matmul.xq", bytes);
                kernels.push(quantize_activations(ctx, x, &xq, bytes / 48)?);
                Some(xq)
            }
            (None, None) => return Err(shape_err(OP, "int8 activations need either their quantized blocks or f32 values")),
        }
    } else {
        None
    };
    for part in &w.parts {
        let config = config.for_part(ctx, n_rows, part);
        let int8 = config.int8_activations && part.layout.has_int8_path();
        let input = match (int8, &xq, x) {
            (true, Some(q), _) => q,
            (_, _, Some(x)) => x,
            _ => return Err(shape_err(OP, format!("{} part without activations for {config:?}", part.ggml_type.name()))),
        };
        let config = MatmulConfig { int8_activations: int8, ..config };
        kernels.push(part_kernel(ctx, (w, part), (input, y), n_rows, (config, norm), epilogue)?);
    }
    Ok(kernels)
}

/// Checks the norm of an [`Input::Norm`] = (weight, eps) for a matmul over `w` with `config`.
fn check_norm(ctx: &Context, w: &QuantMatrix, config: &MatmulConfig, (weight, eps): (&wgpu::Buffer, f32)) -> Result<(), GpuError> {
    const OP: &str = "matmul";
    if w.reads_int8(config) {
        return Err(shape_err(OP, format!("the norm prologue takes f32 activations, and {config:?} reads int8 ones: quantize in the norm (rms_norm_to)")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("the norm's eps must be finite and >= 0, got {eps}")));
    }
    check_size(OP, "norm weight", weight, w.cols as u64 * 4)?;
    check_binding(ctx, OP, "norm weight", weight.size())
}

/// The kernel of one part: its rows of y, from x (or the quantized x with `int8_activations`),
/// normalized in its prologue with `norm` = (weight, eps).
fn part_kernel(
    ctx: &Context,
    (w, part): (&QuantMatrix, &Part),
    (x, y): (&wgpu::Buffer, &wgpu::Buffer),
    n_rows: u32,
    (config, norm): (MatmulConfig, Option<(&wgpu::Buffer, f32)>),
    epilogue: Epilogue,
) -> Result<Kernel, GpuError> {
    let MatmulConfig { tile_rows, group_tile, k_split, workgroup, int8_activations, .. } = config;
    let (wgs_per_tile, tiles) = config.grid(part.groups, n_rows);
    let workgroups = linear_grid(ctx, "matmul", wgs_per_tile as u64 * tiles as u64)?;
    let params = MatmulParams {
        rows: part.rows,
        nb: w.cols / QK as u32,
        n_rows,
        groups: part.groups,
        wgs_per_tile,
        tiles,
        y_stride: if w.gated { w.rows / 2 } else { w.rows },
        row_base: part.row0,
        eps: norm.map_or(0.0, |n| n.1),
    };
    let (epilogue, gelu) = match epilogue {
        Epilogue::Store => (0.0, 0.0),
        Epilogue::Accumulate => (1.0, 0.0),
        Epilogue::Gated(act) => (2.0, if act == Activation::GeluTanh { 1.0 } else { 0.0 }),
    };
    let uniform = ctx.params_init("matmul.params", bytemuck::bytes_of(&params));
    let name = part.layout.matmul_shader(config.preludes());
    let pipeline = ctx.pipeline(
        name,
        "main",
        &[
            ("WG", workgroup as f64),
            ("KSPLIT", k_split as f64),
            ("TM", tile_rows as f64),
            ("TG", group_tile as f64),
            ("INT8", if int8_activations { 1.0 } else { 0.0 }),
            ("EPILOGUE", epilogue),
            ("GELU", gelu),
            ("NORM", if norm.is_some() { 1.0 } else { 0.0 }),
        ],
    )?;
    // Without the prologue x stands in for its weight (read-only, never read: a shader binds
    // every binding it declares).
    let norm_w = norm.map_or(x, |n| n.0);
    let kernel = Kernel::new(ctx, name, pipeline, &[whole(&part.buffer), whole(x), whole(y), whole(&uniform), whole(norm_w)], workgroups, None);
    Ok(kernel.owning(uniform))
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QuantizeParams {
    blocks: u32,
}

const QUANTIZE_WG: u64 = 32;

/// xq ← the int8 blocks of x for a matmul's [`Input::Int8`] (`shaders/quantize_act.wgsl`), for
/// activations whose producer does not quantize them itself.
/// x: [n_rows, cols] f32; xq: [`int8_bytes`]`(n_rows, cols)` bytes; cols a multiple of 32.
pub fn quantize(ctx: &Context, x: &wgpu::Buffer, xq: &wgpu::Buffer, n_rows: u32, cols: u32) -> Result<Kernel, GpuError> {
    const OP: &str = "quantize";
    if n_rows == 0 || cols == 0 || cols % QK as u32 != 0 {
        return Err(shape_err(OP, format!("{n_rows} rows of {cols}: both must be positive and cols a multiple of {QK}")));
    }
    if x == xq {
        return Err(shape_err(OP, "xq must be a different buffer from x"));
    }
    check_size(OP, "x", x, n_rows as u64 * cols as u64 * 4)?;
    check_size(OP, "xq", xq, int8_bytes(n_rows, cols))?;
    check_binding(ctx, OP, "x", x.size())?;
    check_binding(ctx, OP, "xq", xq.size())?;
    quantize_activations(ctx, x, xq, int8_bytes(n_rows, cols) / 48)
}

/// xq ← int8 blocks of x (quantize_act.wgsl). x: [blocks · 32] f32; xq: [blocks · 3] vec4<u32>.
fn quantize_activations(ctx: &Context, x: &wgpu::Buffer, xq: &wgpu::Buffer, blocks: u64) -> Result<Kernel, GpuError> {
    let params = QuantizeParams { blocks: u32::try_from(blocks).map_err(|_| shape_err("matmul", "more than 2^32 activation blocks"))? };
    let uniform = ctx.uniform_init("quantize_act.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("quantize_act", "main", &[("WG", QUANTIZE_WG as f64)])?;
    let workgroups = linear_grid(ctx, "matmul", blocks.div_ceil(QUANTIZE_WG))?;
    let kernel = Kernel::new(ctx, "quantize_act", pipeline, &[whole(x), whole(xq), whole(&uniform)], workgroups, None);
    Ok(kernel.owning(uniform))
}

/// Workgroups for a linear count, split over x and y; refuses counts no grid can hold.
pub(crate) fn linear_grid(ctx: &Context, op: &'static str, total: u64) -> Result<[u32; 3], GpuError> {
    let max = ctx.limits.max_compute_workgroups_per_dimension.max(1) as u64;
    if total > max * max || total > u32::MAX as u64 {
        return Err(shape_err(op, format!("{total} workgroups exceed the device's {max} × {max} grid")));
    }
    Ok(split_workgroups(ctx, total as u32))
}
