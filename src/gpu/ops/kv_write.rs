//! Appending new keys and values to a layer's contiguous (not paged) KV cache.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    max_len: u32,
}

const KV_WRITE_WG: u64 = 64;
/// Head dims per invocation.
const KV_WRITE_PER: u64 = 4;

/// Copies each token's k and v heads from the fused qkv rows (after RoPE) into the layer's caches
/// at slot `positions[t]`.
/// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row the n_heads q heads, then
/// the n_kv_heads k heads, then the n_kv_heads v heads.
/// k_cache, v_cache: [n_kv_heads, max_len, head_dim] f32 each, head-major: element (h, s, d) at
/// `(h * max_len + s) * head_dim + d`, so attention streams one head's keys contiguously.
/// positions: [n_tokens] u32, read when the kernel runs (rewritten every decode step). A position
/// >= max_len is skipped: nothing is written for that token (the engine checks lengths first).
#[allow(clippy::too_many_arguments)]
pub fn write_contiguous(
    ctx: &Context,
    qkv: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    positions: &wgpu::Buffer,
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    max_len: u32,
) -> Result<Kernel, GpuError> {
    const OP: &str = "kv_write";
    if n_tokens == 0 || n_heads == 0 || n_kv_heads == 0 || head_dim == 0 || max_len == 0 {
        return Err(shape_err(
            OP,
            format!(
                "n_tokens ({n_tokens}), n_heads ({n_heads}), n_kv_heads ({n_kv_heads}), head_dim ({head_dim}) \
                 and max_len ({max_len}) must be at least 1"
            ),
        ));
    }
    if k_cache == v_cache {
        return Err(shape_err(OP, "k_cache and v_cache must be different buffers"));
    }
    let row = (n_heads as u64 + 2 * n_kv_heads as u64) * head_dim as u64;
    let cache_bytes = n_kv_heads as u64 * max_len as u64 * head_dim as u64 * 4;
    check_size(OP, "qkv", qkv, n_tokens as u64 * row * 4)?;
    check_size(OP, "k_cache", k_cache, cache_bytes)?;
    check_size(OP, "v_cache", v_cache, cache_bytes)?;
    check_size(OP, "positions", positions, n_tokens as u64 * 4)?;
    for (what, buffer) in [("qkv", qkv), ("k_cache", k_cache), ("v_cache", v_cache), ("positions", positions)] {
        check_binding(ctx, OP, what, buffer.size())?;
    }
    let params = KvWriteParams { n_tokens, n_heads, n_kv_heads, head_dim, max_len };
    let params = ctx.uniform_init("kv_write.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("kv_write", "main", &[("WG", KV_WRITE_WG as f64), ("PER", KV_WRITE_PER as f64)])?;
    let items = n_tokens as u64 * n_kv_heads as u64 * (head_dim as u64).div_ceil(KV_WRITE_PER);
    let kernel = Kernel::new(
        ctx,
        OP,
        pipeline,
        &[whole(qkv), whole(k_cache), whole(v_cache), whole(positions), whole(&params)],
        grid(ctx, items, KV_WRITE_WG),
        None,
    );
    Ok(kernel.owning(params))
}

/// CPU reference of [`write_contiguous`]: same layouts, positions >= max_len skipped.
#[allow(clippy::too_many_arguments)]
pub fn write_contiguous_cpu(
    qkv: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    positions: &[u32],
    n_tokens: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    max_len: usize,
) {
    let row = (n_heads + 2 * n_kv_heads) * head_dim;
    for (t, &pos) in positions.iter().enumerate().take(n_tokens) {
        let pos = pos as usize;
        if pos >= max_len {
            continue;
        }
        for h in 0..n_kv_heads {
            let k_src = t * row + (n_heads + h) * head_dim;
            let v_src = t * row + (n_heads + n_kv_heads + h) * head_dim;
            let dst = (h * max_len + pos) * head_dim;
            k_cache[dst..dst + head_dim].copy_from_slice(&qkv[k_src..k_src + head_dim]);
            v_cache[dst..dst + head_dim].copy_from_slice(&qkv[v_src..v_src + head_dim]);
        }
    }
}
