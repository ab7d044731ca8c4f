//! Everything a layer does to the fused qkv rows between the qkv matmul and attention, in one
//! dispatch: Gemma 3's per-head q/k RMSNorm, RoPE of the q and k heads, and the KV write of the
//! roped k heads and the v heads into the layer's paged pool (f32 or INT8). The same arithmetic
//! as [`super::norm::head_norm`] → [`super::rope::rope`] → [`super::kv_write::write_paged`]
//! (the shaders share their pieces as preludes), so the results are theirs bit for bit.

use super::kv_write::{check_write, KvWriteBuffers};
use super::pool::PoolShape;
use super::rope::{check_rope, turn_table_of, TURN_TABLE_WORDS};
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

/// A layer's RoPE as [`qkv_heads`] applies it: pair i of the first `dims` dimensions of each
/// head (paired within them by `pairing`) turns by pos · base^(-2i/dims) / factors[i], cos and
/// sin times `scale`; the other dimensions stay (`dims` 0: no RoPE at all, a NoPE layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadsRope<'a> {
    pub base: f32,
    pub pairing: RopePairing,
    /// `None`: the head dim.
    pub dims: Option<u32>,
    pub factors: Option<&'a [f32]>,
    pub scale: f32,
}

impl From<(f32, RopePairing)> for HeadsRope<'_> {
    /// Every dimension rotated, no factors, no scale.
    fn from((base, pairing): (f32, RopePairing)) -> Self {
        HeadsRope { base, pairing, dims: None, factors: None, scale: 1.0 }
    }
}

impl HeadsRope<'_> {
    /// Whether it rotates every dimension of a head of `head_dim` with nothing beyond the base
    /// and pairing (what the attention kernels that rope their own heads do).
    pub fn is_plain(&self, head_dim: u32) -> bool {
        self.dims.is_none_or(|d| d == head_dim) && self.factors.is_none() && self.scale == 1.0
    }

    fn check(&self, head_dim: u32) -> Result<u32, GpuError> {
        check_rope(OP, head_dim, self.base)?;
        let dims = self.dims.unwrap_or(head_dim);
        if dims > head_dim || dims % 2 != 0 {
            return Err(shape_err(OP, format!("RoPE over {dims} dims of a head of {head_dim}")));
        }
        if self.factors.is_some_and(|f| f.len() < dims as usize / 2 || f.iter().any(|v| !(v.is_finite() && *v > 0.0))) {
            return Err(shape_err(OP, format!("RoPE factors must be {} finite values > 0", dims / 2)));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(shape_err(OP, format!("the RoPE scale must be finite and > 0, got {}", self.scale)));
        }
        Ok(dims)
    }
}

