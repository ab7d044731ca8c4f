//! RMSNorm: llama's normalisation before attention, before the FFN and before the output (and
//! Gemma 3's after attention and after the FFN), and per head of q and k (Gemma 3's QK norm).

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};

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

/// `out = x / sqrt(mean(x²) + eps) * weight`, per row.
/// x: [n_rows, dim] f32, weight: [dim] f32, out: [n_rows, dim] f32 (may not alias x).
/// `n_rows` and `dim` must be at least 1, `eps` finite and >= 0.
pub fn rms_norm(
    ctx: &Context,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n_rows: u32,
    dim: u32,
    eps: f32,
) -> Result<Kernel, GpuError> {
    const OP: &str = "rms_norm";
    if n_rows == 0 || dim == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and dim ({dim}) must be at least 1")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
    }
    if x == out {
        return Err(shape_err(OP, "out must be a different buffer from x"));
    }
    let elems = n_rows as u64 * dim as u64;
    check_size(OP, "x", x, elems * 4)?;
    check_size(OP, "weight", weight, dim as u64 * 4)?;
    check_size(OP, "out", out, elems * 4)?;
    for (what, buffer) in [("x", x), ("weight", weight), ("out", out)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = RmsNormParams { n_rows, dim, eps, _pad: 0 };
    let params = ctx.uniform_init("rms_norm.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("rms_norm", "main", &[("WG", RMS_NORM_WG as f64)])?;
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[whole(x), whole(weight), whole(out), whole(&params)],
        grid(ctx, n_rows as u64, RMS_NORM_WG),
        None,
    );
    Ok(kernel.owning(params))
}

/// `x += rms_norm(delta) · post`, then, with `next = Some((weight, out))`,
/// `out = rms_norm(x) · weight`: a post-normed residual add and the next pre-norm in one
/// dispatch (Gemma 3), the same arithmetic as [`rms_norm`] and an add in their order.
/// x, delta, out: [n_rows, dim] f32, three different buffers; post, weight: [dim] f32.
/// `n_rows` and `dim` must be at least 1, `eps` finite and >= 0.
pub fn residual_norm(
    ctx: &Context,
    (x, delta): (&wgpu::Buffer, &wgpu::Buffer),
    post: &wgpu::Buffer,
    next: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    (n_rows, dim, eps): (u32, u32, f32),
) -> Result<Kernel, GpuError> {
    const OP: &str = "residual_norm";
    if n_rows == 0 || dim == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and dim ({dim}) must be at least 1")));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
    }
    // Without a next norm its bindings still need buffers: post stands in for the weight and a
    // word of scratch (kept alive by the bind group) for out.
    let scratch;
    let (weight, out) = match next {
        Some(next) => next,
        None => {
            scratch = ctx.storage_zeroed("residual_norm.unused", 4);
            (post, &scratch)
        }
    };
    if x == delta || x == out || delta == out {
        return Err(shape_err(OP, "x, delta and out must be three different buffers"));
    }
    let elems = n_rows as u64 * dim as u64;
    check_size(OP, "x", x, elems * 4)?;
    check_size(OP, "delta", delta, elems * 4)?;
    check_size(OP, "post", post, dim as u64 * 4)?;
    if next.is_some() {
        check_size(OP, "weight", weight, dim as u64 * 4)?;
        check_size(OP, "out", out, elems * 4)?;
    }
    for (what, buffer) in [("x", x), ("delta", delta), ("post", post), ("weight", weight), ("out", out)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = RmsNormParams { n_rows, dim, eps, _pad: 0 };
    let params = ctx.uniform_init("residual_norm.params", bytemuck::bytes_of(&params));
    let norm = if next.is_some() { 1.0 } else { 0.0 };
    let pipeline = ctx.pipeline("residual_norm", "main", &[("WG", RMS_NORM_WG as f64), ("NORM", norm)])?;
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[whole(x), whole(delta), whole(post), whole(weight), whole(out), whole(&params)],
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
