//! Matrix multiply with GGUF-quantized weights (Q4_1, Q8_0) kept quantized on the GPU and
//! dequantized in registers inside the kernel.
//!
//! Weights are repacked once at upload into an interleaved layout of the same size as the GGUF
//! data: the blocks of G adjacent rows (G = 4 for Q4_1, 8 for Q8_0) that cover the same 32 columns
//! are stored side by side, scales first, so one invocation computing G output rows reads one
//! contiguous run per block, the quants as `vec4<u32>` and the f16 scales through
//! `unpack2x16float` (no `shader-f16`). The layout is documented in `shaders/matmul_q4_1.wgsl`
//! and `shaders/matmul_q8_0.wgsl`; `shaders/embed_q8_0.wgsl` reads the same one.
//!
//! One kernel per format serves decode (1 activation row), small batches and prefill: an
//! invocation computes TM activation rows × G output rows, TM chosen from `n_rows` (register
//! tiling: every weight block is dequantized once per TM rows). On CPU adapters each invocation
//! walks a whole row (no shared memory, no barriers, see KERNELS.md); on other adapters KSPLIT
//! invocations split the blocks of a row and reduce through workgroup memory. Both are override
//! constants of the same shader. Accumulation is f32 and, by default, activations stay f32, so the
//! result equals the f32 dot product of the dequantized weights up to summation order (relative
//! error ~1e-6 of Σ|w·x|). [`MatmulConfig::int8_activations`] opts into llama.cpp's trick instead:
//! activations quantized to int8 per 32-value block by a first dispatch, products through
//! `dot4I8Packed`; faster on the software GPUs, within [`int8_error_bound`] of the exact result.

use super::{check_binding, check_size, whole};
use crate::gpu::kernel::split_workgroups;
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::{QK, Q4_1_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// The GGML block formats a [`QuantMatrix`] can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlKind {
    /// 20-byte blocks: f16 scale, f16 minimum, 32 4-bit quants.
    Q4_1,
    /// 34-byte blocks: f16 scale, 32 signed 8-bit quants.
    Q8_0,
}

impl GgmlKind {
    /// Bytes of one 32-value block in GGUF.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlKind::Q4_1 => Q4_1_BLOCK_BYTES,
            GgmlKind::Q8_0 => Q8_0_BLOCK_BYTES,
        }
    }

    /// Rows interleaved in one group of the repacked layout (= output rows per invocation).
    pub fn group_rows(self) -> u32 {
        match self {
            GgmlKind::Q4_1 => 4,
            GgmlKind::Q8_0 => 8,
        }
    }

    /// `vec4<u32>`s one group's block occupies: the scales, then every row's quants.
    fn group_block_vec4s(self) -> usize {
        match self {
            GgmlKind::Q4_1 => 5,
            GgmlKind::Q8_0 => 17,
        }
    }

    fn shader(self) -> &'static str {
        match self {
            GgmlKind::Q4_1 => "matmul_q4_1",
            GgmlKind::Q8_0 => "matmul_q8_0",
        }
    }
}

/// A weight matrix y = x · Wᵀ with W: [rows (out features), cols (in features)], uploaded once,
/// kept quantized in the repacked layout described in the module documentation.
pub struct QuantMatrix {
    pub rows: u32,
    pub cols: u32,
    pub ggml_type: GgmlKind,
    /// The repacked blocks: [groups · cols/32 · group_block_vec4s] vec4<u32>.
    pub(crate) buffer: wgpu::Buffer,
    /// Row groups, the last one padded with zero rows.
    pub(crate) groups: u32,
}

impl QuantMatrix {
    /// raw: GGUF bytes of a matrix with ne0 = cols, ne1 = rows (row after row of 32-value blocks).
    pub fn upload(ctx: &Context, label: &str, kind: GgmlKind, raw: &[u8], rows: u32, cols: u32) -> Result<QuantMatrix, GpuError> {
        let packed = repack(kind, raw, rows, cols)?;
        let bytes = packed.len() as u64 * 4;
        check_binding(ctx, "QuantMatrix::upload", label, bytes)?;
        let buffer = ctx.storage_init(label, bytemuck::cast_slice(&packed));
        Ok(QuantMatrix { rows, cols, ggml_type: kind, buffer, groups: rows.div_ceil(kind.group_rows()) })
    }

