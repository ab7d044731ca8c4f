//! The forward pass on the CPU: the graph of [`crate::model::graph`] (llama and Gemma 3, every
//! feature of [`ModelConfig`]) over the rows of one step, with the K/V in a KV cache in CPU
//! memory ([`KvCache::new_host`]). Rows may be consecutive positions of one sequence (a prefill
//! chunk) or rows of many sequences (a batched step): each row reads its own sequence's block
//! table, so one code path serves both.

use crate::error::EngineError;
use crate::kv::{KvCache, SeqId};
use crate::model::{ModelConfig, ModelError};
use crate::quant::kv_int8::Int8Layout;

use super::kernels::{self, AttnRow, PoolView, QMatrix};
use super::qdot::{Acts, Int8Rows};
use super::weights::HostModel;

/// One row of a step on the CPU: a token at a position of a sequence.
#[derive(Clone, Copy, Debug)]
pub struct HostRow {
    pub token: u32,
    pub position: u32,
    pub seq: SeqId,
}

/// Runs `rows` (their K/V slots appended to their sequences in `kv`, tokens below the
/// vocabulary) through the model, writing their K/V into `kv`'s pool, and returns the logits
/// of the rows `logit_rows` names (indices into `rows`), `[logit_rows.len()][vocab]`.
pub fn forward(model: &HostModel, kv: &KvCache, rows: &[HostRow], logit_rows: &[u32]) -> Result<Vec<f32>, EngineError> {
    let c = &model.config;
    let (n, hidden, hd) = (rows.len(), c.hidden as usize, c.head_dim as usize);
    let (nq, nkv) = (c.n_heads as usize, c.n_kv_heads as usize);
    if !kv.is_host() {
        return Err(ModelError::Format("the CPU forward pass needs a KV cache in CPU memory".into()).into());
    }
    if let Some(r) = rows.iter().find(|r| r.token >= c.vocab) {
        return Err(ModelError::Format(format!("token {} is outside the vocabulary of {}", r.token, c.vocab)).into());
    }
    if let Some(&i) = logit_rows.iter().find(|&&i| i as usize >= n) {
        return Err(ModelError::Format(format!("logit row {i} of a step of {n} rows")).into());
    }
    for r in rows {
        let len = kv.len(r.seq)?;
        if r.position >= len {
            return Err(ModelError::Format(format!("row at position {} of a sequence of {len} appended slots", r.position)).into());
        }
    }
    let eps = c.rms_eps;
    let mut x = vec![0f32; n * hidden];
    for (r, xr) in rows.iter().zip(x.chunks_mut(hidden)) {
        model.embd.row_into(r.token as usize, xr);
        if c.embedding_scale != 1.0 {
            xr.iter_mut().for_each(|v| *v *= c.embedding_scale);
        }
    }
    let (q_width, kv_width) = (nq * hd, nkv * hd);
    let (mut h, mut q, mut k, mut v) = (vec![0f32; n * hidden], vec![0f32; n * q_width], vec![0f32; n * kv_width], vec![0f32; n * kv_width]);
    let (mut att, mut o) = (vec![0f32; n * q_width], vec![0f32; n * hidden]);
    let ffn = c.ffn as usize;
    let (mut gate, mut up) = (vec![0f32; n * ffn], vec![0f32; n * ffn]);
    for (l, layer) in model.layers.iter().enumerate() {
        norm_rows(&x, &layer.attn_norm, eps, &mut h);
        let hq = int8_rows(model, &h, n);
        matmul(&layer.wq, (&h, hq.as_ref()), n, &mut q);
        matmul(&layer.wk, (&h, hq.as_ref()), n, &mut k);
        matmul(&layer.wv, (&h, hq.as_ref()), n, &mut v);
        if let Some((qn, kn)) = &layer.qk_norm {
            kernels::rms_norm_pieces(&mut q, qn, eps);
            kernels::rms_norm_pieces(&mut k, kn, eps);
        }
        let rope = (c.layer_rope_base(l as u32), c.rope_pairing);
        for (i, r) in rows.iter().enumerate() {
            kernels::rope(&mut q[i * q_width..(i + 1) * q_width], hd, r.position, rope);
            kernels::rope(&mut k[i * kv_width..(i + 1) * kv_width], hd, r.position, rope);
        }
        attend(kv, l, (rows, &q, &k, &v), c, &mut att)?;
        matmul(&layer.wo, (&att, int8_rows(model, &att, n).as_ref()), n, &mut o);
        residual(&mut x, &mut o, layer.post_attention_norm.as_deref(), eps);

        norm_rows(&x, &layer.ffn_norm, eps, &mut h);
        let hq = int8_rows(model, &h, n);
        matmul(&layer.gate, (&h, hq.as_ref()), n, &mut gate);
        matmul(&layer.up, (&h, hq.as_ref()), n, &mut up);
        for (g, u) in gate.iter_mut().zip(&up) {
            *g = c.activation.apply(f64::from(*g)) as f32 * u;
        }
        matmul(&layer.down, (&gate, int8_rows(model, &gate, n).as_ref()), n, &mut o);
        residual(&mut x, &mut o, layer.post_ffw_norm.as_deref(), eps);
    }
    let m = logit_rows.len();
    let mut last = vec![0f32; m * hidden];
    for (i, &r) in logit_rows.iter().enumerate() {
        kernels::rms_norm(&x[r as usize * hidden..(r as usize + 1) * hidden], &model.output_norm, eps, &mut last[i * hidden..(i + 1) * hidden]);
    }
    let out_w = model.output.as_ref().unwrap_or(&model.embd);
    let mut logits = vec![0f32; m * out_w.rows];
    matmul(out_w, (&last, int8_rows(model, &last, m).as_ref()), m, &mut logits);
    Ok(logits)
}

