//! The paged KV pool: fixed-size blocks of `block_size` token slots in GPU buffers (or, for the
//! CPU backend, in CPU memory: [`HostPool`]), allocated once at start, handed out through a free
//! list with reference counts.
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
//!
//! With [`KvDtype::Int8`] each buffer holds the same order in 8-bit codes, four per u32, then
//! one f32 scale per (block, kv_head, slot) after the whole code region (see [`crate::quant::kv_int8`]):
//! `head_dim + 4` bytes per token and head instead of `4 · head_dim`.

use std::sync::{Mutex, MutexGuard};

use crate::gpu::Context;

use super::alloc::BlockAllocator;
use super::{KvDtype, KvError, KvShape};
use crate::quant::kv_int8::Int8Layout;

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
    /// GPU bytes of the whole cache (K and V, all layers, both block groups).
    pub bytes_total: u64,
    /// K/V bytes of one token over all layers (before window-aware freeing).
    pub bytes_per_token: f64,
    /// Tokens whose K/V live sequences hold.
    pub live_tokens: u64,
    /// Allocated token slots minus live tokens (slots reserved but not yet written).
    pub internal_fragmentation: u64,
    /// K/V bytes of every held block (sequences and prefix cache), both block groups.
    pub bytes_held: u64,
    /// The local (sliding-window) layers' block group; `None` without windowed layers. The
    /// fields above other than the byte figures describe the global group.
    pub local: Option<GroupStats>,
}

/// Occupancy of one block group.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GroupStats {
    pub blocks_total: u32,
    pub blocks_used: u32,
    pub blocks_free: u32,
    /// Blocks held only by the prefix cache.
    pub blocks_cached: u32,
    pub bytes_total: u64,
}

/// A pool in CPU memory (the CPU backend, `src/cpu/`): per layer a K and a V buffer of
/// 32-bit words in exactly the byte layout of the GPU pool's buffers (f32 values as their bits,
/// INT8 codes and scales as [`Int8Layout`] places them), so a snapshot is the same bytes on
/// either backend. Each buffer sits behind its own lock: a step writes a layer's K/V through a
/// shared borrow of the cache, as the GPU's steps write its buffers.
pub struct HostPool {
    pub k: Vec<Mutex<Vec<u32>>>,
    pub v: Vec<Mutex<Vec<u32>>>,
}

impl HostPool {
    /// Layer `l`'s K and V buffers, locked (a poisoned lock still holds valid words).
    pub fn lock(&self, l: usize) -> (MutexGuard<'_, Vec<u32>>, MutexGuard<'_, Vec<u32>>) {
        (lock(&self.k[l]), lock(&self.v[l]))
    }
}

fn lock(m: &Mutex<Vec<u32>>) -> MutexGuard<'_, Vec<u32>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The blocks of one group. Exactly one of the GPU buffers (`k`, `v`) and [`HostPool`] holds
/// them: the GPU's for the WebGPU backend, `host` for the CPU backend (`k` and `v` empty).
pub struct KvPool {
    pub dtype: KvDtype,
    pub block_size: u32,
    pub n_blocks: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// Per layer: f32, `[n_blocks][n_kv_heads][block_size][head_dim]`; INT8, the codes and
    /// scales of [`Int8Layout`].
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    /// The CPU backend's buffers, `None` on a GPU.
    pub host: Option<HostPool>,
    pub alloc: BlockAllocator,
    /// Bytes of one block in one layer's K (or V) buffer (codes and scales for INT8).
    block_bytes: u64,
    n_layers: u32,
    /// One block's worth of staging for copy-on-write: WebGPU forbids a copy within one buffer.
    scratch: Option<wgpu::Buffer>,
}

impl KvPool {
    /// Bytes one block occupies in one layer's K buffer: f32 `4 · head_dim` per token and KV
    /// head, INT8 `head_dim` codes and a 4-byte scale.
    pub fn block_bytes_per_layer(shape: &KvShape, dtype: KvDtype, block_size: u32) -> u64 {
        shape.n_kv_heads as u64 * block_size as u64 * Self::bytes_per_head(dtype, shape.head_dim)
    }

    /// Bytes of one token's key (or value) of one KV head.
    fn bytes_per_head(dtype: KvDtype, head_dim: u32) -> u64 {
        match dtype {
            KvDtype::F32 => head_dim as u64 * 4,
            KvDtype::Int8 => head_dim as u64 + 4,
        }
    }