    /// Several matrices with the same cols stacked along rows (fused q|k|v, fused gate|up):
    /// the output of the stack is the concatenation of each part's outputs, in order.
    /// parts: (GGUF bytes, rows) of each matrix.
    pub fn upload_stacked(ctx: &Context, label: &str, kind: GgmlKind, parts: &[(&[u8], u32)], cols: u32) -> Result<QuantMatrix, GpuError> {
        if parts.is_empty() {
            return Err(shape_err("QuantMatrix::upload_stacked", format!("{label}: no parts")));
        }
        let mut raw = Vec::new();
        let mut rows = 0u32;
        for (i, (bytes, part_rows)) in parts.iter().enumerate() {
            check_raw(kind, bytes, *part_rows, cols).map_err(|e| shape_err("QuantMatrix::upload_stacked", format!("{label} part {i}: {e}")))?;
            raw.extend_from_slice(bytes);
            rows = rows
                .checked_add(*part_rows)
                .ok_or_else(|| shape_err("QuantMatrix::upload_stacked", format!("{label}: more than 2^32 rows")))?;
        }
        QuantMatrix::upload(ctx, label, kind, &raw, rows, cols)
    }

    /// GPU bytes held.
    pub fn bytes(&self) -> u64 {
        self.buffer.size()
    }
}

/// Checks that `raw` is a GGUF `kind` matrix of `rows` × `cols`, describing what is wrong.
fn check_raw(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32) -> Result<(), String> {
    if rows == 0 || cols == 0 || cols as usize % QK != 0 {
        return Err(format!("{rows} rows × {cols} cols: both must be positive and cols a multiple of {QK}"));
    }
    let want = rows as u64 * (cols as u64 / QK as u64) * kind.block_bytes() as u64;
    if raw.len() as u64 != want {
        return Err(format!("{kind:?} {rows} × {cols} takes {want} bytes, {} given", raw.len()));
    }
    Ok(())
}

