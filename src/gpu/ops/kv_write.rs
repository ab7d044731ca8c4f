//! Appending new keys and values to a layer's paged KV pool (the contiguous cache is the
//! one-block case).

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
}

const KV_WRITE_WG: u64 = 64;
/// Head dims per invocation.
const KV_WRITE_PER: u64 = 4;

/// Copies each token's k and v heads from the fused qkv rows (after RoPE) into the layer's paged
/// pools, at position `positions[t]` of the sequence whose block-table row starts at `table_base`.
/// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row the n_heads q heads, then
/// the n_kv_heads k heads, then the n_kv_heads v heads.
/// k_pool, v_pool: [n_blocks, n_kv_heads, block_size, head_dim] f32 each: element (b, h, s, d) at
/// `((b * n_kv_heads + h) * block_size + s) * head_dim + d`. The contiguous layout
/// [n_kv_heads, max_len, head_dim] is the case block_size = max_len, n_blocks = 1, table [0].
/// positions: [n_tokens] u32, read when the kernel runs (rewritten every step). Position p lands
/// in logical block p / block_size, slot p % block_size.
/// block_table: [rows * max_blocks_per_seq] u32; logical block i is physical block
/// `block_table[table_base + i]`.
/// step: a uniform buffer (at least 4 bytes; `ctx.uniform_init` pads to 16) holding `table_base`
/// as a u32 at offset 0, written by the engine before each step; read when the kernel runs.
/// All tokens of one dispatch belong to that one sequence.
/// A table index past the end of `block_table` or a physical block >= n_blocks writes nothing for
/// that token (the engine allocates blocks first).
#[allow(clippy::too_many_arguments)]
pub fn write_paged(
    ctx: &Context,
    qkv: &wgpu::Buffer,
    k_pool: &wgpu::Buffer,
    v_pool: &wgpu::Buffer,
    positions: &wgpu::Buffer,
    block_table: &wgpu::Buffer,
    step: &wgpu::Buffer,
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
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
    let pool_bytes = n_blocks as u64 * n_kv_heads as u64 * block_size as u64 * head_dim as u64 * 4;
    // The kernel's element indices are u32.
    if pool_bytes / 4 > u32::MAX as u64 {
        return Err(shape_err(OP, format!("a pool of {} elements overflows u32 indices", pool_bytes / 4)));
    }
    check_size(OP, "qkv", qkv, n_tokens as u64 * row * 4)?;
    check_size(OP, "k_pool", k_pool, pool_bytes)?;
    check_size(OP, "v_pool", v_pool, pool_bytes)?;
    check_size(OP, "positions", positions, n_tokens as u64 * 4)?;
    check_size(OP, "block_table", block_table, 4)?;
    check_size(OP, "step", step, 4)?;
    for (what, buffer) in
        [("qkv", qkv), ("k_pool", k_pool), ("v_pool", v_pool), ("positions", positions), ("block_table", block_table)]
    {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = KvWriteParams { n_tokens, n_heads, n_kv_heads, head_dim, block_size, n_blocks };
    let params = ctx.uniform_init("kv_write.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("kv_write", "main", &[("WG", KV_WRITE_WG as f64), ("PER", KV_WRITE_PER as f64)])?;
    let items = n_tokens as u64 * n_kv_heads as u64 * (head_dim as u64).div_ceil(KV_WRITE_PER);
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
            whole(step),
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
