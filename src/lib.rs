//! pagedlm: a small decoder-only LLM runtime on WebGPU (natively on Vulkan) or the CPU, built
//! around a paged, prefix-sharing KV cache.

// wgpu's handles are `Send + Sync` natively and not in the browser, which has one thread: the
// same `Arc`s serve both.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod backend;
pub mod constraint;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod gpu;
pub mod kv;
pub mod model;
pub mod profile;
pub mod quant;
pub mod reasoning;
pub mod request;
pub mod rng;
pub mod sampler;
pub mod sched;
pub mod speculate;
#[cfg(feature = "testing")]
pub mod synth;
pub mod time;
pub mod tokenizer;
pub mod tools;
#[cfg(target_arch = "wasm32")]
pub mod web;
pub mod webgpu;
