//! The GPU layer: one [`Context`] owning adapter, device, queue and the pipeline
//! cache, buffer helpers, readback, and typed kernel launchers in [`ops`].
//!
//! Every kernel is a WGSL file under `shaders/`, loaded through [`shaders::source`].
//! A launcher checks its shape contract, then builds a [`Kernel`]: a pipeline, a bind
//! group and a workgroup count, recorded into a compute pass by the caller. Building
//! work is separate from submitting it, so a whole forward step is one submission. What the
//! layer creates, submits and reads back is counted, and steps can be timed per dispatch with
//! GPU timestamps ([`Context::counters`], [`Context::begin_capture`]).

mod context;
mod kernel;
pub mod ops;
pub mod shaders;
mod shared;
mod timing;

pub use context::{AdapterClass, Context, ContextOptions, DeviceLimits, Mapping, PHONE_MAX_BUFFER};
pub use kernel::{Kernel, Recorder};
pub use timing::{Captured, Counters, KernelTime, TimingMethod};

/// Errors of the GPU layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no WebGPU/Vulkan adapter found: {0}")]
    NoAdapter(String),
    #[error("the GPU device could not be created: {0}")]
    Device(String),
    #[error("the adapter lacks a limit pagedlm needs: {0}")]
    Limits(String),
    #[error("shape contract violated in {op}: {message}")]
    Shape { op: &'static str, message: String },
    #[error("unknown shader {0}")]
    UnknownShader(String),
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    #[error("GPU timestamps: {0}")]
    Timestamps(String),
    /// An allocation the device refused, or one past the engine's memory cap.
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// An error the device reported for work already submitted (validation, internal).
    #[error("the GPU reported an error: {0}")]
    Reported(String),
}

/// A shape-contract failure, for launchers.
pub(crate) fn shape_err(op: &'static str, message: impl Into<String>) -> GpuError {
    GpuError::Shape { op, message: message.into() }
}
