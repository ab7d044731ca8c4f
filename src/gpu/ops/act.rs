//! The FFN's gated activation (SwiGLU for llama, GeGLU with tanh GELU for Gemma) on the fused
//! gate/up projection.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::model::Activation;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GluParams {
    n_rows: u32,
    ffn: u32,
}

const GLU_WG: u64 = 64;
/// Consecutive columns per invocation.
const GLU_PER: u64 = 4;

/// `out = act(gate) * up` ([`Activation`]), finite for any finite gate.
/// gu: [n_rows, 2 * ffn] f32, each row `ffn` gate values then `ffn` up values (the fused
/// gate/up matmul's output); out: [n_rows, ffn] f32. `n_rows` and `ffn` must be at least 1.
pub fn glu(ctx: &Context, (gu, out): (&wgpu::Buffer, &wgpu::Buffer), n_rows: u32, ffn: u32, act: Activation) -> Result<Kernel, GpuError> {
    const OP: &str = "glu";
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
    let params = ctx.params_init("glu.params", bytemuck::bytes_of(&GluParams { n_rows, ffn }));
    let gelu = if act == Activation::GeluTanh { 1.0 } else { 0.0 };
    let pipeline = ctx.pipeline("glu", "main", &[("WG", GLU_WG as f64), ("PER", GLU_PER as f64), ("GELU", gelu)])?;
    let items = n_rows as u64 * (ffn as u64).div_ceil(GLU_PER);
    let kernel = Kernel::new(ctx, OP, pipeline, &[whole(gu), whole(out), whole(&params)], grid(ctx, items, GLU_WG), None);
    Ok(kernel.owning(params))
}

#[cfg(feature = "testing")]
/// CPU reference of [`glu`] in f64. gu: [n_rows, 2 * ffn]; returns [n_rows, ffn].
pub fn glu_cpu(gu: &[f32], n_rows: usize, ffn: usize, act: Activation) -> Vec<f32> {
    let mut out = vec![0.0f32; n_rows * ffn];
    for r in 0..n_rows {
        for j in 0..ffn {
            let g = gu[r * 2 * ffn + j] as f64;
            let up = gu[r * 2 * ffn + ffn + j] as f64;
            out[r * ffn + j] = (act.apply(g) * up) as f32;
        }
    }
    out
}