    /// Bytes of one layer's K (or V) buffer, INT8 padding included.
    pub fn layer_buffer_bytes(shape: &KvShape, dtype: KvDtype, block_size: u32, n_blocks: u32) -> u64 {
        match dtype {
            KvDtype::F32 => n_blocks as u64 * Self::block_bytes_per_layer(shape, dtype, block_size),
            // The layout's own figure; a shape it refuses is refused by `new` with the reason.
            KvDtype::Int8 => Int8Layout { n_blocks, n_kv_heads: shape.n_kv_heads, block_size, head_dim: shape.head_dim }.buffer_bytes(),
        }
    }

    /// The most f32 blocks one layer's buffer can hold on this device (see [`KvPool::max_blocks_for`]).
    pub fn max_blocks(ctx: &Context, shape: &KvShape, block_size: u32) -> u64 {
        Self::max_blocks_for(ctx, shape, KvDtype::F32, block_size)
    }

    /// The most blocks of `dtype` one layer's buffer can hold on this device: about 3.8× more
    /// INT8 blocks than f32 ones for head_dim 64.
    pub fn max_blocks_for(ctx: &Context, shape: &KvShape, dtype: KvDtype, block_size: u32) -> u64 {
        let limit = ctx.limits.max_storage_buffer_binding_size.min(ctx.limits.max_buffer_size);
        let mut blocks = limit / Self::block_bytes_per_layer(shape, dtype, block_size).max(1);
        // INT8 pads its buffer to 16 bytes: at most one block fewer.
        let fits = |b: u64| b <= u32::MAX as u64 && Self::layer_buffer_bytes(shape, dtype, block_size, b as u32) <= limit;
        while blocks > 0 && !fits(blocks) {
            blocks -= 1;
        }
        blocks
    }

    /// Refuses an empty pool, and an INT8 shape the format cannot hold.
    fn check_shape(shape: &KvShape, dtype: KvDtype, block_size: u32, n_blocks: u32) -> Result<(), KvError> {
        if block_size == 0 || n_blocks == 0 {
            return Err(KvError::Config(format!("block size ({block_size}) and block count ({n_blocks}) must be at least 1")));
        }
        if dtype == KvDtype::Int8 {
            Int8Layout::new(n_blocks, shape.n_kv_heads, block_size, shape.head_dim)?;
        }
        Ok(())
    }

    /// A pool in CPU memory for the CPU backend ([`HostPool`]), zeroed. Its words are indexed
    /// as u32 as on a GPU, so a layer buffer holds at most 2³² words.
    pub fn new_host(shape: &KvShape, dtype: KvDtype, block_size: u32, n_blocks: u32) -> Result<KvPool, KvError> {
        Self::check_shape(shape, dtype, block_size, n_blocks)?;
        let size = Self::layer_buffer_bytes(shape, dtype, block_size, n_blocks);
        if size / 4 > u32::MAX as u64 {
            return Err(KvError::Config(format!("{n_blocks} blocks of {block_size} tokens need {size} bytes per layer buffer, past 2^32 words")));
        }
        let words = (size / 4) as usize;
        let buffers = || (0..shape.n_layers).map(|_| Mutex::new(vec![0u32; words])).collect();
        Ok(KvPool {
            dtype,
            block_size,
            n_blocks,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            k: Vec::new(),
            v: Vec::new(),
            host: Some(HostPool { k: buffers(), v: buffers() }),
            alloc: BlockAllocator::new(n_blocks),
            block_bytes: Self::block_bytes_per_layer(shape, dtype, block_size),
            n_layers: shape.n_layers,
            scratch: None,
        })
    }

