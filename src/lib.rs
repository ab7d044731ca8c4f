//! pagedlm: a small decoder-only LLM runtime on WebGPU (natively on Vulkan), built around a
//! paged, prefix-sharing KV cache.

pub mod gguf;
pub mod gpu;
pub mod quant;
pub mod rng;
pub mod tokenizer;