/// The `n` rows of `x` quantized to int8 blocks once for the matmuls that read them, when the
/// model multiplies with int8 activations (`None` otherwise, or for rows that are not whole
/// 32-value blocks, which stay f32).
fn int8_rows(model: &HostModel, x: &[f32], n: usize) -> Option<Int8Rows> {
    if model.int8_activations {
        Int8Rows::quantize(x, n)
    } else {
        None
    }
}

/// [`kernels::matmul_acts`] of `w` with the rows `x` (`[n][cols]`), through their int8 form
/// `xq` when there is one.
fn matmul(w: &QMatrix, (x, xq): (&[f32], Option<&Int8Rows>), n: usize, out: &mut [f32]) {
    let acts = match xq {
        Some(q) => Acts::Int8(q, x),
        None => Acts::F32(x),
    };
    kernels::matmul_acts(w, acts, n, out)
}

/// `out[row] = rms_norm(x[row]) · w` for every row.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks(w.len()).zip(out.chunks_mut(w.len())) {
        kernels::rms_norm(xr, w, eps, or);
    }
}

/// `x += delta`, through the post-norm `post` when the model has one.
fn residual(x: &mut [f32], delta: &mut [f32], post: Option<&[f32]>, eps: f32) {
    if let Some(w) = post {
        kernels::rms_norm_pieces(delta, w, eps);
    }
    x.iter_mut().zip(delta.iter()).for_each(|(a, b)| *a += b);
}

/// Writes the rows' K/V into layer `l`'s pool, then runs their attention over it into `out`.
fn attend(kv: &KvCache, l: usize, (rows, q, k, v): (&[HostRow], &[f32], &[f32], &[f32]), c: &ModelConfig, out: &mut [f32]) -> Result<(), EngineError> {
    let (pool, buffer, local) = kv.layer_host(l);
    let host = pool.host.as_ref().ok_or_else(|| ModelError::Format("the KV pool is not in CPU memory".into()))?;
    let view = PoolView {
        n_kv_heads: pool.n_kv_heads as usize,
        block_size: pool.block_size as usize,
        head_dim: pool.head_dim as usize,
        int8_scales_at: match pool.int8_layout() {
            Some(layout) => Some(Int8Layout::data_words(&layout) as usize),
            None => None,
        },
    };
    let (hd, nkv, bs) = (view.head_dim, view.n_kv_heads, view.block_size);
    let tables: Vec<&[u32]> = rows.iter().map(|r| if local { kv.local_blocks(r.seq) } else { kv.blocks(r.seq) }).collect::<Result<_, _>>()?;
    let (mut k_words, mut v_words) = host.lock(buffer);
    for (i, (r, table)) in rows.iter().zip(&tables).enumerate() {
        let block = table[r.position as usize / bs];
        for h in 0..nkv {
            let at = (block, h, r.position as usize % bs);
            view.write(&mut k_words, at, &k[(i * nkv + h) * hd..(i * nkv + h + 1) * hd]);
            view.write(&mut v_words, at, &v[(i * nkv + h) * hd..(i * nkv + h + 1) * hd]);
        }
    }
    let window = kv.window(l);
    let attn_rows: Vec<AttnRow<'_>> = rows
        .iter()
        .zip(&tables)
        .map(|(r, table)| AttnRow { table, first: window.map_or(0, |w| (r.position + 1).saturating_sub(w)), last: r.position })
        .collect();
    kernels::attention(&view, (&k_words, &v_words), &attn_rows, q, c.n_heads as usize, out);
    Ok(())
}
