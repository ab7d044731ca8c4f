//! Appending new keys and values to a layer's paged KV pool (the contiguous cache is the
//! one-block case), as f32 or quantized to INT8 on the way in.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::kv_int8::{self as quant, Int8Layout};
use crate::quant::KvDtype;

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

const KV_WRITE_WG: u64 = 64;
/// Head dims per invocation.
const KV_WRITE_PER: u64 = 4;

/// [`write_paged_dtype`] into an f32 pool.
#[allow(clippy::too_many_arguments)]
pub fn write_paged(
    ctx: &Context,
    qkv: &wgpu::Buffer,
    k_pool: &wgpu::Buffer,
    v_pool: &wgpu::Buffer,
    positions: &wgpu::Buffer,
    block_table: &wgpu::Buffer,
    row_tables: &wgpu::Buffer,
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
) -> Result<Kernel, GpuError> {
    write_paged_dtype(
        ctx,
        qkv,
        k_pool,
        v_pool,
        positions,
        block_table,
        row_tables,
        n_tokens,
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        n_blocks,
        KvDtype::F32,
    )
}

/// Copies each token's k and v heads from the fused qkv rows (after RoPE) into the layer's paged
/// pools, at position `positions[t]` of the sequence whose block-table row starts at `row_tables[t]`.
/// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row the n_heads q heads, then
/// the n_kv_heads k heads, then the n_kv_heads v heads.
/// k_pool, v_pool, f32: [n_blocks, n_kv_heads, block_size, head_dim] f32 each: element (b, h, s, d)
/// at `((b * n_kv_heads + h) * block_size + s) * head_dim + d`. The contiguous layout
/// [n_kv_heads, max_len, head_dim] is the case block_size = max_len, n_blocks = 1, table [0].
/// k_pool, v_pool, INT8: [`Int8Layout`] buffers (codes in the same order, then one scale per
/// (block, kv head, slot)); each (token, kv head) is quantized as one group (`quant::quantize_group`).
/// positions: [n_tokens] u32, read when the kernel runs (rewritten every step). Position p lands
/// in logical block p / block_size, slot p % block_size.
/// block_table: [rows * max_blocks_per_seq] u32; logical block i is physical block
/// `block_table[table_base + i]`.
/// row_tables: [n_tokens] u32, token t's sequence's `table_base` (its row in `block_table`),
/// written by the engine before each step; tokens of one dispatch may belong to different
/// sequences.
/// A table index past the end of `block_table` or a physical block >= n_blocks writes nothing for
/// that token (the engine allocates blocks first).
#[allow(clippy::too_many_arguments)]
pub fn write_paged_dtype(
    ctx: &Context,
    qkv: &wgpu::Buffer,
    k_pool: &wgpu::Buffer,
    v_pool: &wgpu::Buffer,
    positions: &wgpu::Buffer,
    block_table: &wgpu::Buffer,
    row_tables: &wgpu::Buffer,
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
    dtype: KvDtype,
) -> Result<Kernel, GpuError> {
    const OP: &str = "kv_write";
    if n_tokens == 0 || n_heads == 0 || n_kv_heads == 0 || head_dim == 0 || block_size == 0 || n_blocks == 0 {
        return Err(shape_err(
            OP,
            format!(
                "n_tokens ({n_tokens}), n_heads ({n_heads}), n_kv_heads ({n_kv_heads}), head_dim ({head_dim}), \
                 block_size ({block_size}) and n_blocks ({n_blocks}) must be at least 1"
            ),
        ));
    }
    if k_pool == v_pool {
        return Err(shape_err(OP, "k_pool and v_pool must be different buffers"));
    }
    let row = (n_heads as u64 + 2 * n_kv_heads as u64) * head_dim as u64;
    let (pool_bytes, scale_base, per) = match dtype {
        KvDtype::F32 => (n_blocks as u64 * n_kv_heads as u64 * block_size as u64 * head_dim as u64 * 4, 0, KV_WRITE_PER),
        KvDtype::Int8 => {
            let layout = Int8Layout::new(n_blocks, n_kv_heads, block_size, head_dim).map_err(|e| shape_err(OP, e.to_string()))?;
            // One invocation per group: its scale needs all of it.
            (layout.buffer_bytes(), layout.data_words() as u32, head_dim as u64)
        }
    };
    // The kernel's element indices are u32.
    if pool_bytes / 4 > u32::MAX as u64 {
        return Err(shape_err(OP, format!("a pool of {} words overflows u32 indices", pool_bytes / 4)));
    }
    check_size(OP, "qkv", qkv, n_tokens as u64 * row * 4)?;
    check_size(OP, "k_pool", k_pool, pool_bytes)?;
    check_size(OP, "v_pool", v_pool, pool_bytes)?;
    check_size(OP, "positions", positions, n_tokens as u64 * 4)?;
    check_size(OP, "block_table", block_table, 4)?;
    check_size(OP, "row_tables", row_tables, n_tokens as u64 * 4)?;
    for (what, buffer) in
        [("qkv", qkv), ("k_pool", k_pool), ("v_pool", v_pool), ("positions", positions), ("block_table", block_table)]
    {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = KvWriteParams { n_tokens, n_heads, n_kv_heads, head_dim, block_size, n_blocks, scale_base };
    let params = ctx.uniform_init("kv_write.params", bytemuck::bytes_of(&params));
    let int8 = if dtype == KvDtype::Int8 { 1.0 } else { 0.0 };
    let pipeline =
        ctx.pipeline("kv_write", "main", &[("WG", KV_WRITE_WG as f64), ("PER", per as f64), ("INT8", int8)])?;
    let items = n_tokens as u64 * n_kv_heads as u64 * (head_dim as u64).div_ceil(per);
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[
            whole(qkv),
            whole(k_pool),
            whole(v_pool),
            whole(positions),
            whole(&params),
            whole(block_table),
            whole(row_tables),
        ],
        grid(ctx, items, KV_WRITE_WG),
        None,
    );
    Ok(kernel.owning(params))
}

