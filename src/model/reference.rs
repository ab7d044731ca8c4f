//! A naive CPU forward pass (float64 activations, weights dequantized from the file), with no KV
//! cache at all: every call recomputes the whole sequence. It is the "no cache" side of the
//! equivalence tests (recompute = contiguous = paged) on the small synthetic models; it mirrors
//! the team's numpy reference (`ref_llama.py`).

use crate::gguf::{GgmlType, Gguf};
use crate::quant::dequantize;

use super::{ModelConfig, ModelError};

/// The named tensor as f64, whatever its (supported) type.
fn dequant(gguf: &Gguf<'_>, name: &str) -> Result<Vec<f64>, ModelError> {
    let (info, data) = gguf.require_tensor(name, &GgmlType::SUPPORTED)?;
    let mut out = vec![0f32; info.n_elements() as usize];
    dequantize(info.ggml_type, data, &mut out).map_err(|e| ModelError::Format(format!("tensor {name}: {e}")))?;
    Ok(out.into_iter().map(f64::from).collect())
}

/// y[r] = W x for W: [rows, cols] row-major.
fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}

/// llama's NORM rotary pairing: (x[2i], x[2i+1]) within each head.
fn rope(x: &mut [f64], n_heads: usize, head_dim: usize, pos: usize, base: f64) {
    for h in 0..n_heads {
        for i in 0..head_dim / 2 {
            let theta = base.powf(-2.0 * i as f64 / head_dim as f64) * pos as f64;
            let (s, c) = theta.sin_cos();
            let a = x[h * head_dim + 2 * i];
            let b = x[h * head_dim + 2 * i + 1];
            x[h * head_dim + 2 * i] = a * c - b * s;
            x[h * head_dim + 2 * i + 1] = a * s + b * c;
        }
    }
}

/// Logits (`[ids.len()][vocab]`) for every position of `ids`, recomputed from scratch.
pub fn forward_cpu(gguf: &Gguf<'_>, cfg: &ModelConfig, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
    let (hidden, hd) = (cfg.hidden as usize, cfg.head_dim as usize);
    let (nq, nkv, ffn, vocab) = (cfg.n_heads as usize, cfg.n_kv_heads as usize, cfg.ffn as usize, cfg.vocab as usize);
    let eps = cfg.rms_eps as f64;
    let embd = dequant(gguf, "token_embd.weight")?;
    let out_w = if gguf.tensor("output.weight").is_some() { dequant(gguf, "output.weight")? } else { embd.clone() };
    let mut x: Vec<Vec<f64>> = ids.iter().map(|&t| embd[t as usize * hidden..(t as usize + 1) * hidden].to_vec()).collect();
    let group = nq / nkv;
    for l in 0..cfg.n_layers {
        let w = |s: &str| dequant(gguf, &format!("blk.{l}.{s}"));
        let (attn_norm, wq, wk, wv, wo) = (w("attn_norm.weight")?, w("attn_q.weight")?, w("attn_k.weight")?, w("attn_v.weight")?, w("attn_output.weight")?);
        let (ffn_norm, wg, wu, wd) = (w("ffn_norm.weight")?, w("ffn_gate.weight")?, w("ffn_up.weight")?, w("ffn_down.weight")?);
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, xt) in x.iter().enumerate() {
            let h = rms_norm(xt, &attn_norm, eps);
            let mut q = matvec(&wq, &h, nq * hd);
            let mut k = matvec(&wk, &h, nkv * hd);
            rope(&mut q, nq, hd, pos, cfg.rope_base as f64);
            rope(&mut k, nkv, hd, pos, cfg.rope_base as f64);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&wv, &h, nkv * hd));
        }
        for t in 0..x.len() {
            let mut att = vec![0f64; nq * hd];
            for head in 0..nq {
                let kvh = head / group;
                let q = &qs[t][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| q.iter().zip(&ks[s][kvh * hd..(kvh + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, p) in e.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += p / z * vs[s][kvh * hd + d];
                    }
                }
            }
            let o = matvec(&wo, &att, hidden);
            x[t].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(&x[t], &ffn_norm, eps);
            let g = matvec(&wg, &h, ffn);
            let u = matvec(&wu, &h, ffn);
            let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let d = matvec(&wd, &act, hidden);
            x[t].iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    let out_norm = dequant(gguf, "output_norm.weight")?;
    Ok(x
        .iter()
        .map(|xt| matvec(&out_w, &rms_norm(xt, &out_norm, eps), vocab).into_iter().map(|v| v as f32).collect())
        .collect())
}
