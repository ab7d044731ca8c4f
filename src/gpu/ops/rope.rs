//! Rotary position embedding (llama's NORM pairing or NEOX pairing) on the fused q/k rows.

use super::pool::PoolShape;
use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::model::RopePairing;

const OP: &str = "rope";

const ROPE_WG: u64 = 64;
/// Pairs the shader's turn table holds (`array<vec4<u32>, 128>`, two pairs per vec4).
const MAX_PAIRS: u32 = 256;
/// u32 words of the parameters: 4 header words, then the turn table.
const PARAM_WORDS: usize = 4 + TURN_TABLE_WORDS;

/// Which rows and heads a [`rope`] rotates, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeShape {
    pub n_tokens: u32,
    /// f32 elements per token row of x.
    pub row_stride: u32,
    /// Heads rotated: the first `n_heads` heads of each row.
    pub n_heads: u32,
    /// Even, 2..=512.
    pub head_dim: u32,
    /// The frequency base (rope_theta), finite and > 0.
    pub base: f32,
    /// Which dimensions pair up.
    pub pairing: RopePairing,
}

impl RopeShape {
    /// The q and k heads of `n_tokens` fused qkv rows over `pool`'s heads: q and k heads are
    /// adjacent, the v heads after them stay as they are.
    pub fn fused_qkv(pool: &PoolShape, n_tokens: u32, (base, pairing): (f32, RopePairing)) -> RopeShape {
        RopeShape { n_tokens, row_stride: pool.qkv_row() as u32, n_heads: pool.n_heads + pool.n_kv_heads, head_dim: pool.head_dim, base, pairing }
    }

    fn check(&self) -> Result<(), GpuError> {
        let RopeShape { n_tokens, row_stride, n_heads, head_dim, base, .. } = *self;
        if n_tokens == 0 || n_heads == 0 {
            return Err(shape_err(OP, format!("n_tokens ({n_tokens}) and n_heads ({n_heads}) must be at least 1")));
        }
        check_rope(OP, head_dim, base)?;
        if n_heads as u64 * head_dim as u64 > row_stride as u64 {
            return Err(shape_err(OP, format!("{n_heads} heads of {head_dim} do not fit in a row of {row_stride} floats")));
        }
        Ok(())
    }
}

/// What every RoPE kernel needs of its heads and base: head_dim even and in 2..=512 (the turn
/// table's size), the base finite and > 0.
pub(super) fn check_rope(op: &'static str, head_dim: u32, base: f32) -> Result<(), GpuError> {
    if head_dim == 0 || head_dim % 2 != 0 || head_dim / 2 > MAX_PAIRS {
        return Err(shape_err(op, format!("head_dim must be even and in 2..={}, got {head_dim}", MAX_PAIRS * 2)));
    }
    if !(base.is_finite() && base > 0.0) {
        return Err(shape_err(op, format!("base must be finite and > 0, got {base}")));
    }
    Ok(())
}

/// u32 words of rope_common.wgsl's turn table (`array<vec4<u32>, 128>`).
pub(super) const TURN_TABLE_WORDS: usize = MAX_PAIRS as usize * 2;

/// rope_common.wgsl's turn table for `base` and `head_dim` (checked by [`check_rope`]): pair i's
/// (fraction, remainder bits) at words 2i, 2i + 1; the pairs past head_dim / 2 are 0.
pub(super) fn turn_table(base: f32, head_dim: u32) -> [u32; TURN_TABLE_WORDS] {
    turn_table_of(base, head_dim, None)
}

/// [`turn_table`] over the first `dims` dimensions (theta_i = base^(-2i/dims)), each pair's
/// theta divided by its entry of `factors` (`[dims / 2]`, RoPE frequency factors).
pub(super) fn turn_table_of(base: f32, dims: u32, factors: Option<&[f32]>) -> [u32; TURN_TABLE_WORDS] {
    let mut words = [0u32; TURN_TABLE_WORDS];
    for pair in 0..dims / 2 {
        let factor = factors.map_or(1.0, |f| f64::from(f[pair as usize]));
        let (fraction, remainder) = turns_per_position(base, dims, pair, factor);
        words[pair as usize * 2] = fraction;
        words[pair as usize * 2 + 1] = remainder.to_bits();
    }
    words
}