/// CPU reference of [`write_paged`]: same layouts; tokens whose table index is past
/// `block_table`'s end or whose physical block is >= n_blocks are skipped.
#[allow(clippy::too_many_arguments)]
pub fn write_paged_cpu(
    qkv: &[f32],
    k_pool: &mut [f32],
    v_pool: &mut [f32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
    n_tokens: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    n_blocks: usize,
) {
    let row = (n_heads + 2 * n_kv_heads) * head_dim;
    for (t, &pos) in positions.iter().enumerate().take(n_tokens) {
        let pos = pos as usize;
        // Checked: on wasm32 usize is 32 bits, and the kernel skips a wrapped index too.
        let Some(&block) = (table_base as usize).checked_add(pos / block_size).and_then(|e| block_table.get(e)) else {
            continue;
        };
        let block = block as usize;
        if block >= n_blocks {
            continue;
        }
        for h in 0..n_kv_heads {
            let k_src = t * row + (n_heads + h) * head_dim;
            let v_src = t * row + (n_heads + n_kv_heads + h) * head_dim;
            let dst = ((block * n_kv_heads + h) * block_size + pos % block_size) * head_dim;
            k_pool[dst..dst + head_dim].copy_from_slice(&qkv[k_src..k_src + head_dim]);
            v_pool[dst..dst + head_dim].copy_from_slice(&qkv[v_src..v_src + head_dim]);
        }
    }
}

/// CPU reference of [`write_paged_dtype`] into INT8 pools: `k_pool`, `v_pool` are the words of
/// two [`Int8Layout`] buffers of the layout's shape. Same skipping rules as [`write_paged_cpu`].
#[allow(clippy::too_many_arguments)]
pub fn write_paged_int8_cpu(
    qkv: &[f32],
    k_pool: &mut [u32],
    v_pool: &mut [u32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
    n_tokens: usize,
    n_heads: usize,
    layout: &Int8Layout,
) {
    let (n_kv_heads, head_dim, block_size) = (layout.n_kv_heads as usize, layout.head_dim as usize, layout.block_size);
    let row = (n_heads + 2 * n_kv_heads) * head_dim;
    let words = head_dim / 4;
    let mut codes = vec![0i8; head_dim];
    for (t, &pos) in positions.iter().enumerate().take(n_tokens) {
        let Some(&block) =
            (table_base as usize).checked_add((pos / block_size) as usize).and_then(|e| block_table.get(e))
        else {
            continue;
        };
        if block >= layout.n_blocks {
            continue;
        }
        for h in 0..n_kv_heads {
            let group = layout.group(block, h as u32, pos % block_size) as usize;
            let scale_at = layout.data_words() as usize + group;
            for (src, pool) in [(n_heads + h, &mut *k_pool), (n_heads + n_kv_heads + h, &mut *v_pool)] {
                let x = &qkv[t * row + src * head_dim..][..head_dim];
                let scale = quant::quantize_group(x, &mut codes);
                for (w, c) in codes.chunks_exact(4).enumerate() {
                    pool[group * words + w] = quant::pack4([c[0], c[1], c[2], c[3]]);
                }
                pool[scale_at] = scale.to_bits();
            }
        }
    }
}
