//! Everything a layer does to the fused qkv rows between the qkv matmul and attention, in one
//! dispatch: Gemma 3's per-head q/k RMSNorm, RoPE of the q and k heads, and the KV write of the
//! roped k heads and the v heads into the layer's paged pool (f32 or INT8). The same arithmetic
//! as [`super::norm::head_norm`] → [`super::rope::rope`] → [`super::kv_write::write_paged`]
//! (the shaders share their pieces as preludes), so the results are theirs bit for bit.

use super::kv_write::{check_write, KvWriteBuffers};
use super::pool::PoolShape;
use super::rope::{check_rope, turn_table, TURN_TABLE_WORDS};
use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::model::RopePairing;
use crate::quant::KvDtype;

const OP: &str = "qkv_heads";
/// One invocation per (token, head), 64 per workgroup.
const QKV_HEADS_WG: u64 = 64;
/// u32 words of the parameters: 8 header words, then rope_common.wgsl's turn table.
const PARAM_WORDS: usize = 8 + TURN_TABLE_WORDS;

/// Per-head RMSNorm weights of the q and k heads (Gemma 3's `attn_q_norm`, `attn_k_norm`).
#[derive(Clone, Copy)]
pub struct QkNorm<'a> {
    /// [2, head_dim] f32: the weights every q head shares, then those every k head shares. One
    /// buffer, not two: with its parameters in storage the kernel binds WebGPU's default limit of
    /// 8 storage buffers per stage.
    pub weights: &'a wgpu::Buffer,
    /// Finite and >= 0.
    pub eps: f32,
}

/// One dispatch over `n_tokens` fused qkv rows (`buffers.qkv`: [n_tokens, qkv_row] f32, each row
/// `pool.n_heads` q heads, then `n_kv_heads` k heads, then `n_kv_heads` v heads, as the qkv matmul
/// wrote them):
/// - every q and k head, in place: with `qk_norm`, `head / sqrt(mean(head²) + eps) * weight`
///   (as [`super::norm::head_norm`]); then RoPE by the token's position with `rope` = (base,
///   pairing) (as [`super::rope::rope`]);
/// - every k head (roped) and v head: written to the pool at position `positions[t]` of the
///   sequence whose block-table row starts at `row_tables[t]`, f32 or quantized per (token, KV
///   head) to INT8, skipping a table index past `block_table`'s end or a block >= n_blocks (as
///   [`super::kv_write::write_paged`]; `pool.window` and `pool.max_len` play no part).
///
/// Shape contract: `pool` valid ([`PoolShape`]), n_tokens >= 1, head_dim even and <= 512, the
/// base finite and > 0, eps finite and >= 0, the norm weights [2, head_dim]; qkv a buffer of its
/// own (it is written), the pool's K and V two different buffers.
pub fn qkv_heads(
    ctx: &Context,
    buffers: &KvWriteBuffers<'_>,
    qk_norm: Option<QkNorm<'_>>,
    pool: &PoolShape,
    n_tokens: u32,
    (base, pairing): (f32, RopePairing),
) -> Result<Kernel, GpuError> {
    let b = buffers;
    let scale_base = check_write(ctx, OP, b, pool, n_tokens)?;
    check_rope(OP, pool.head_dim, base)?;
    let others = [b.pool.k, b.pool.v, b.pool.block_table, b.positions, b.row_tables];
    if others.contains(&b.qkv) || qk_norm.is_some_and(|n| n.weights == b.qkv) {
        return Err(shape_err(OP, "qkv is written: it must be a buffer of its own"));
    }
    // Without the norms their binding still needs a buffer: positions stands in (never read).
    let (norm_weights, eps) = match qk_norm {
        Some(QkNorm { weights, eps }) => {
            if !(eps.is_finite() && eps >= 0.0) {
                return Err(shape_err(OP, format!("eps must be finite and >= 0, got {eps}")));
            }
            check_size(OP, "the q and k norm weights", weights, 2 * pool.head_dim as u64 * 4)?;
            check_binding(ctx, OP, "the q and k norm weights", weights.size())?;
            (weights, eps)
        }
        None => (b.positions, 0.0),
    };
    let mut words = vec![0u32; PARAM_WORDS];
    words[..8].copy_from_slice(&[n_tokens, pool.n_heads, pool.n_kv_heads, pool.head_dim, pool.block_size, pool.n_blocks, scale_base, eps.to_bits()]);
    words[8..].copy_from_slice(&turn_table(base, pool.head_dim));
    let params = ctx.params_init("qkv_heads.params", bytemuck::cast_slice(&words));
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    let constants = [
        ("WG", QKV_HEADS_WG as f64),
        ("QK_NORM", flag(qk_norm.is_some())),
        ("NEOX", flag(pairing == RopePairing::Neox)),
        ("INT8", flag(pool.dtype == KvDtype::Int8)),
    ];
    let pipeline = ctx.pipeline("qkv_heads", "main", &constants)?;
    // Bindings 0-6 in kv_write's order (kv_common.wgsl declares 1-3, 5, 6), then the norms: 8
    // storage buffers, WebGPU's default limit per stage.
    let resources = [
        whole(b.qkv),
        whole(b.pool.k),
        whole(b.pool.v),
        whole(b.positions),
        whole(&params),
        whole(b.pool.block_table),
        whole(b.row_tables),
        whole(norm_weights),
    ];
    let items = n_tokens as u64 * (pool.n_heads as u64 + 2 * pool.n_kv_heads as u64);
    let kernel = Kernel::new(ctx, OP, pipeline, &resources, grid(ctx, items, QKV_HEADS_WG), None);
    Ok(kernel.owning(params))
}

/// CPU reference of what [`qkv_heads`] does to the rows, in place: `qk_norm` = (q weights, k
/// weights, eps) through [`super::norm::head_norm_cpu`], then [`super::rope::rope_cpu`] on the q
/// and k heads. Its pool writes are [`super::kv_write::write_paged_cpu`]'s (or
/// `write_paged_int8_cpu`'s) of the rows this leaves. qkv: [positions.len(), qkv_row].
#[cfg(feature = "testing")]
pub fn qkv_heads_cpu(pool: &PoolShape, qkv: &mut [f32], qk_norm: Option<(&[f32], &[f32], f32)>, positions: &[u32], (base, pairing): (f32, RopePairing)) {
    use super::norm::{head_norm_cpu, HeadNormShape};
    use super::rope::{rope_cpu, RopeShape};
    let n_tokens = positions.len() as u32;
    if let Some((q, k, eps)) = qk_norm {
        let heads = |first, n_heads| HeadNormShape { n_rows: n_tokens, row_stride: pool.qkv_row() as u32, first, n_heads, head_dim: pool.head_dim, eps };
        head_norm_cpu(qkv, q, &heads(0, pool.n_heads));
        head_norm_cpu(qkv, k, &heads(pool.out_row() as u32, pool.n_kv_heads));
    }
    rope_cpu(&RopeShape::fused_qkv(pool, n_tokens, (base, pairing)), qkv, positions);
}
