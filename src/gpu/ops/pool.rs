//! The paged KV pool of one layer as the kernels see it: its shape ([`PoolShape`]) and its
//! buffers ([`PoolBuffers`]), shared by the KV writes ([`super::kv_write`], [`super::qkv_heads`])
//! and both attention kernels ([`super::attention`]), with the checks they all make before
//! binding a pool.

use super::{check_binding, check_size};
use crate::gpu::{shape_err, Context, GpuError};
use crate::quant::kv_int8::Int8Layout;
use crate::quant::KvDtype;

/// The paged KV pool as the kernels see it, and the attention heads that read it.
///
/// A pool holds, per layer, one K and one V buffer of `n_blocks` blocks of `block_size` keys:
/// f32 element (b, h, s, d) at `((b * n_kv_heads + h) * block_size + s) * head_dim + d`, or the
/// same order in INT8 codes followed by the scales ([`Int8Layout`], head_dim a multiple of 16).
/// The contiguous cache [n_kv_heads, max_len, head_dim] is block_size = max_len, n_blocks = 1,
/// table [0].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolShape {
    /// Query heads.
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// The longest sequence in keys (max_seq_len): attention clamps positions below it and sizes
    /// its splits or passes for it.
    pub max_len: u32,
    /// Keys per block.
    pub block_size: u32,
    /// Blocks in the pool.
    pub n_blocks: u32,
    /// The stored precision of K and V.
    pub dtype: KvDtype,
    /// Sliding-window attention: a query at position p sees only keys j with p - j < window
    /// (its layer's window); 0: every key up to p. Only attention reads it.
    pub window: u32,
    /// Attention scores soft-capped to `c · tanh(s / c)` (Gemma 2); 0: none. Only attention
    /// reads it.
    pub softcap: f32,
}

/// The buffers of one layer's pool, as every kernel touching the cache binds them.
#[derive(Clone, Copy)]
pub struct PoolBuffers<'a> {
    /// The K pool: [`PoolShape`]'s layout, f32 or INT8.
    pub k: &'a wgpu::Buffer,
    /// The V pool, same layout as `k`.
    pub v: &'a wgpu::Buffer,
    /// u32 block tables of every sequence: logical block i of the sequence whose row starts at
    /// `table_base` is physical block `block_table[table_base + i]`. A table index past the
    /// buffer's end or a block >= n_blocks is no block: its keys are neither written nor read.
    pub block_table: &'a wgpu::Buffer,
}

impl PoolShape {
    /// Checks what every kernel over the pool needs: no empty size, n_kv_heads dividing
    /// n_heads, a head_dim the INT8 layout can hold for an INT8 pool.
    pub(crate) fn check(&self, op: &'static str) -> Result<(), GpuError> {
        let s = self;
        if [s.n_heads, s.n_kv_heads, s.head_dim, s.max_len, s.block_size, s.n_blocks].contains(&0) {
            return Err(shape_err(op, format!("empty shape {s:?}: every size must be at least 1")));
        }
        if s.n_heads % s.n_kv_heads != 0 {
            return Err(shape_err(op, format!("n_kv_heads {} does not divide n_heads {}", s.n_kv_heads, s.n_heads)));
        }
        if s.dtype == KvDtype::Int8 {
            s.int8_layout(op)?;
        }
        Ok(())
    }

    /// The INT8 layout of one of the pool's buffers (whatever the dtype).
    pub(crate) fn int8_layout(&self, op: &'static str) -> Result<Int8Layout, GpuError> {
        Int8Layout::new(self.n_blocks, self.n_kv_heads, self.block_size, self.head_dim).map_err(|e| shape_err(op, e.to_string()))
    }

    /// Bytes of one of the K / V buffers for the shape's dtype, and the word where an INT8 pool's
    /// scales start (0 for f32). Errors: a pool whose u32 word indices overflow.
    pub(crate) fn buffer_bytes(&self, op: &'static str) -> Result<(u64, u32), GpuError> {
        let (bytes, scale_base) = match self.dtype {
            KvDtype::F32 => (self.pool_len() * 4, 0),
            KvDtype::Int8 => {
                let layout = self.int8_layout(op)?;
                (layout.buffer_bytes(), layout.data_words() as u32)
            }
        };
        if bytes / 4 > u32::MAX as u64 {
            return Err(shape_err(op, format!("a pool of {} words overflows u32 indices", bytes / 4)));
        }
        Ok((bytes, scale_base))
    }

    /// Checks the pool's buffers against the shape (sizes, and the device's binding limit for
    /// what is bound: the whole buffers). Returns the word where an INT8 pool's scales start.
    pub(crate) fn check_buffers(&self, ctx: &Context, op: &'static str, buffers: &PoolBuffers<'_>) -> Result<u32, GpuError> {
        let (bytes, scale_base) = self.buffer_bytes(op)?;
        check_size(op, "k_pool", buffers.k, bytes)?;
        check_size(op, "v_pool", buffers.v, bytes)?;
        check_size(op, "block_table", buffers.block_table, 4)?;
        for (what, buffer) in [("k_pool", buffers.k), ("v_pool", buffers.v), ("block_table", buffers.block_table)] {
            check_binding(ctx, op, what, buffer.size())?;
        }
        Ok(scale_base)
    }

    /// Elements (keys x head dims) in one of the K / V pools, whatever the dtype.
    pub fn pool_len(&self) -> u64 {
        self.n_blocks as u64 * self.n_kv_heads as u64 * self.block_size as u64 * self.head_dim as u64
    }

    /// Query heads per KV head.
    pub fn group(&self) -> u32 {
        self.n_heads / self.n_kv_heads
    }

    /// f32 elements in one row of the fused qkv buffer: the q heads, then the k heads, then the
    /// v heads.
    pub fn qkv_row(&self) -> u64 {
        (self.n_heads as u64 + 2 * self.n_kv_heads as u64) * self.head_dim as u64
    }

    /// f32 elements in one row of the attention output.
    pub fn out_row(&self) -> u64 {
        self.n_heads as u64 * self.head_dim as u64
    }
}
