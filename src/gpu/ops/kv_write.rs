//! Appending new keys and values to a layer's paged KV pool (the contiguous cache is the
//! one-block case), as f32 or quantized to INT8 on the way in.

use super::pool::{PoolBuffers, PoolShape};
use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::KvDtype;

const OP: &str = "kv_write";
const KV_WRITE_WG: u64 = 64;
/// Head dims per invocation (f32).
const KV_WRITE_PER: u64 = 4;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
    scale_base: u32,
}

/// The buffers a KV write binds (n_tokens rows; pool shapes: [`PoolShape`]).
pub struct KvWriteBuffers<'a> {
    /// [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row the n_heads q heads, then
    /// the n_kv_heads k heads, then the n_kv_heads v heads (after RoPE).
    pub qkv: &'a wgpu::Buffer,
    /// The layer's pool, written; `k` and `v` must be different buffers.
    pub pool: PoolBuffers<'a>,
    /// [n_tokens] u32, read when the kernel runs (rewritten every step). Position p lands in
    /// logical block p / block_size, slot p % block_size.
    pub positions: &'a wgpu::Buffer,
    /// [n_tokens] u32, token t's sequence's `table_base` (its row in `block_table`), written by
    /// the engine before each step; tokens of one dispatch may belong to different sequences.
    pub row_tables: &'a wgpu::Buffer,
}

/// Copies each token's k and v heads from the fused qkv rows into the layer's paged pools, at
/// position `positions[t]` of the sequence whose block-table row starts at `row_tables[t]`.
/// f32 pools take the values as they are; INT8 pools ([`crate::quant::kv_int8::Int8Layout`])
/// quantize each (token, kv head) as one group (`quantize_group`). A table index past the end of
/// `block_table` or a physical block >= n_blocks writes nothing for that token (the engine
/// allocates blocks first). `pool.max_len` plays no part. No two tokens may map to one slot
/// (a step's rows are distinct positions, and copy-on-write keeps shared blocks read-only): two
/// writers of one slot race, and their order is undefined on a real GPU.
pub fn write_paged(ctx: &Context, buffers: &KvWriteBuffers<'_>, pool: &PoolShape, n_tokens: u32) -> Result<Kernel, GpuError> {
    let scale_base = check_write(ctx, OP, buffers, pool, n_tokens)?;
    let b = buffers;
    let params = KvWriteParams {
        n_tokens,
        n_heads: pool.n_heads,
        n_kv_heads: pool.n_kv_heads,
        head_dim: pool.head_dim,
        block_size: pool.block_size,
        n_blocks: pool.n_blocks,
        scale_base,
    };
    let params = ctx.params_init("kv_write.params", bytemuck::bytes_of(&params));
    let int8 = pool.dtype == KvDtype::Int8;
    // INT8: one invocation per group, whose scale needs all of it.
    let per = if int8 { pool.head_dim as u64 } else { KV_WRITE_PER };
    let constants = [("WG", KV_WRITE_WG as f64), ("PER", per as f64), ("INT8", if int8 { 1.0 } else { 0.0 })];
    let pipeline = ctx.pipeline("kv_write", "main", &constants)?;
    let items = n_tokens as u64 * pool.n_kv_heads as u64 * (pool.head_dim as u64).div_ceil(per);
    let resources = [whole(b.qkv), whole(b.pool.k), whole(b.pool.v), whole(b.positions), whole(&params), whole(b.pool.block_table), whole(b.row_tables)];
    let kernel = Kernel::new(ctx, OP, pipeline, &resources, grid(ctx, items, KV_WRITE_WG), None);
    Ok(kernel.owning(params))
}

/// Checks what every KV write needs (the pool's shape, at least one token, two pool buffers,
/// the buffers' sizes and bindings); returns the word where an INT8 pool's scales start.
pub(super) fn check_write(ctx: &Context, op: &'static str, b: &KvWriteBuffers<'_>, pool: &PoolShape, n_tokens: u32) -> Result<u32, GpuError> {
    pool.check(op)?;
    if n_tokens == 0 {
        return Err(shape_err(op, "n_tokens must be at least 1"));
    }
    if b.pool.k == b.pool.v {
        return Err(shape_err(op, "k_pool and v_pool must be different buffers"));
    }
    check_size(op, "qkv", b.qkv, n_tokens as u64 * pool.qkv_row() * 4)?;
    let scale_base = pool.check_buffers(ctx, op, &b.pool)?;
    check_size(op, "positions", b.positions, n_tokens as u64 * 4)?;
    check_size(op, "row_tables", b.row_tables, n_tokens as u64 * 4)?;
    check_binding(ctx, op, "qkv", b.qkv.size())?;
    check_binding(ctx, op, "positions", b.positions.size())?;
    check_binding(ctx, op, "row_tables", b.row_tables.size())?;
    Ok(scale_base)
}

