//! Typed kernel launchers. Each checks its shape contract against the buffers it is given,
//! then returns a [`Kernel`] to record. One file per family of kernels.

use super::kernel::split_workgroups;
use super::{shape_err, Context, GpuError};

pub mod act;
pub mod argmax;
pub mod attention;
pub mod elementwise;
pub mod embed;
pub mod kv_write;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod qkv_heads;
pub mod rope;
pub mod sample;

/// Checks that `buffer` holds at least `bytes` bytes.
pub(crate) fn check_size(op: &'static str, what: &str, buffer: &wgpu::Buffer, bytes: u64) -> Result<(), GpuError> {
    if buffer.size() < bytes {
        return Err(shape_err(op, format!("{what} needs {bytes} bytes, the buffer has {}", buffer.size())));
    }
    Ok(())
}

/// Checks a binding against the device's maxStorageBufferBindingSize.
pub(crate) fn check_binding(ctx: &Context, op: &'static str, what: &str, bytes: u64) -> Result<(), GpuError> {
    let max = ctx.limits.max_storage_buffer_binding_size;
    if bytes > max {
        return Err(shape_err(op, format!("{what} is {bytes} bytes, over the device's {max}-byte binding limit")));
    }
    Ok(())
}

/// Workgroups for `n` items handled `per_wg` at a time, split over x/y when needed.
pub(crate) fn grid(ctx: &Context, n: u64, per_wg: u64) -> [u32; 3] {
    split_workgroups(ctx, n.div_ceil(per_wg) as u32)
}

pub(crate) fn whole(buffer: &wgpu::Buffer) -> wgpu::BindingResource<'_> {
    buffer.as_entire_binding()
}
