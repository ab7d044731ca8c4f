//! The forward pass on the CPU: the model's layer plan ([`crate::model::Plan`]) interpreted op by
//! op over the rows of one step, with the K/V in a KV cache in CPU memory
//! ([`KvCache::new_host`]). Rows may be consecutive positions of one sequence (a prefill chunk)
//! or rows of many sequences (a batched step): each row reads its own sequence's block table,
//! so one code path serves both.

use crate::error::EngineError;
use crate::kv::{KvCache, SeqId};
use crate::model::arch::Attend;
use crate::model::{ModelConfig, ModelError, Op, Proj};
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

/// The activations of a step's rows as they pass through a block (`[rows][width]` each).
struct Rows {
    /// The residual stream.
    x: Vec<f32>,
    /// A normed copy of x, and its int8 blocks when the matmuls take int8 activations.
    h: Vec<f32>,
    hq: Option<Int8Rows>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// The attention output.
    att: Vec<f32>,
    /// The FFN's gate values (then its activation) and up values.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// What the next residual adds.
    delta: Vec<f32>,
}

/// Runs `rows` (their K/V slots appended to their sequences in `kv`, tokens below the
/// vocabulary) through the model's layer plan, writing their K/V into `kv`'s pool, and returns
/// the logits of the rows `logit_rows` names (indices into `rows`), `[logit_rows.len()][vocab]`.
pub fn forward(model: &HostModel, kv: &KvCache, rows: &[HostRow], logit_rows: &[u32]) -> Result<Vec<f32>, EngineError> {
    let c = &model.config;
    let (n, hidden) = (rows.len(), c.hidden as usize);
    check_step(c, kv, rows, logit_rows)?;
    let plan = &model.plan;
    let mut x = vec![0f32; n * hidden];
    for (r, xr) in rows.iter().zip(x.chunks_mut(hidden)) {
        model.embd.row_into(r.token as usize, xr);
        if plan.embedding_scale != 1.0 {
            xr.iter_mut().for_each(|v| *v *= plan.embedding_scale);
        }
    }
    let (q_width, kv_width, ffn) = (c.q_width() as usize, (c.n_kv_heads * c.head_dim) as usize, c.ffn as usize);
    let zeros = |width: usize| vec![0f32; n * width];
    let mut a = Rows {
        x,
        h: zeros(hidden),
        hq: None,
        q: zeros(q_width),
        k: zeros(kv_width),
        v: zeros(kv_width),
        att: zeros(q_width),
        gate: zeros(ffn),
        up: zeros(ffn),
        delta: zeros(hidden),
    };
    for (l, ops) in plan.layers.iter().enumerate() {
        for op in ops {
            run_op(model, (kv, l, rows), op, &mut a)?;
        }
    }
    let (eps, m) = (plan.rms_eps, logit_rows.len());
    let mut last = vec![0f32; m * hidden];
    for (i, &r) in logit_rows.iter().enumerate() {
        kernels::rms_norm(&a.x[r as usize * hidden..(r as usize + 1) * hidden], &model.output_norm, eps, &mut last[i * hidden..(i + 1) * hidden]);
    }
    let out_w = model.output.as_ref().unwrap_or(&model.embd);
    let mut logits = vec![0f32; m * out_w.rows];
    matmul(out_w, (&last, int8_rows(model, &last, m).as_ref()), m, &mut logits);
    if let Some(c) = plan.final_softcap {
        kernels::softcap(&mut logits, c);
    }
    Ok(logits)
}

/// Refuses a step the forward pass cannot run: a KV cache on a GPU, a token outside the
/// vocabulary, a logit row outside the step, a row past its sequence's appended slots.
fn check_step(c: &ModelConfig, kv: &KvCache, rows: &[HostRow], logit_rows: &[u32]) -> Result<(), EngineError> {
    let n = rows.len();
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
    Ok(())
}