/// The (token, physical block, slot) of every token of `positions` the kernel writes: tokens
/// whose table index is past `block_table`'s end or whose block is >= n_blocks are skipped.
#[cfg(feature = "testing")]
fn written_slots<'a>(pool: &'a PoolShape, positions: &'a [u32], block_table: &'a [u32], table_base: u32) -> impl Iterator<Item = (usize, u32, u32)> + 'a {
    positions.iter().enumerate().filter_map(move |(t, &pos)| {
        // Checked: on wasm32 usize is 32 bits, and the kernel skips a wrapped index too.
        let entry = (table_base as usize).checked_add((pos / pool.block_size) as usize)?;
        let block = *block_table.get(entry)?;
        (block < pool.n_blocks).then_some((t, block, pos % pool.block_size))
    })
}

/// CPU reference of [`write_paged`] into f32 pools (the pools' element layout of [`PoolShape`];
/// qkv: [positions.len(), qkv_row]).
#[cfg(feature = "testing")]
pub fn write_paged_cpu(pool: &PoolShape, qkv: &[f32], k_pool: &mut [f32], v_pool: &mut [f32], positions: &[u32], block_table: &[u32], table_base: u32) {
    let (n_heads, n_kv_heads, head_dim) = (pool.n_heads as usize, pool.n_kv_heads as usize, pool.head_dim as usize);
    let row = pool.qkv_row() as usize;
    for (t, block, slot) in written_slots(pool, positions, block_table, table_base) {
        for h in 0..n_kv_heads {
            let k_src = t * row + (n_heads + h) * head_dim;
            let v_src = t * row + (n_heads + n_kv_heads + h) * head_dim;
            let dst = ((block as usize * n_kv_heads + h) * pool.block_size as usize + slot as usize) * head_dim;
            k_pool[dst..dst + head_dim].copy_from_slice(&qkv[k_src..k_src + head_dim]);
            v_pool[dst..dst + head_dim].copy_from_slice(&qkv[v_src..v_src + head_dim]);
        }
    }
}

/// CPU reference of [`write_paged`] into INT8 pools: `k_words`, `v_words` are the words of two
/// [`crate::quant::kv_int8::Int8Layout`] buffers of the pool's shape. Same skipping rules as
/// [`write_paged_cpu`].
#[cfg(feature = "testing")]
pub fn write_paged_int8_cpu(
    pool: &PoolShape,
    qkv: &[f32],
    k_words: &mut [u32],
    v_words: &mut [u32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
) -> Result<(), GpuError> {
    use crate::quant::kv_int8 as quant;
    let layout = pool.int8_layout("write_paged_int8_cpu")?;
    let (n_heads, n_kv_heads, head_dim) = (pool.n_heads as usize, pool.n_kv_heads as usize, pool.head_dim as usize);
    let row = pool.qkv_row() as usize;
    let words = head_dim / 4;
    let mut codes = vec![0i8; head_dim];
    for (t, block, slot) in written_slots(pool, positions, block_table, table_base) {
        for h in 0..n_kv_heads {
            let group = layout.group(block, h as u32, slot) as usize;
            let scale_at = layout.data_words() as usize + group;
            for (src, pool) in [(n_heads + h, &mut *k_words), (n_heads + n_kv_heads + h, &mut *v_words)] {
                let x = &qkv[t * row + src * head_dim..][..head_dim];
                let scale = quant::quantize_group(x, &mut codes);
                for (w, c) in codes.chunks_exact(4).enumerate() {
                    pool[group * words + w] = quant::pack4([c[0], c[1], c[2], c[3]]);
                }
                pool[scale_at] = scale.to_bits();
            }
        }
    }
    Ok(())
}
