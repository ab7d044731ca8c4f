//! Quantized number formats, in one place so that kernels, the model and the KV cache import
//! them from below:
//! - [`ggml`]: the GGML weight formats pagedlm reads from GGUF files (F32, F16, BF16, Q4_0 ..
//!   Q8_0, Q2_K .. Q6_K), with CPU dequantizers exact to ggml's and quantizers;
//! - [`types`]: one row per weight type pagedlm computes with ([`WEIGHT_TYPES`]): codec, GPU
//!   layout, CPU unpacking, llama.cpp's file type and quantizer fallback;
//! - [`kv_int8`]: the INT8 KV-cache format (8-bit codes with one f32 scale per token and KV
//!   head), its pool layout and CPU reference.

pub mod ggml;
pub mod kv_int8;
pub mod types;

pub use ggml::*;
pub use types::*;

/// The stored precision of K and V in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    F32,
    /// 8-bit integers with per-group scales, dequantized inside attention.
    Int8,
}

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Int8 => "int8",
        }
    }
}
