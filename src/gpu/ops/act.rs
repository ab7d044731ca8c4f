//! The FFN's SwiGLU activation on the fused gate/up projection.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SiluMulParams {
    n_rows: u32,
    ffn: u32,
}

const SILU_MUL_WG: u64 = 64;
/// Consecutive columns per invocation.
const SILU_MUL_PER: u64 = 4;

/// `out = silu(gate) * up`, silu(g) = g / (1 + exp(-g)), finite for any finite g.
/// gu: [n_rows, 2 * ffn] f32, each row `ffn` gate values then `ffn` up values (the fused
/// gate/up matmul's output); out: [n_rows, ffn] f32. `n_rows` and `ffn` must be at least 1.
pub fn silu_mul(
    ctx: &Context,
    gu: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n_rows: u32,
    ffn: u32,
) -> Result<Kernel, GpuError> {
    const OP: &str = "silu_mul";
    if n_rows == 0 || ffn == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and ffn ({ffn}) must be at least 1")));
    }
    if gu == out {
        return Err(shape_err(OP, "out must be a different buffer from gu"));
    }
    let out_elems = n_rows as u64 * ffn as u64;
    check_size(OP, "gu", gu, out_elems * 2 * 4)?;
    check_size(OP, "out", out, out_elems * 4)?;
    check_binding(ctx, OP, "gu", gu.size())?;
    check_binding(ctx, OP, "out", out.size())?;
    let params = ctx.uniform_init("silu_mul.params", bytemuck::bytes_of(&SiluMulParams { n_rows, ffn }));
    let pipeline = ctx.pipeline("silu_mul", "main", &[("WG", SILU_MUL_WG as f64), ("PER", SILU_MUL_PER as f64)])?;
    let items = n_rows as u64 * (ffn as u64).div_ceil(SILU_MUL_PER);
    let kernel =
        Kernel::new(ctx, OP, pipeline, &[whole(gu), whole(out), whole(&params)], grid(ctx, items, SILU_MUL_WG), None);
    Ok(kernel.owning(params))
}

#[cfg(feature = "testing")]
/// CPU reference of [`silu_mul`] in f64. gu: [n_rows, 2 * ffn]; returns [n_rows, ffn].
pub fn silu_mul_cpu(gu: &[f32], n_rows: usize, ffn: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n_rows * ffn];
    for r in 0..n_rows {
        for j in 0..ffn {
            let g = gu[r * 2 * ffn + j] as f64;
            let up = gu[r * 2 * ffn + ffn + j] as f64;
            out[r * ffn + j] = (g / (1.0 + (-g).exp()) * up) as f32;
        }
    }
    out
}
