//! The contiguous KV cache: the measured baseline every later layout is compared with.
//!
//! Layout per layer: `k, v: [n_kv_heads, max_len, head_dim] f32`, head-major, so attention streams
//! one head's keys from consecutive memory. Allocated once for the maximum length; a token's K/V
//! are written in place at its position, never concatenated or copied per step.

use crate::gpu::Context;
use crate::model::{ModelConfig, ModelError};

pub struct ContiguousKv {
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    pub max_len: u32,
    /// Tokens whose K/V are in the cache (positions 0..len).
    pub len: u32,
    bytes_per_token: u64,
}

impl ContiguousKv {
    pub fn new(ctx: &Context, cfg: &ModelConfig, max_len: u32) -> Result<ContiguousKv, ModelError> {
        let per_layer = cfg.n_kv_heads as u64 * max_len as u64 * cfg.head_dim as u64 * 4;
        let limit = (ctx.limits.max_storage_buffer_binding_size as u64).min(ctx.limits.max_buffer_size);
        if per_layer > limit {
            return Err(ModelError::ContextOverflow {
                needed: max_len as usize,
                limit: (limit / (cfg.n_kv_heads as u64 * cfg.head_dim as u64 * 4)) as usize,
            });
        }
        let k = (0..cfg.n_layers).map(|l| ctx.storage_zeroed(&format!("k_cache.{l}"), per_layer)).collect();
        let v = (0..cfg.n_layers).map(|l| ctx.storage_zeroed(&format!("v_cache.{l}"), per_layer)).collect();
        Ok(ContiguousKv { k, v, max_len, len: 0, bytes_per_token: cfg.kv_bytes_per_token(4) })
    }

    /// Bytes reserved (the whole maximum length, whatever is in use).
    pub fn bytes_reserved(&self) -> u64 {
        self.bytes_per_token * self.max_len as u64
    }

    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }
}
