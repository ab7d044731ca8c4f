//! Naive f64 CPU references of the attention kernels, over the same layouts (tests only).

use super::{check_pool, BatchRow};
use crate::gpu::ops::pool::PoolShape;
use crate::gpu::{shape_err, GpuError};
use crate::quant::kv_int8::dequantize_pool;

const OP: &str = "attention_cpu";

/// Reference of [`super::Attention`]: token t = 0..positions.len() attends keys 0..=positions[t]
/// (clamped to max_len - 1 like the kernels; with a window, only the last `pool.window` of them)
/// of the sequence whose block-table row starts at
/// `table_base`; keys whose table entry is missing or >= n_blocks are skipped. qkv: [n_tokens,
/// qkv_row]; k_pool/v_pool: f32 values in the pool's layout, whatever `pool.dtype` says (for an
/// INT8 pool, its dequantized values, or see [`attention_int8_cpu`]). Returns out: [n_tokens,
/// n_heads*head_dim].
pub fn attention_cpu(
    pool: &PoolShape,
    qkv: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
) -> Result<Vec<f32>, GpuError> {
    check_pool(OP, pool)?;
    let s = pool;
    let n_tokens = positions.len();
    let (hd, row, bs) = (s.head_dim as usize, s.qkv_row() as usize, s.block_size as usize);
    let pool_len = s.pool_len() as usize;
    if qkv.len() < n_tokens * row || k_pool.len() < pool_len || v_pool.len() < pool_len {
        return Err(shape_err(OP, "a CPU input slice is shorter than the shape needs"));
    }
    // Element offset of key j's head-0 row in its physical block, or None when unmapped.
    let key_base = |j: usize| -> Option<usize> {
        let block = *block_table.get((table_base as usize).checked_add(j / bs)?)? as usize;
        (block < s.n_blocks as usize).then(|| block * s.n_kv_heads as usize * bs * hd + (j % bs) * hd)
    };
    let group = s.group() as usize;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; n_tokens * s.out_row() as usize];
    let mut scores = Vec::new();
    for (t, &position) in positions.iter().enumerate() {
        let keys = position.min(s.max_len - 1) as usize + 1;
        let first = if s.window > 0 { keys.saturating_sub(s.window as usize) } else { 0 };
        let bases: Vec<usize> = (first..keys).filter_map(key_base).collect();
        for h in 0..s.n_heads as usize {
            let q = &qkv[t * row + h * hd..][..hd];
            let head_off = (h / group) * bs * hd;
            scores.clear();
            for &b in &bases {
                let k = &k_pool[b + head_off..][..hd];
                let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                let score = dot * scale;
                let cap = f64::from(s.softcap);
                scores.push(if cap > 0.0 { cap * (score / cap).tanh() } else { score });
            }
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(t * s.n_heads as usize + h) * hd..][..hd];
            for (d, slot) in o.iter_mut().enumerate() {
                let sum: f64 = weights.iter().zip(&bases).map(|(w, &b)| w * v_pool[b + head_off + d] as f64).sum();
                *slot = (sum / total) as f32;
            }
        }
    }
    Ok(out)
}

/// [`attention_cpu`] over INT8 pools: `k_words`, `v_words` are the words of two
/// [`crate::quant::kv_int8::Int8Layout`] buffers of the pool's shape, dequantized exactly as the
/// kernels do (`code · scale`).
pub fn attention_int8_cpu(
    pool: &PoolShape,
    qkv: &[f32],
    k_words: &[u32],
    v_words: &[u32],
    positions: &[u32],
    block_table: &[u32],
    table_base: u32,
) -> Result<Vec<f32>, GpuError> {
    let layout = pool.int8_layout(OP)?;
    let k_pool = dequantize_pool(&layout, k_words).map_err(|e| shape_err(OP, e.to_string()))?;
    let v_pool = dequantize_pool(&layout, v_words).map_err(|e| shape_err(OP, e.to_string()))?;
    attention_cpu(pool, qkv, &k_pool, &v_pool, positions, block_table, table_base)
}

/// Reference of [`super::AttentionBatch`]: row r is the single-token attention of
/// [`attention_cpu`] for its sequence (table row at `table_base`, keys 0..kv_len); a row of
/// kv_len 0 is zeros. qkv: [rows.len(), qkv_row]; returns [rows.len(), n_heads*head_dim].
/// k_pool/v_pool are f32 values as in [`attention_cpu`].
pub fn attention_batch_cpu(
    pool: &PoolShape,
    qkv: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    block_table: &[u32],
    rows: &[BatchRow],
) -> Result<Vec<f32>, GpuError> {
    check_pool(OP, pool)?;
    let (qkv_row, out_row) = (pool.qkv_row() as usize, pool.out_row() as usize);
    if qkv.len() < rows.len() * qkv_row {
        return Err(shape_err(OP, "the CPU qkv slice is shorter than the rows need"));
    }
    let mut out = vec![0f32; rows.len() * out_row];
    for (r, row) in rows.iter().enumerate() {
        if row.kv_len == 0 {
            continue;
        }
        if row.kv_len > pool.max_len {
            return Err(shape_err(OP, format!("row {r}: kv_len {} is over max_len {}", row.kv_len, pool.max_len)));
        }
        let q = &qkv[r * qkv_row..][..qkv_row];
        let got = attention_cpu(pool, q, k_pool, v_pool, &[row.kv_len - 1], block_table, row.table_base)?;
        out[r * out_row..][..out_row].copy_from_slice(&got);
    }
    Ok(out)
}
