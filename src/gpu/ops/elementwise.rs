//! Element-wise kernels: residual add.

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
