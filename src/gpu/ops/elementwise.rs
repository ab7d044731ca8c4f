//! Element-wise kernels: residual add, a row vector added to every row (biases), soft-capping.

use super::{check_size, grid, whole};
use crate::gpu::{Context, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AddParams {
    n: u32,
}

const ADD_WG: u64 = 64;

/// Residual add `x += y`.
/// x: [n] f32 (updated in place), y: [n] f32.
pub fn add(ctx: &Context, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) -> Result<Kernel, GpuError> {
    check_size("add", "x", x, n as u64 * 4)?;
    check_size("add", "y", y, n as u64 * 4)?;
    let params = ctx.params_init("add.params", bytemuck::bytes_of(&AddParams { n }));
    let pipeline = ctx.pipeline("add", "main", &[("WG", ADD_WG as f64)])?;
    let kernel = Kernel::new(ctx, "add", pipeline, &[whole(x), whole(y), whole(&params)], grid(ctx, n as u64, ADD_WG), None);
    Ok(kernel.owning(params))
}

/// `x[r] += b` for every row r of x: x: [n / width, width] f32 (updated in place), b: [width] f32.
pub fn add_rows(ctx: &Context, x: &wgpu::Buffer, b: &wgpu::Buffer, n: u32, width: u32) -> Result<Kernel, GpuError> {
    if width == 0 || n % width != 0 {
        return Err(crate::gpu::shape_err("add_rows", format!("{n} values are not whole rows of {width}")));
    }
    check_size("add_rows", "x", x, n as u64 * 4)?;
    check_size("add_rows", "b", b, width as u64 * 4)?;
    let params = ctx.params_init("add_rows.params", bytemuck::bytes_of(&AddParams { n }));
    let pipeline = ctx.pipeline("add", "main", &[("WG", ADD_WG as f64), ("WIDTH", width as f64)])?;
    let kernel = Kernel::new(ctx, "add_rows", pipeline, &[whole(x), whole(b), whole(&params)], grid(ctx, n as u64, ADD_WG), None);
    Ok(kernel.owning(params))
}

/// Soft-capping in place: `x[i] = cap · tanh(x[i] / cap)`, x: [n] f32, cap finite and > 0.
pub fn softcap(ctx: &Context, x: &wgpu::Buffer, n: u32, cap: f32) -> Result<Kernel, GpuError> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(crate::gpu::shape_err("softcap", format!("the cap must be finite and > 0, got {cap}")));
    }
    check_size("softcap", "x", x, n as u64 * 4)?;
    let params = ctx.params_init("softcap.params", bytemuck::bytes_of(&AddParams { n }));
    let pipeline = ctx.pipeline("softcap", "main", &[("WG", ADD_WG as f64), ("CAP", cap as f64)])?;
    let kernel = Kernel::new(ctx, "softcap", pipeline, &[whole(x), whole(&params)], grid(ctx, n as u64, ADD_WG), None);
    Ok(kernel.owning(params))
}
