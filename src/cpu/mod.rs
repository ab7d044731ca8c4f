//! The CPU backend: the model's layer plan executed by CPU kernels over a KV cache in CPU memory
//! (`KvCache::new_host`: the same blocks, block tables, prefix tree, windows, INT8 format and
//! snapshots as the WebGPU backend's), for browsers and machines without a usable GPU.
//!
//! [`weights`] copies the tensors out of the file (kept in their formats), [`forward`] runs a
//! step's rows through the layers with the [`kernels`] (their per-type dot products in [`qdot`]),
//! and [`runner`] is the backend the engine drives ([`CpuBackend`]).

pub mod forward;
pub mod kernels;
pub mod qdot;
pub mod runner;
pub mod weights;

pub use forward::{forward, HostRow};
pub use runner::CpuBackend;
pub use weights::HostModel;
