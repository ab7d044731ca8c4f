//! RMSNorm: llama's normalisation before attention, before the FFN and before the output (and
//! Gemma 3's after attention and after the FFN), and per head of q and k (Gemma 3's QK norm).

use super::{check_binding, check_size, grid, matmul, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::QK;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RmsNormParams {
    n_rows: u32,
    dim: u32,
    eps: f32,
    _pad: u32,
}

/// One invocation per row (see the shader), 64 rows per workgroup.
const RMS_NORM_WG: u64 = 64;

/// Where a norm writes its rows: f32, int8 blocks for the matmul after it
/// ([`matmul::Input::Int8`]), or both.
#[derive(Clone, Copy, Debug)]
pub struct NormOut<'a> {
    /// [n_rows, dim] f32.
    pub f32: Option<&'a wgpu::Buffer>,
    /// The same values quantized per 32-value block (`shaders/quantize_common.wgsl`):
    /// [`matmul::int8_bytes`]`(n_rows, dim)` bytes; dim must be a multiple of 32.
    pub int8: Option<&'a wgpu::Buffer>,
}

impl<'a> NormOut<'a> {
    /// f32 rows only.
    pub fn f32(out: &'a wgpu::Buffer) -> NormOut<'a> {
        NormOut { f32: Some(out), int8: None }
    }

    /// Checks the outputs of `op` for `n_rows` rows of `dim` (not aliasing `inputs`) and returns
    /// the buffers to bind, placeholders where an output is not written (the shader declares
    /// both), and the override constants saying which are.
    fn bind(self, ctx: &Context, op: &'static str, (n_rows, dim): (u32, u32), inputs: &[&wgpu::Buffer]) -> Result<NormBindings, GpuError> {
        if self.f32.is_none() && self.int8.is_none() {
            return Err(shape_err(op, "a norm needs an f32 or an int8 output"));
        }
        let outs: Vec<&wgpu::Buffer> = [self.f32, self.int8].into_iter().flatten().collect();
        if outs.iter().any(|o| inputs.contains(o)) || (outs.len() == 2 && outs[0] == outs[1]) {
            return Err(shape_err(op, "out must be a different buffer from the norm's inputs and its other output (different buffers)"));
        }
        if let Some(out) = self.f32 {
            check_size(op, "out", out, n_rows as u64 * dim as u64 * 4)?;
            check_binding(ctx, op, "out", out.size())?;
        }
        if let Some(q) = self.int8 {
            if dim % QK as u32 != 0 {
                return Err(shape_err(op, format!("int8 output needs dim a multiple of {QK}, got {dim}")));
            }
            check_size(op, "int8 out", q, matmul::int8_bytes(n_rows, dim))?;
            check_binding(ctx, op, "int8 out", q.size())?;
        }
        Ok(NormBindings {
            f32: self.f32.cloned().unwrap_or_else(|| ctx.storage_zeroed("norm.no_f32", 4)),
            int8: self.int8.cloned().unwrap_or_else(|| ctx.storage_zeroed("norm.no_int8", 48)),
            constants: [("F32_OUT", if self.f32.is_some() { 1.0 } else { 0.0 }), ("QUANT", if self.int8.is_some() { 1.0 } else { 0.0 })],
        })
    }
}

/// The output bindings of a norm kernel (kept alive by its bind group).
struct NormBindings {
    f32: wgpu::Buffer,
    int8: wgpu::Buffer,
    constants: [(&'static str, f64); 2],
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, per row.
/// x: [n_rows, dim] f32, weight: [dim] f32, out: [n_rows, dim] f32 (may not alias x).
/// `n_rows` and `dim` must be at least 1, `eps` finite and >= 0.
pub fn rms_norm(ctx: &Context, x: &wgpu::Buffer, weight: &wgpu::Buffer, out: &wgpu::Buffer, n_rows: u32, dim: u32, eps: f32) -> Result<Kernel, GpuError> {
    rms_norm_to(ctx, x, weight, NormOut::f32(out), n_rows, dim, eps)
}

/// [`rms_norm`] into f32 rows, int8 blocks (the next matmul's activations, quantized in the same
/// pass), or both ([`NormOut`]).
pub fn rms_norm_to(ctx: &Context, x: &wgpu::Buffer, weight: &wgpu::Buffer, out: NormOut<'_>, n_rows: u32, dim: u32, eps: f32) -> Result<Kernel, GpuError> {
    const OP: &str = "rms_norm";
    if n_rows == 0 || dim == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and dim ({dim}) must be at least 1")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
    }
    let elems = n_rows as u64 * dim as u64;
    check_size(OP, "x", x, elems * 4)?;
    check_size(OP, "weight", weight, dim as u64 * 4)?;
    for (what, buffer) in [("x", x), ("weight", weight)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let out = out.bind(ctx, OP, (n_rows, dim), &[x])?;
    let params = RmsNormParams { n_rows, dim, eps, _pad: 0 };
    let params = ctx.uniform_init("rms_norm.params", bytemuck::bytes_of(&params));
    let [f32_out, quant] = out.constants;
    let pipeline = ctx.pipeline("rms_norm", "main", &[("WG", RMS_NORM_WG as f64), f32_out, quant])?;
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[whole(x), whole(weight), whole(&out.f32), whole(&params), whole(&out.int8)],
        grid(ctx, n_rows as u64, RMS_NORM_WG),
        None,
    );
    Ok(kernel.owning(params))
}

/// `x += rms_norm(delta) · post`, then, with `next = Some((weight, out))`,
/// `out = rms_norm(x) · weight` ([`NormOut`]: f32, int8 or both): a post-normed residual add and
/// the next pre-norm in one dispatch (Gemma 3), the same arithmetic as [`rms_norm`] and an add in
/// their order. x, delta: [n_rows, dim] f32, different buffers, neither an output; post, weight:
/// [dim] f32. `n_rows` and `dim` must be at least 1, `eps` finite and >= 0.
pub fn residual_norm(
    ctx: &Context,
    (x, delta): (&wgpu::Buffer, &wgpu::Buffer),
    post: &wgpu::Buffer,
    next: Option<(&wgpu::Buffer, NormOut<'_>)>,
    (n_rows, dim, eps): (u32, u32, f32),
) -> Result<Kernel, GpuError> {
    const OP: &str = "residual_norm";
    if n_rows == 0 || dim == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and dim ({dim}) must be at least 1")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
    }
    if x == delta {
        return Err(shape_err(OP, "x, delta and out must be three different buffers"));
    }
    let elems = n_rows as u64 * dim as u64;
    check_size(OP, "x", x, elems * 4)?;
    check_size(OP, "delta", delta, elems * 4)?;
    check_size(OP, "post", post, dim as u64 * 4)?;
    // Without a next norm its bindings still need buffers: post stands in for the weight, and
    // the outputs are placeholders written by nobody (NORM off), two of them: WebGPU refuses a
    // dispatch whose writable storage bindings overlap (Chromium drops it; wgpu natively does not
    // check).
    let (weight, out) = match next {
        Some((weight, out)) => {
            check_size(OP, "weight", weight, dim as u64 * 4)?;
            (weight, out.bind(ctx, OP, (n_rows, dim), &[x, delta])?)
        }
        None => {
            let (f32, int8) = (ctx.storage_zeroed("residual_norm.no_f32", 4), ctx.storage_zeroed("residual_norm.no_int8", 48));
            (post, NormBindings { f32, int8, constants: [("F32_OUT", 0.0), ("QUANT", 0.0)] })
        }
    };
    for (what, buffer) in [("x", x), ("delta", delta), ("post", post), ("weight", weight)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = RmsNormParams { n_rows, dim, eps, _pad: 0 };
    let params = ctx.uniform_init("residual_norm.params", bytemuck::bytes_of(&params));
    let norm = if next.is_some() { 1.0 } else { 0.0 };
    let [f32_out, quant] = out.constants;
    let pipeline = ctx.pipeline("residual_norm", "main", &[("WG", RMS_NORM_WG as f64), ("NORM", norm), f32_out, quant])?;
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[whole(x), whole(delta), whole(post), whole(weight), whole(&out.f32), whole(&params), whole(&out.int8)],
        grid(ctx, n_rows as u64, RMS_NORM_WG),
        None,
    );
    Ok(kernel.owning(params))
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct HeadNormParams {
    n_rows: u32,
    row_stride: u32,
    first: u32,
    n_heads: u32,
    head_dim: u32,
    eps: f32,
    _pad: [u32; 2],
}

/// Which heads of which rows a [`head_norm`] normalizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadNormShape {
    pub n_rows: u32,
    /// f32 elements per row of x.
    pub row_stride: u32,
    /// The column where the first normalized head starts.
    pub first: u32,
    /// Consecutive heads normalized from `first` on.
    pub n_heads: u32,
    pub head_dim: u32,
    pub eps: f32,
}

/// Per-head RMSNorm in place: in each of the `n_rows` rows of `x` ([n_rows, row_stride] f32),
/// heads `first + h * head_dim ..+ head_dim` for h < n_heads become
/// `head / sqrt(mean(head²) + eps) * weight` (weight: [head_dim] f32, shared by the heads).
/// Sizes at least 1, the heads inside the row, `eps` finite and >= 0.
pub fn head_norm(ctx: &Context, x: &wgpu::Buffer, weight: &wgpu::Buffer, shape: &HeadNormShape) -> Result<Kernel, GpuError> {
    const OP: &str = "head_norm";
    let HeadNormShape { n_rows, row_stride, first, n_heads, head_dim, eps } = *shape;
    if [n_rows, n_heads, head_dim].contains(&0) {
        return Err(shape_err(OP, format!("n_rows ({n_rows}), n_heads ({n_heads}) and head_dim ({head_dim}) must be at least 1")));
    }
    if first as u64 + n_heads as u64 * head_dim as u64 > row_stride as u64 {
        return Err(shape_err(OP, format!("{n_heads} heads of {head_dim} from column {first} do not fit in a row of {row_stride}")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
    }
    check_size(OP, "x", x, n_rows as u64 * row_stride as u64 * 4)?;
    check_size(OP, "weight", weight, head_dim as u64 * 4)?;
    check_binding(ctx, OP, "x", x.size())?;
    check_binding(ctx, OP, "weight", weight.size())?;
    let params = HeadNormParams { n_rows, row_stride, first, n_heads, head_dim, eps, _pad: [0; 2] };
    let params = ctx.params_init("head_norm.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("head_norm", "main", &[("WG", RMS_NORM_WG as f64)])?;
    let items = n_rows as u64 * n_heads as u64;
    let kernel = Kernel::new(ctx, OP, pipeline, &[whole(x), whole(weight), whole(&params)], grid(ctx, items, RMS_NORM_WG), None);
    Ok(kernel.owning(params))
}

#[cfg(feature = "testing")]
/// CPU reference of [`head_norm`] (through [`rms_norm_cpu`]), in place.
pub fn head_norm_cpu(x: &mut [f32], weight: &[f32], shape: &HeadNormShape) {
    let (stride, first, hd) = (shape.row_stride as usize, shape.first as usize, shape.head_dim as usize);
    for r in 0..shape.n_rows as usize {
        let heads = &mut x[r * stride + first..][..shape.n_heads as usize * hd];
        let normed = rms_norm_cpu(heads, weight, shape.n_heads as usize, hd, shape.eps);
        heads.copy_from_slice(&normed);
    }
}

#[cfg(feature = "testing")]
/// CPU reference of [`rms_norm`], accumulated in f64.
/// x: [n_rows, dim], weight: [dim]; returns [n_rows, dim].
pub fn rms_norm_cpu(x: &[f32], weight: &[f32], n_rows: usize, dim: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; n_rows * dim];
    for r in 0..n_rows {
        let row = &x[r * dim..(r + 1) * dim];
        let mean_square = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let scale = 1.0 / (mean_square + eps as f64).sqrt();
        for c in 0..dim {
            out[r * dim + c] = (row[c] as f64 * scale * weight[c] as f64) as f32;
        }
    }
    out
}
