//! The paged KV pool: fixed-size blocks of `block_size` token slots in GPU buffers, allocated
//! once at start, handed out through a free list with reference counts.
//!
//! ## Physical layout
//! Per layer one K buffer and one V buffer (so the pool is split over 2 × layers buffers and no
//! single binding grows with the layer count), each `[block][kv_head][slot][head_dim]` f32:
//! element (b, h, s, d) at `((b · n_kv_heads + h) · block_size + s) · head_dim + d`.
//!
//! Why: decode attention reads, for one KV head, every key of a sequence in order. Within a
//! block those keys are one contiguous run of `block_size · head_dim` floats, so a workgroup
//! serving a GQA group streams whole runs and reads each block once for all its query heads;
//! the block table is consulted once per block, not per key. A block holds all heads of its
//! tokens, so a block is the unit of allocation, sharing and copy-on-write.
//!
//! The contiguous baseline is the same layout with one block of the sequence's maximum length
//! per sequence (`block_size = max_len`), which is exactly `[kv_head][pos][head_dim]` per
//! sequence: the kernels are shared, only the allocation policy differs.

use crate::gpu::Context;
use crate::model::ModelConfig;

use super::alloc::BlockAllocator;
use super::{KvDtype, KvError};

/// Snapshot of the pool's occupancy.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PoolStats {
    pub kv_dtype: &'static str,
    pub block_size: u32,
    pub blocks_total: u32,
    pub blocks_used: u32,
    pub blocks_free: u32,
    /// Blocks held only by the prefix cache (evictable).
    pub blocks_cached: u32,
    /// GPU bytes of the whole pool (K and V, all layers).
    pub bytes_total: u64,
    pub bytes_per_token: f64,
    /// Tokens whose K/V live sequences hold.
    pub live_tokens: u64,
    /// Allocated token slots minus live tokens (slots reserved but not yet written).
    pub internal_fragmentation: u64,
}

pub struct KvPool {
    pub dtype: KvDtype,
    pub block_size: u32,
    pub n_blocks: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// Per layer `[n_blocks][n_kv_heads][block_size][head_dim]` f32.
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    pub alloc: BlockAllocator,
    /// Bytes of one block in one layer's K (or V) buffer.
    block_bytes: u64,
    n_layers: u32,
    /// One block's worth of staging for copy-on-write: WebGPU forbids a copy within one buffer.
    scratch: wgpu::Buffer,
}

impl KvPool {
    /// Bytes one block occupies in one layer's K buffer.
    pub fn block_bytes_per_layer(cfg: &ModelConfig, block_size: u32) -> u64 {
        cfg.n_kv_heads as u64 * block_size as u64 * cfg.head_dim as u64 * 4
    }

    /// The most blocks one layer's buffer can hold on this device.
    pub fn max_blocks(ctx: &Context, cfg: &ModelConfig, block_size: u32) -> u64 {
        let limit = (ctx.limits.max_storage_buffer_binding_size as u64).min(ctx.limits.max_buffer_size);
        limit / Self::block_bytes_per_layer(cfg, block_size).max(1)
    }

    pub fn new(ctx: &Context, cfg: &ModelConfig, dtype: KvDtype, block_size: u32, n_blocks: u32) -> Result<KvPool, KvError> {
        if dtype != KvDtype::F32 {
            return Err(KvError::NotAvailable("the INT8 KV cache (--kv-dtype int8)".into()));
        }
        if block_size == 0 || n_blocks == 0 {
            return Err(KvError::Config(format!("block size ({block_size}) and block count ({n_blocks}) must be at least 1")));
        }
        let max = Self::max_blocks(ctx, cfg, block_size);
        if n_blocks as u64 > max {
            return Err(KvError::Config(format!(
                "{n_blocks} blocks of {block_size} tokens need {} bytes per layer buffer, over the device's {}-byte \
                 binding limit: at most {} tokens fit",
                n_blocks as u64 * Self::block_bytes_per_layer(cfg, block_size),
                ctx.limits.max_storage_buffer_binding_size,
                max * block_size as u64
            )));
        }
        let block_bytes = Self::block_bytes_per_layer(cfg, block_size);
        let size = block_bytes * n_blocks as u64;
        let k = (0..cfg.n_layers).map(|l| ctx.storage_zeroed(&format!("kv.k.{l}"), size)).collect();
        let v = (0..cfg.n_layers).map(|l| ctx.storage_zeroed(&format!("kv.v.{l}"), size)).collect();
        Ok(KvPool {
            dtype,
            block_size,
            n_blocks,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            k,
            v,
            alloc: BlockAllocator::new(n_blocks),
            block_bytes,
            n_layers: cfg.n_layers,
            scratch: ctx.storage_zeroed("kv.cow_scratch", block_bytes),
        })
    }

    /// Bytes of K and V for one token over all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.n_layers as u64 * self.n_kv_heads as u64 * self.head_dim as u64 * 2 * 4
    }

    pub fn bytes_total(&self) -> u64 {
        self.block_bytes * self.n_blocks as u64 * 2 * self.n_layers as u64
    }

    /// Records GPU copies of block `src` into block `dst` in every layer's K and V buffer
    /// (copy-on-write of a partly filled block).
    pub fn copy_block(&self, encoder: &mut wgpu::CommandEncoder, src: u32, dst: u32) {
        let (s, d) = (src as u64 * self.block_bytes, dst as u64 * self.block_bytes);
        for buffers in [&self.k, &self.v] {
            for b in buffers {
                encoder.copy_buffer_to_buffer(b, s, &self.scratch, 0, self.block_bytes);
                encoder.copy_buffer_to_buffer(&self.scratch, 0, b, d, self.block_bytes);
            }
        }
    }
}