/// Rewrites GGUF blocks into the interleaved layout the kernels read (same size, plus zero rows
/// padding the last group): [groups][cols / 32][group_block_vec4s · 4] u32.
pub fn repack(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32) -> Result<Vec<u32>, GpuError> {
    check_raw(kind, raw, rows, cols).map_err(|e| shape_err("QuantMatrix::upload", e))?;
    let nb = cols as usize / QK;
    let g_rows = kind.group_rows() as usize;
    let groups = (rows as usize).div_ceil(g_rows);
    let unit = kind.group_block_vec4s() * 4;
    let bb = kind.block_bytes();
    let word = |bytes: &[u8], at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let mut out = vec![0u32; groups * nb * unit];
    for row in 0..rows as usize {
        let (g, r) = (row / g_rows, row % g_rows);
        for b in 0..nb {
            let block = &raw[(row * nb + b) * bb..][..bb];
            let dst = &mut out[(g * nb + b) * unit..][..unit];
            match kind {
                GgmlKind::Q4_1 => {
                    // u32 r: d | m << 16, the first 4 bytes of the block read little-endian.
                    dst[r] = word(block, 0);
                    for i in 0..4 {
                        dst[4 + 4 * r + i] = word(block, 4 + 4 * i);
                    }
                }
                GgmlKind::Q8_0 => {
                    let d = u16::from_le_bytes([block[0], block[1]]) as u32;
                    dst[r / 2] |= d << (16 * (r % 2));
                    for i in 0..8 {
                        dst[4 + 8 * r + i] = word(block, 2 + 4 * i);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// How the matmul kernel is specialized. [`MatmulConfig::for_device`] picks the measured best;
/// tests and benchmarks set fields to exercise the other variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    /// Activation rows per invocation (1..=16).
    pub tile_rows: u32,
    /// Invocations splitting the blocks of one row group (1 = no workgroup memory, no barriers).
    pub k_split: u32,
    /// Invocations per workgroup, a multiple of `k_split`.
    pub workgroup: u32,
    /// Apply the block scale (and Q4_1 minimum) once per block and activation row, after an
    /// integer-valued dot product, instead of dequantizing every value once for all `tile_rows`.
    pub scale_after: bool,
    /// Quantize the activations to int8 per 32-value block first (one more dispatch) and multiply
    /// with `dot4I8Packed`, as llama.cpp does. Not exact: see [`int8_error_bound`].
    pub int8_activations: bool,
}

/// The largest `tile_rows` the shaders hold registers for (`MAX_TM` in WGSL).
pub const MAX_TILE_ROWS: u32 = 16;

impl MatmulConfig {
    /// The variant for this adapter and batch: register tiles of up to 8 activation rows and whole
    /// rows per invocation on CPU adapters (KERNELS.md), 8-way split rows in 64-wide workgroups elsewhere
    /// (not measured: no real GPU at hand). Activations stay f32, so results match the f32 reference;
    /// `int8_activations` is faster (1.4-1.6× on lavapipe) but adds activation rounding, callers opt in.
    pub fn for_device(ctx: &Context, n_rows: u32) -> MatmulConfig {
        let tile_rows = match n_rows {
            0..=1 => 1,
            2 => 2,
            3..=4 => 4,
            _ => 8,
        };
        // Per-block scaling measured ~10% faster for decode on lavapipe and even for larger tiles.
        let scale_after = true;
        if ctx.is_cpu() {
            MatmulConfig { tile_rows, k_split: 1, workgroup: 16, scale_after, int8_activations: false }
        } else {
            MatmulConfig { tile_rows: tile_rows.min(4), k_split: 8, workgroup: 64, scale_after, int8_activations: false }
        }
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
    _pad: u32,
}

/// y[r, :] = W · x[r, :] for r in 0..n_rows.
/// x: [n_rows, cols] f32, y: [n_rows, rows] f32 (y may be a larger buffer).
/// Builds the kernels once (the uniform they read is allocated here); the caller records them every step.
pub fn matmul(ctx: &Context, w: &QuantMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, n_rows: u32) -> Result<Vec<Kernel>, GpuError> {
    matmul_with(ctx, w, x, y, n_rows, MatmulConfig::for_device(ctx, n_rows))
}

/// [`matmul`] with an explicit kernel variant.
pub fn matmul_with(
    ctx: &Context,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n_rows: u32,
    config: MatmulConfig,
) -> Result<Vec<Kernel>, GpuError> {
    const OP: &str = "matmul";
    let MatmulConfig { tile_rows, k_split, workgroup, scale_after, int8_activations } = config;
    if !(1..=MAX_TILE_ROWS).contains(&tile_rows) || k_split == 0 || workgroup == 0 || workgroup % k_split != 0 {
        return Err(shape_err(OP, format!("invalid kernel configuration {config:?}")));
    }
    if workgroup > ctx.limits.max_compute_invocations_per_workgroup {
        return Err(shape_err(OP, format!("workgroup of {workgroup} exceeds the device's {}", ctx.limits.max_compute_invocations_per_workgroup)));
    }
    if n_rows == 0 {
        return Err(shape_err(OP, "n_rows must be positive"));
    }
    let x_bytes = n_rows as u64 * w.cols as u64 * 4;
    let y_bytes = n_rows as u64 * w.rows as u64 * 4;
    check_size(OP, "x", x, x_bytes)?;
    check_size(OP, "y", y, y_bytes)?;
    check_binding(ctx, OP, "x", x.size())?;
    check_binding(ctx, OP, "y", y.size())?;
    let wgs_per_tile = w.groups.div_ceil(workgroup / k_split);
    let tiles = n_rows.div_ceil(tile_rows);
    let total = wgs_per_tile as u64 * tiles as u64;
    let workgroups = linear_grid(ctx, OP, total)?;
    let params = MatmulParams {
        rows: w.rows,
        nb: w.cols / QK as u32,
        n_rows,
        groups: w.groups,
        wgs_per_tile,
        tiles,
        y_stride: w.rows,
        _pad: 0,
    };
    let uniform = ctx.uniform_init("matmul.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline(
        w.ggml_type.shader(),
        "main",
        &[
            ("WG", workgroup as f64),
            ("KSPLIT", k_split as f64),
            ("TM", tile_rows as f64),
            ("SCALE_AFTER", if scale_after { 1.0 } else { 0.0 }),
            ("INT8", if int8_activations { 1.0 } else { 0.0 }),
        ],
    )?;
    let name = w.ggml_type.shader();
    if !int8_activations {
        let kernel = Kernel::new(ctx, name, pipeline, &[whole(&w.buffer), whole(x), whole(y), whole(&uniform)], workgroups, None);
        return Ok(vec![kernel.owning(uniform)]);
    }
    // The quantized activations: 3 vec4<u32> per 32-value block (see quantize_act.wgsl). The
    // bind groups keep this scratch buffer alive as long as the kernels.
    let blocks = n_rows as u64 * params.nb as u64;
    check_binding(ctx, OP, "quantized x", blocks * 48)?;
    let xq = ctx.storage_zeroed("matmul.xq", blocks * 48);
    let quantize = quantize_activations(ctx, x, &xq, blocks)?;
    let kernel = Kernel::new(ctx, name, pipeline, &[whole(&w.buffer), whole(&xq), whole(y), whole(&uniform)], workgroups, None);
    Ok(vec![quantize, kernel.owning(uniform)])
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QuantizeParams {
    blocks: u32,
}

const QUANTIZE_WG: u64 = 32;

/// xq ← int8 blocks of x (quantize_act.wgsl). x: [blocks · 32] f32; xq: [blocks · 3] vec4<u32>.
fn quantize_activations(ctx: &Context, x: &wgpu::Buffer, xq: &wgpu::Buffer, blocks: u64) -> Result<Kernel, GpuError> {
    let params = QuantizeParams { blocks: u32::try_from(blocks).map_err(|_| shape_err("matmul", "more than 2^32 activation blocks"))? };
    let uniform = ctx.uniform_init("quantize_act.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("quantize_act", "main", &[("WG", QUANTIZE_WG as f64)])?;
    let workgroups = linear_grid(ctx, "matmul", blocks.div_ceil(QUANTIZE_WG))?;
    let kernel = Kernel::new(ctx, "quantize_act", pipeline, &[whole(x), whole(xq), whole(&uniform)], workgroups, None);
    Ok(kernel.owning(uniform))
}

#[cfg(feature = "testing")]
/// The largest |error| int8 activations can add to output [a, n] (`int8_activations`):
/// Σ_k |d·q[n,k]| · step(a,k) / 2, where d·q is the weight without Q4_1's minimum (the minimum
/// multiplies the exact f32 sum of the block) and step = max |x| / 127 over the activation block
/// holding k. f32 rounding comes on top. raw: GGUF [rows, cols]; x: [n_rows, cols]; returns [n_rows, rows].
pub fn int8_error_bound(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f64>, GpuError> {
    check_raw(kind, raw, rows, cols).map_err(|e| shape_err("int8_error_bound", e))?;
    let (rows, cols) = (rows as usize, cols as usize);
    if x.len() != n_rows as usize * cols {
        return Err(shape_err("int8_error_bound", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let mut scaled = dequantize(kind, raw, rows * cols);
    if kind == GgmlKind::Q4_1 {
        for (block, values) in raw.chunks_exact(Q4_1_BLOCK_BYTES).zip(scaled.chunks_exact_mut(QK)) {
            let m = half::f16::from_le_bytes([block[2], block[3]]).to_f32();
            values.iter_mut().for_each(|v| *v -= m);
        }
    }
    let mut out = Vec::with_capacity(n_rows as usize * rows);
    for xa in x.chunks_exact(cols) {
        let half_steps: Vec<f64> = xa
            .chunks_exact(QK)
            .map(|block| block.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0 / 2.0)
            .collect();
        for wn in scaled.chunks_exact(cols) {
            out.push(wn.iter().enumerate().map(|(k, v)| v.abs() as f64 * half_steps[k / QK]).sum());
        }
    }
    Ok(out)
}

#[cfg(feature = "testing")]
/// CPU reference: dequantizes the GGUF matrix and takes f64 dot products.
/// raw: [rows, cols] in GGUF blocks; x: [n_rows, cols]; returns [n_rows, rows].
pub fn matmul_cpu(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f32>, GpuError> {
    check_raw(kind, raw, rows, cols).map_err(|e| shape_err("matmul_cpu", e))?;
    let (rows, cols, n_rows) = (rows as usize, cols as usize, n_rows as usize);
    if x.len() != n_rows * cols {
        return Err(shape_err("matmul_cpu", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let weights = dequantize(kind, raw, rows * cols);
    let mut y = vec![0f32; n_rows * rows];
    for a in 0..n_rows {
        let xa = &x[a * cols..][..cols];
        for n in 0..rows {
            let wn = &weights[n * cols..][..cols];
            y[a * rows + n] = wn.iter().zip(xa).map(|(&p, &q)| p as f64 * q as f64).sum::<f64>() as f32;
        }
    }
    Ok(y)
}

#[cfg(feature = "testing")]
/// CPU reference of the int8-activation variant: quantizes every 32-value block of x as
/// quantize_act.wgsl does (d = max|x| / 127, q = x · (1/d) rounded half to even), then takes
/// Σ_b d_w · d_x · Σ q_w q_x (+ m · Σ x for Q4_1) in f64.
/// raw: [rows, cols] in GGUF blocks; x: [n_rows, cols]; returns [n_rows, rows].
pub fn matmul_int8_cpu(kind: GgmlKind, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f32>, GpuError> {
    check_raw(kind, raw, rows, cols).map_err(|e| shape_err("matmul_int8_cpu", e))?;
    let (rows, nb) = (rows as usize, cols as usize / QK);
    if x.len() != n_rows as usize * cols as usize {
        return Err(shape_err("matmul_int8_cpu", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let bb = kind.block_bytes();
    let f16_at = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32() as f64;
    let mut y = Vec::with_capacity(n_rows as usize * rows);
    for xa in x.chunks_exact(cols as usize) {
        // (d, Σx, quants) per activation block.
        let blocks: Vec<(f64, f64, [i32; QK])> = xa
            .chunks_exact(QK)
            .map(|v| {
                let d = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let mut q = [0i32; QK];
                q.iter_mut().zip(v).for_each(|(q, x)| *q = (x * inv).round_ties_even() as i32);
                (d as f64, v.iter().sum::<f32>() as f64, q)
            })
            .collect();
        for n in 0..rows {
            let mut sum = 0f64;
            for (b, (dx, sx, qx)) in blocks.iter().enumerate() {
                let block = &raw[(n * nb + b) * bb..][..bb];
                let dw = f16_at(block, 0);
                let (dot, min_term) = match kind {
                    GgmlKind::Q4_1 => {
                        let dot: i32 = (0..16).map(|j| (block[4 + j] & 15) as i32 * qx[j] + (block[4 + j] >> 4) as i32 * qx[j + 16]).sum();
                        (dot, f16_at(block, 2) * sx)
                    }
                    GgmlKind::Q8_0 => ((0..QK).map(|j| block[2 + j] as i8 as i32 * qx[j]).sum(), 0.0),
                };
                sum += dw * dx * dot as f64 + min_term;
            }
            y.push(sum as f32);
        }
    }
    Ok(y)
}

#[cfg(feature = "testing")]
/// Dequantizes `n` values of GGUF `kind` blocks (the caller has checked the length).
pub(crate) fn dequantize(kind: GgmlKind, raw: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    match kind {
        GgmlKind::Q4_1 => crate::quant::dequantize_q4_1(raw, &mut out),
        GgmlKind::Q8_0 => crate::quant::dequantize_q8_0(raw, &mut out),
    }
    out
}

/// Workgroups for a linear count, split over x and y; refuses counts no grid can hold.
pub(crate) fn linear_grid(ctx: &Context, op: &'static str, total: u64) -> Result<[u32; 3], GpuError> {
    let max = ctx.limits.max_compute_workgroups_per_dimension.max(1) as u64;
    if total > max * max || total > u32::MAX as u64 {
        return Err(shape_err(op, format!("{total} workgroups exceed the device's {max} × {max} grid")));
    }
    Ok(split_workgroups(ctx, total as u32))
}