    pub fn new(ctx: &Context, shape: &KvShape, dtype: KvDtype, block_size: u32, n_blocks: u32) -> Result<KvPool, KvError> {
        Self::check_shape(shape, dtype, block_size, n_blocks)?;
        let max = Self::max_blocks_for(ctx, shape, dtype, block_size);
        if n_blocks as u64 > max {
            return Err(KvError::Config(format!(
                "{n_blocks} blocks of {block_size} tokens need {} bytes per layer buffer ({}), over the device's \
                 {}-byte binding limit: at most {} tokens fit",
                Self::layer_buffer_bytes(shape, dtype, block_size, n_blocks),
                dtype.name(),
                ctx.limits.max_storage_buffer_binding_size,
                max * block_size as u64
            )));
        }
        let block_bytes = Self::block_bytes_per_layer(shape, dtype, block_size);
        let size = Self::layer_buffer_bytes(shape, dtype, block_size, n_blocks);
        let k = (0..shape.n_layers).map(|l| ctx.storage_zeroed(&format!("kv.k.{l}"), size)).collect();
        let v = (0..shape.n_layers).map(|l| ctx.storage_zeroed(&format!("kv.v.{l}"), size)).collect();
        Ok(KvPool {
            dtype,
            block_size,
            n_blocks,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            k,
            v,
            host: None,
            alloc: BlockAllocator::new(n_blocks),
            block_bytes,
            n_layers: shape.n_layers,
            scratch: Some(ctx.storage_zeroed("kv.cow_scratch", block_bytes)),
        })
    }

    /// The INT8 layout of each layer's buffers; None for an f32 pool.
    pub fn int8_layout(&self) -> Option<Int8Layout> {
        (self.dtype == KvDtype::Int8).then_some(Int8Layout {
            n_blocks: self.n_blocks,
            n_kv_heads: self.n_kv_heads,
            block_size: self.block_size,
            head_dim: self.head_dim,
        })
    }

    /// Bytes of K and V for one token over all layers (f32: 46,080 for SmolLM2, INT8: 12,240).
    pub fn bytes_per_token(&self) -> u64 {
        self.n_layers as u64 * self.n_kv_heads as u64 * Self::bytes_per_head(self.dtype, self.head_dim) * 2
    }

    /// Bytes of one block's K and V over the pool's layers.
    pub fn bytes_per_block(&self) -> u64 {
        self.block_bytes * 2 * self.n_layers as u64
    }

    /// Bytes of the whole pool (K and V, all layers, INT8 padding included), on the GPU or in
    /// CPU memory.
    pub fn bytes_total(&self) -> u64 {
        match &self.host {
            Some(host) => host.k.iter().chain(&host.v).map(|b| lock(b).len() as u64 * 4).sum(),
            None => self.k.iter().chain(&self.v).map(|b| b.size()).sum(),
        }
    }

    /// (source, destination, bytes) of the regions copy-on-write copies from `src` to `dst`.
    fn block_copies(&self, src: u32, dst: u32) -> Vec<(u64, u64, u64)> {
        match self.int8_layout() {
            None => vec![(src as u64 * self.block_bytes, dst as u64 * self.block_bytes, self.block_bytes)],
            Some(layout) => layout.block_ranges(src).iter().zip(layout.block_ranges(dst)).map(|(s, d)| (s.0, d.0, s.1)).collect(),
        }
    }

    /// Copies block `src` into block `dst` in every layer's K and V buffer of a [`HostPool`]
    /// (what [`KvPool::copy_block`] records for a GPU pool); nothing for a GPU pool.
    pub fn copy_block_host(&self, src: u32, dst: u32) {
        let Some(host) = &self.host else { return };
        let copies = self.block_copies(src, dst);
        for l in 0..host.k.len() {
            let (mut k, mut v) = host.lock(l);
            for words in [&mut *k, &mut *v] {
                for &(s, d, size) in &copies {
                    let (s, d, n) = ((s / 4) as usize, (d / 4) as usize, (size / 4) as usize);
                    words.copy_within(s..s + n, d);
                }
            }
        }
    }

    /// Records GPU copies of block `src` into block `dst` in every layer's K and V buffer
    /// (copy-on-write of a partly filled block): the values, and for INT8 the codes and the
    /// scales.
    pub fn copy_block(&self, encoder: &mut wgpu::CommandEncoder, src: u32, dst: u32) {
        let Some(scratch) = &self.scratch else { return };
        let ranges = self.block_copies(src, dst);
        for buffers in [&self.k, &self.v] {
            for b in buffers {
                for &(s, d, size) in &ranges {
                    encoder.copy_buffer_to_buffer(b, s, scratch, 0, size);
                    encoder.copy_buffer_to_buffer(scratch, 0, b, d, size);
                }
            }
        }
    }
}