/// One dispatch over `n_tokens` fused qkv rows (`buffers.qkv`: [n_tokens, qkv_row] f32, each row
/// `pool.n_heads` q heads, then `n_kv_heads` k heads, then `n_kv_heads` v heads, as the qkv matmul
/// wrote them):
/// - every q and k head, in place: with `qk_norm`, `head / sqrt(mean(head²) + eps) * weight`
///   (as [`super::norm::head_norm`]); then RoPE by the token's position ([`HeadsRope`]; with
///   every dimension and nothing more, as [`super::rope::rope`]);
/// - every k head (roped) and v head: written to the pool at position `positions[t]` of the
///   sequence whose block-table row starts at `row_tables[t]`, f32 or quantized per (token, KV
///   head) to INT8, skipping a table index past `block_table`'s end or a block >= n_blocks (as
///   [`super::kv_write::write_paged`]; `pool.window` and `pool.max_len` play no part).
///
/// Shape contract: `pool` valid ([`PoolShape`]), n_tokens >= 1, head_dim even and <= 512, the
/// base finite and > 0, eps finite and >= 0, the norm weights [2, head_dim]; qkv a buffer of its
/// own (it is written), the pool's K and V two different buffers.
pub fn qkv_heads<'r>(
    ctx: &Context,
    buffers: &KvWriteBuffers<'_>,
    qk_norm: Option<QkNorm<'_>>,
    pool: &PoolShape,
    n_tokens: u32,
    rope: impl Into<HeadsRope<'r>>,
) -> Result<Kernel, GpuError> {
    let (b, rope) = (buffers, rope.into());
    let scale_base = check_write(ctx, OP, b, pool, n_tokens)?;
    let rot_dims = rope.check(pool.head_dim)?;
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
    words[8..].copy_from_slice(&turn_table_of(rope.base, rot_dims, rope.factors));
    let params = ctx.params_init("qkv_heads.params", bytemuck::cast_slice(&words));
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    let mut constants = vec![
        ("WG", QKV_HEADS_WG as f64),
        ("QK_NORM", flag(qk_norm.is_some())),
        ("NEOX", flag(rope.pairing == RopePairing::Neox)),
        ("INT8", flag(pool.dtype == KvDtype::Int8)),
    ];
    // Only where they differ from the defaults: the pipelines of a plain RoPE stay as they were.
    if rot_dims != pool.head_dim {
        constants.push(("ROT_HALF", (rot_dims / 2) as f64));
    }
    if rope.scale != 1.0 {
        constants.push(("ROPE_SCALE", rope.scale as f64));
    }
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
/// weights, eps) through [`super::norm::head_norm_cpu`], then RoPE on the q and k heads
/// ([`super::rope::rope_cpu`] for a plain one; else [`HeadsRope`]'s arithmetic in f64). Its pool
/// writes are [`super::kv_write::write_paged_cpu`]'s (or `write_paged_int8_cpu`'s) of the rows
/// this leaves. qkv: [positions.len(), qkv_row].
#[cfg(feature = "testing")]
pub fn qkv_heads_cpu<'r>(pool: &PoolShape, qkv: &mut [f32], qk_norm: Option<(&[f32], &[f32], f32)>, positions: &[u32], rope: impl Into<HeadsRope<'r>>) {
    use super::norm::{head_norm_cpu, HeadNormShape};
    use super::rope::{rope_cpu, RopeShape};
    let (n_tokens, rope) = (positions.len() as u32, rope.into());
    if let Some((q, k, eps)) = qk_norm {
        let heads = |first, n_heads| HeadNormShape { n_rows: n_tokens, row_stride: pool.qkv_row() as u32, first, n_heads, head_dim: pool.head_dim, eps };
        head_norm_cpu(qkv, q, &heads(0, pool.n_heads));
        head_norm_cpu(qkv, k, &heads(pool.out_row() as u32, pool.n_kv_heads));
    }
    if rope.is_plain(pool.head_dim) {
        return rope_cpu(&RopeShape::fused_qkv(pool, n_tokens, (rope.base, rope.pairing)), qkv, positions);
    }
    let (hd, row) = (pool.head_dim as usize, pool.qkv_row() as usize);
    let rot = rope.dims.unwrap_or(pool.head_dim) as usize;
    for (t, &pos) in positions.iter().enumerate() {
        for i in 0..rot / 2 {
            let factor = rope.factors.map_or(1.0, |f| f64::from(f[i]));
            let angle = pos as f64 * (rope.base as f64).powf(-2.0 * i as f64 / rot as f64) / factor;
            let (s, c) = angle.sin_cos();
            let (s, c) = (s * f64::from(rope.scale), c * f64::from(rope.scale));
            let (d0, d1) = rope.pairing.dims(i, rot);
            for h in 0..(pool.n_heads + pool.n_kv_heads) as usize {
                let (j0, j1) = (t * row + h * hd + d0, t * row + h * hd + d1);
                let (x0, x1) = (qkv[j0] as f64, qkv[j1] as f64);
                qkv[j0] = (x0 * c - x1 * s) as f32;
                qkv[j1] = (x0 * s + x1 * c) as f32;
            }
        }
    }
}