/// One op of layer `l`'s plan over the step's rows ([`crate::model::Op`]).
fn run_op(model: &HostModel, (kv, l, rows): (&KvCache, usize, &[HostRow]), op: &Op, a: &mut Rows) -> Result<(), EngineError> {
    let (c, layer, n) = (&model.config, &model.layers[l], rows.len());
    let eps = model.plan.rms_eps;
    match *op {
        Op::Norm(role) => {
            norm_rows(&a.x, layer.vector(role)?, eps, &mut a.h);
            a.hq = int8_rows(model, &a.h, n);
        }
        Op::Matmul { proj, weights } => {
            // h was quantized by its norm; the attention output and the FFN activation here.
            let quantized;
            let (input, input_q, outputs): (&[f32], Option<&Int8Rows>, Vec<&mut Vec<f32>>) = match proj {
                Proj::Qkv => (&a.h, a.hq.as_ref(), vec![&mut a.q, &mut a.k, &mut a.v]),
                Proj::GateUp => (&a.h, a.hq.as_ref(), vec![&mut a.gate, &mut a.up]),
                Proj::Out => {
                    quantized = int8_rows(model, &a.att, n);
                    (&a.att, quantized.as_ref(), vec![&mut a.delta])
                }
                Proj::Down => {
                    quantized = int8_rows(model, &a.gate, n);
                    (&a.gate, quantized.as_ref(), vec![&mut a.delta])
                }
            };
            match (outputs.len(), weights) {
                (n_out, _) if n_out == weights.len() => {
                    for (&role, out) in weights.iter().zip(outputs) {
                        matmul(layer.matrix(role)?, (input, input_q), n, out);
                    }
                }
                // One fused tensor: its rows stack the outputs', split row by row.
                (_, &[role]) => {
                    let w = layer.matrix(role)?;
                    let mut fused = vec![0f32; n * w.rows];
                    matmul(w, (input, input_q), n, &mut fused);
                    let widths: Vec<usize> = outputs.iter().map(|o| o.len() / n).collect();
                    if widths.iter().sum::<usize>() != w.rows {
                        return Err(ModelError::Format(format!("{role:?} has {} rows, not the {widths:?} of the {proj:?} projection", w.rows)).into());
                    }
                    let mut outputs = outputs;
                    for (r, row) in fused.chunks(w.rows).enumerate() {
                        let mut at = 0;
                        for (out, &width) in outputs.iter_mut().zip(&widths) {
                            out[r * width..(r + 1) * width].copy_from_slice(&row[at..at + width]);
                            at += width;
                        }
                    }
                }
                _ => return Err(ModelError::Unsupported(format!("on the CPU backend, the {proj:?} projection over {weights:?}")).into()),
            }
        }
        Op::Bias { proj: Proj::Qkv, biases: &[qb, kb, vb] } => {
            kernels::add_bias(&mut a.q, layer.vector(qb)?);
            kernels::add_bias(&mut a.k, layer.vector(kb)?);
            kernels::add_bias(&mut a.v, layer.vector(vb)?);
        }
        Op::Bias { proj, biases } => return Err(ModelError::Unsupported(format!("on the CPU backend, biases {biases:?} on the {proj:?} projection")).into()),
        Op::HeadNorm { q, k } => {
            kernels::rms_norm_pieces(&mut a.q, layer.vector(q)?, eps);
            kernels::rms_norm_pieces(&mut a.k, layer.vector(k)?, eps);
        }
        Op::Rope(rope) => {
            let hd = c.head_dim as usize;
            let factors =
                if rope.factors { Some(c.rope_factors.as_deref().ok_or_else(|| ModelError::Format("RoPE factors the model lacks".into()))?) } else { None };
            let (q_width, kv_width) = (a.q.len() / n, a.k.len() / n);
            for (i, r) in rows.iter().enumerate() {
                kernels::rope(&mut a.q[i * q_width..(i + 1) * q_width], hd, r.position, &rope, factors);
                kernels::rope(&mut a.k[i * kv_width..(i + 1) * kv_width], hd, r.position, &rope, factors);
            }
        }
        Op::Attention(attend) => attention(kv, l, (rows, &a.q, &a.k, &a.v), (c, attend), &mut a.att)?,
        Op::Residual { post_norm } => residual(&mut a.x, &mut a.delta, post_norm.map(|role| layer.vector(role)).transpose()?, eps),
        Op::Glu(activation) => {
            for (g, u) in a.gate.iter_mut().zip(&a.up) {
                *g = activation.apply(f64::from(*g)) as f32 * u;
            }
        }
    }
    Ok(())
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

/// Writes the rows' K/V into layer `l`'s pool, then runs their attention over it (over the last
/// `window` positions of each row's sequence, where there is one) into `out`.
fn attention(
    kv: &KvCache,
    l: usize,
    (rows, q, k, v): (&[HostRow], &[f32], &[f32], &[f32]),
    (c, attend): (&ModelConfig, Attend),
    out: &mut [f32],
) -> Result<(), EngineError> {
    let window = attend.window;
    let (pool, buffer, local) = kv.layer_host(l);
    let host = pool.host.as_ref().ok_or_else(|| ModelError::Format("the KV pool is not in CPU memory".into()))?;
    let view = PoolView {
        n_kv_heads: pool.n_kv_heads as usize,
        block_size: pool.block_size as usize,
        head_dim: pool.head_dim as usize,
        int8_scales_at: pool.int8_layout().map(|layout| Int8Layout::data_words(&layout) as usize),
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
    let attn_rows: Vec<AttnRow<'_>> = rows
        .iter()
        .zip(&tables)
        .map(|(r, table)| AttnRow { table, first: window.map_or(0, |w| (r.position + 1).saturating_sub(w)), last: r.position })
        .collect();
    kernels::attention(&view, (&k_words, &v_words), &attn_rows, q, (c.n_heads as usize, attend.softcap), out);
    Ok(())
}