/// Rotates, in place, the first `shape.n_heads` heads of each token row by the token's position.
/// x: [n_tokens, row_stride] f32; head h of a row is columns `h*head_dim .. (h+1)*head_dim`.
/// positions: [n_tokens] u32 absolute positions, read when the kernel runs, so a decode step
/// rewrites this buffer and records the same kernel again; any start position works.
/// Pairing ([`RopePairing`], as the file's converted q/k weights expect): pair i within each head
/// rotates by pos * base^(-2i/head_dim).
pub fn rope(ctx: &Context, x: &wgpu::Buffer, positions: &wgpu::Buffer, shape: &RopeShape) -> Result<Kernel, GpuError> {
    shape.check()?;
    let RopeShape { n_tokens, row_stride, n_heads, head_dim, base, pairing } = *shape;
    check_size(OP, "x", x, n_tokens as u64 * row_stride as u64 * 4)?;
    check_size(OP, "positions", positions, n_tokens as u64 * 4)?;
    check_binding(ctx, OP, "x", x.size())?;
    check_binding(ctx, OP, "positions", positions.size())?;

    let mut words = vec![0u32; PARAM_WORDS];
    words[..4].copy_from_slice(&[n_tokens, row_stride, n_heads, head_dim]);
    words[4..].copy_from_slice(&turn_table(base, head_dim));
    let params = ctx.params_init("rope.params", bytemuck::cast_slice(&words));
    let neox = if pairing == RopePairing::Neox { 1.0 } else { 0.0 };
    let pipeline = ctx.pipeline("rope", "main", &[("WG", ROPE_WG as f64), ("NEOX", neox)])?;
    let items = n_tokens as u64 * (head_dim / 2) as u64;
    let kernel = Kernel::new(ctx, OP, pipeline, &[whole(x), whole(positions), whole(&params)], grid(ctx, items, ROPE_WG), None);
    Ok(kernel.owning(params))
}

/// theta_pair / 2π (turns per position) modulo 1, split into a 0.32 fixed-point u32 and the f32
/// remainder it misses, computed in f64. The shader multiplies the u32 by the position with
/// wrapping arithmetic, which discards whole turns exactly.
fn turns_per_position(base: f32, head_dim: u32, pair: u32, factor: f64) -> (u32, f32) {
    let theta = (base as f64).powf(-2.0 * pair as f64 / head_dim as f64) / factor;
    let turns = theta / std::f64::consts::TAU;
    let fraction = turns - turns.floor();
    let scaled = (fraction * 4_294_967_296.0).round();
    let remainder = fraction - scaled / 4_294_967_296.0;
    // scaled may round up to 2^32, i.e. one whole turn: wrapping to 0 is exact.
    ((scaled as u64 & 0xffff_ffff) as u32, remainder as f32)
}

/// CPU reference of [`rope`], in f64 like ref_llama.py. x: [n_tokens, row_stride], rotated in
/// place; positions: at least n_tokens.
#[cfg(feature = "testing")]
pub fn rope_cpu(shape: &RopeShape, x: &mut [f32], positions: &[u32]) {
    let (row_stride, n_heads, head_dim) = (shape.row_stride as usize, shape.n_heads as usize, shape.head_dim as usize);
    for (t, &pos) in positions.iter().enumerate().take(shape.n_tokens as usize) {
        for i in 0..head_dim / 2 {
            let theta = (shape.base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let angle = pos as f64 * theta;
            let (s, c) = angle.sin_cos();
            let (d0, d1) = shape.pairing.dims(i, head_dim);
            for h in 0..n_heads {
                let (j0, j1) = (t * row_stride + h * head_dim + d0, t * row_stride + h * head_dim + d1);
                let (x0, x1) = (x[j0] as f64, x[j1] as f64);
                x[j0] = (x0 * c - x1 * s) as f32;
                x[j1] = (x0 * s + x1 * c) as f32;
            }
        }
    }
}
