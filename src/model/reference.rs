//! A naive CPU forward pass (float64 activations, weights dequantized from the file), with no KV
//! cache at all: every call recomputes the whole sequence. It is the "no cache" side of the
//! equivalence tests (recompute = contiguous = paged) on the small synthetic models, and the
//! ground truth of the teacher-forced tests on real weights; it mirrors the team's numpy
//! references (`ref_llama.py`, `ref_gemma3.py`): every feature of [`ModelConfig`] (Gemma 3's QK
//! norm, post-norms, GELU, embedding scale, NEOX RoPE, per-layer bases and windows) included.
//!
//! Fast enough for a real model (SmolLM2-135M, ~100 positions in a few seconds) without giving up
//! float64: each layer's matrices are dequantized once per call (to f32, which holds every
//! dequantized value exactly) and applied to all positions at once, row by row, so a weight row
//! is read once per call and not once per position; dot products run in f64 with four
//! accumulators; the rows of a matrix are shared among the machine's cores (natively; the
//! browser has one thread); and the output projection, the largest matrix, runs only for the
//! positions whose logits are asked for.

use crate::gguf::{GgmlType, Gguf};
use crate::quant::{dequantize, WeightType};

use super::{Role, RopePairing, TensorTable};

use super::{ModelConfig, ModelError};

/// What the recompute's matmuls multiply the weights with: the exact activations, or what the
/// GPU's int8 activations (`MatmulConfig::int8_activations`) make of them, the yardstick of how
/// far int8 rounding alone moves the logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activations {
    /// The activations themselves.
    F32,
    /// For Q4_1 and Q8_0 weights, the activations quantized per 32-value block as
    /// `shaders/quantize_common.wgsl` does (from their f32 value), Q4_1's minimum times the exact
    /// sum of the block; every other type multiplies the activations themselves.
    Int8,
}

/// A weight matrix `[rows, cols]` row-major (GGUF `ne0 = cols`), dequantized.
struct Matrix {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    /// The kernels multiply this type with int8 activations when asked to (Q4_1, Q8_0).
    int8_body: bool,
    /// Q4_1's minimum of each 32-value block, `[rows][cols / 32]` (empty for other types).
    mins: Vec<f32>,
}

impl Matrix {
    fn row(&self, r: usize) -> &[f32] {
        &self.values[r * self.cols..(r + 1) * self.cols]
    }
}

/// A tensor's values as f32 (exact: every supported block format dequantizes to f32 values).
fn dequant(gguf: &Gguf<'_>, name: &str) -> Result<Matrix, ModelError> {
    let info = gguf.require_tensor(name, &GgmlType::SUPPORTED)?;
    let data = gguf.read_tensor(info)?;
    let n = info.dims.iter().product::<u64>() as usize;
    let cols = info.dims.first().copied().unwrap_or(1) as usize;
    let mut values = vec![0f32; n];
    dequantize(info.ggml_type, &data, &mut values).map_err(|e| ModelError::Format(format!("tensor {name}: {e}")))?;
    // The types whose GPU matmul bodies take int8 activations (`Layout::has_int8_path`).
    let int8_body = WeightType::of(info.ggml_type).is_some_and(|row| row.gpu.int8_body());
    let mins = if info.ggml_type == GgmlType::Q4_1 {
        data.chunks_exact(crate::quant::Q4_1_BLOCK_BYTES).map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32()).collect()
    } else {
        Vec::new()
    };
    Ok(Matrix { values, rows: n / cols.max(1), cols, int8_body, mins })
}

/// `x` as the int8 kernels see it: each 32-value block quantized from its f32 value as
/// `shaders/quantize_common.wgsl` does (d = max|x| / 127, q = round(x / d)) and dequantized, and
/// per block the exact sum minus the sum of the dequantized values (what Q4_1's minimum
/// multiplies on top of the dequantized values).
fn int8_view(x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut view = Vec::with_capacity(x.len());
    let mut corrections = Vec::with_capacity(x.len() / 32);
    for block in x.chunks(32) {
        let v: Vec<f32> = block.iter().map(|&v| v as f32).collect();
        let d = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let deq: Vec<f64> = v.iter().map(|&x| f64::from(d) * f64::from((x * inv).round_ties_even())).collect();
        corrections.push(v.iter().map(|&x| f64::from(x)).sum::<f64>() - deq.iter().sum::<f64>());
        view.extend(deq);
    }
    (view, corrections)
}

fn vector(gguf: &Gguf<'_>, name: &str) -> Result<Vec<f64>, ModelError> {
    Ok(dequant(gguf, name)?.values.into_iter().map(f64::from).collect())
}

/// Σ a·b in f64, with four independent sums (the order differs from a plain loop by rounding only).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let mut s = [0f64; 4];
    for (x, y) in ca.zip(cb) {
        s[0] += x[0] * y[0];
        s[1] += x[1] * y[1];
        s[2] += x[2] * y[2];
        s[3] += x[3] * y[3];
    }
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

/// Threads for the matrix products: the machine's cores natively, one in the browser.
fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    return std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    #[cfg(target_arch = "wasm32")]
    return 1;
}

/// `Y[t] = W · xs[t]` for every position t: `[positions][rows]`, with the activations the GPU
/// multiplies this matrix with.
fn matmul(w: &Matrix, xs: &[Vec<f64>], act: Activations) -> Vec<Vec<f64>> {
    if act == Activations::Int8 && w.int8_body {
        let (views, corrections): (Vec<Vec<f64>>, Vec<Vec<f64>>) = xs.iter().map(|x| int8_view(x)).unzip();
        let mut y = dense_matmul(w, &views);
        if !w.mins.is_empty() {
            let nb = w.cols / 32;
            for (yt, ct) in y.iter_mut().zip(&corrections) {
                for (r, v) in yt.iter_mut().enumerate() {
                    *v += w.mins[r * nb..(r + 1) * nb].iter().zip(ct).map(|(m, c)| f64::from(*m) * c).sum::<f64>();
                }
            }
        }
        return y;
    }
    dense_matmul(w, xs)
}

/// `Y[t] = W · xs[t]` for every position t: `[positions][rows]`.
fn dense_matmul(w: &Matrix, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let positions = xs.len();
    // [row][position], so that each thread owns a contiguous run of rows.
    let mut by_row = vec![0f64; w.rows * positions];
    let rows_per_part = w.rows.div_ceil(threads()).max(1);
    let work = |first_row: usize, out: &mut [f64]| {
        let mut w64 = vec![0f64; w.cols];
        for (i, out_row) in out.chunks_mut(positions.max(1)).enumerate() {
            w64.iter_mut().zip(w.row(first_row + i)).for_each(|(d, s)| *d = f64::from(*s));
            for (y, x) in out_row.iter_mut().zip(xs) {
                *y = dot(&w64, x);
            }
        }
    };
    let parts: Vec<&mut [f64]> = by_row.chunks_mut(rows_per_part * positions.max(1)).collect();
    if parts.len() <= 1 || cfg!(target_arch = "wasm32") {
        for (p, out) in parts.into_iter().enumerate() {
            work(p * rows_per_part, out);
        }
    } else {
        #[cfg(not(target_arch = "wasm32"))]
        std::thread::scope(|s| {
            for (p, out) in parts.into_iter().enumerate() {
                let work = &work;
                s.spawn(move || work(p * rows_per_part, out));
            }
        });
    }
    (0..positions).map(|t| (0..w.rows).map(|r| by_row[r * positions + t]).collect()).collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}

/// Rotary embedding of each head of `x` at `pos`: pair i of the first `rot` dimensions
/// ([`RopePairing`] within them) turns by pos · base^(-2i/rot) / factors[i], cos and sin
/// times `scale`; the other dimensions stay.
fn rope(x: &mut [f64], (n_heads, head_dim): (usize, usize), pos: usize, rope: &RopeOf<'_>) {
    let rot = rope.dims;
    for h in 0..n_heads {
        for i in 0..rot / 2 {
            let factor = rope.factors.map_or(1.0, |f| f64::from(f[i]));
            let theta = rope.base.powf(-2.0 * i as f64 / rot as f64) * pos as f64 / factor;
            let (s, c) = theta.sin_cos();
            let (s, c) = (s * rope.scale, c * rope.scale);
            let (d0, d1) = rope.pairing.dims(i, rot);
            let (j0, j1) = (h * head_dim + d0, h * head_dim + d1);
            let (a, b) = (x[j0], x[j1]);
            x[j0] = a * c - b * s;
            x[j1] = a * s + b * c;
        }
    }
}

/// A layer's RoPE, as [`rope`] applies it.
struct RopeOf<'a> {
    base: f64,
    pairing: RopePairing,
    dims: usize,
    factors: Option<&'a [f32]>,
    scale: f64,
}

/// `c · tanh(s / c)`.
fn softcap(s: f64, cap: Option<f32>) -> f64 {
    match cap {
        Some(c) => f64::from(c) * (s / f64::from(c)).tanh(),
        None => s,
    }
}

/// Per-head RMSNorm of each head of `x` with the shared `w` [head_dim].
fn head_norm(x: &mut [f64], head_dim: usize, w: &[f64], eps: f64) {
    for head in x.chunks_mut(head_dim) {
        let normed = rms_norm(head, w, eps);
        head.copy_from_slice(&normed);
    }
}

fn add(x: &mut [Vec<f64>], delta: &[Vec<f64>]) {
    for (xt, dt) in x.iter_mut().zip(delta) {
        xt.iter_mut().zip(dt).for_each(|(a, b)| *a += b);
    }
}

/// Causal attention of every position over the positions up to it (the last `window` of them
/// with a window): `[positions][n_heads·head_dim]`.
fn attention(cfg: &ModelConfig, window: Option<u32>, q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let (hd, nq, nkv) = (cfg.head_dim as usize, cfg.n_heads as usize, cfg.n_kv_heads as usize);
    let group = nq / nkv;
    (0..q.len())
        .map(|t| {
            let mut att = vec![0f64; nq * hd];
            for head in 0..nq {
                let kvh = head / group;
                let qh = &q[t][head * hd..(head + 1) * hd];
                let first = window.map_or(0, |w| (t + 1).saturating_sub(w as usize));
                let scores: Vec<f64> = (first..=t).map(|s| softcap(dot(qh, &k[s][kvh * hd..(kvh + 1) * hd]) / (hd as f64).sqrt(), cfg.attn_softcap)).collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, p) in (first..=t).zip(&e) {
                    for d in 0..hd {
                        att[head * hd + d] += p / z * v[s][kvh * hd + d];
                    }
                }
            }
            att
        })
        .collect()
}

/// `x += delta`, through the post-norm `role` of layer `l` when the model has post-norms.
fn residual(
    gguf: &Gguf<'_>,
    (cfg, table): (&ModelConfig, &TensorTable),
    (l, role): (u32, Role),
    x: &mut [Vec<f64>],
    delta: Vec<Vec<f64>>,
) -> Result<(), ModelError> {
    if !cfg.post_norms {
        add(x, &delta);
        return Ok(());
    }
    let w = vector(gguf, &table.spec(Some(l), role)?.name)?;
    let normed: Vec<Vec<f64>> = delta.iter().map(|d| rms_norm(d, &w, cfg.rms_eps as f64)).collect();
    add(x, &normed);
    Ok(())
}

// Long: one block, step by step as the module documentation of graph.rs writes it.
/// One block over every position of `x` (the residual stream), in place.
fn layer(gguf: &Gguf<'_>, (cfg, table): (&ModelConfig, &TensorTable), l: u32, x: &mut [Vec<f64>], act: Activations) -> Result<(), ModelError> {
    let (nq, nkv, hd) = (cfg.n_heads as usize, cfg.n_kv_heads as usize, cfg.head_dim as usize);
    let eps = cfg.rms_eps as f64;
    let rope_of = RopeOf {
        base: cfg.layer_rope_base(l) as f64,
        pairing: cfg.rope_pairing,
        dims: cfg.rope_dims as usize,
        factors: cfg.rope_factors.as_deref(),
        scale: f64::from(cfg.rope_scale),
    };
    let name = |role: Role| table.spec(Some(l), role).map(|t| t.name.as_str());
    let m = |role: Role| dequant(gguf, name(role)?);
    let norm = |role: Role| vector(gguf, name(role)?);
    // A fused tensor's output split at these widths.
    let split = |rows: Vec<Vec<f64>>, at: usize| -> (Vec<Vec<f64>>, Vec<Vec<f64>>) { rows.into_iter().map(|r| (r[..at].to_vec(), r[at..].to_vec())).unzip() };
    let (q_width, kv_width) = (nq * hd, nkv * hd);

    let attn_norm = norm(Role::AttnNorm)?;
    let h: Vec<Vec<f64>> = x.iter().map(|xt| rms_norm(xt, &attn_norm, eps)).collect();
    let (mut q, mut k, mut v) = if cfg.fused {
        let (q, kv) = split(matmul(&m(Role::AttnQkv)?, &h, act), q_width);
        let (k, v) = split(kv, kv_width);
        (q, k, v)
    } else {
        (matmul(&m(Role::AttnQ)?, &h, act), matmul(&m(Role::AttnK)?, &h, act), matmul(&m(Role::AttnV)?, &h, act))
    };
    if cfg.qkv_bias {
        for (rows, role) in [(&mut q, Role::AttnQBias), (&mut k, Role::AttnKBias), (&mut v, Role::AttnVBias)] {
            let b = norm(role)?;
            rows.iter_mut().for_each(|r| r.iter_mut().zip(&b).for_each(|(y, b)| *y += b));
        }
    }
    if cfg.qk_norm {
        let (qn, kn) = (norm(Role::AttnQNorm)?, norm(Role::AttnKNorm)?);
        q.iter_mut().for_each(|qt| head_norm(qt, hd, &qn, eps));
        k.iter_mut().for_each(|kt| head_norm(kt, hd, &kn, eps));
    }
    if cfg.layer_has_rope(l) {
        for (pos, (qt, kt)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
            rope(qt, (nq, hd), pos, &rope_of);
            rope(kt, (nkv, hd), pos, &rope_of);
        }
    }
    let att = attention(cfg, cfg.layer_window(l), &q, &k, &v);
    residual(gguf, (cfg, table), (l, Role::PostAttnNorm), x, matmul(&m(Role::AttnOutput)?, &att, act))?;

    let ffn_norm = norm(Role::FfnNorm)?;
    let h: Vec<Vec<f64>> = x.iter().map(|xt| rms_norm(xt, &ffn_norm, eps)).collect();
    let (gate, up) = if cfg.fused {
        split(matmul(&m(Role::FfnUp)?, &h, act), cfg.ffn as usize)
    } else {
        (matmul(&m(Role::FfnGate)?, &h, act), matmul(&m(Role::FfnUp)?, &h, act))
    };
    let glu: Vec<Vec<f64>> = gate.iter().zip(&up).map(|(g, u)| g.iter().zip(u).map(|(g, u)| cfg.activation.apply(*g) * u).collect()).collect();
    residual(gguf, (cfg, table), (l, Role::PostFfnNorm), x, matmul(&m(Role::FfnDown)?, &glu, act))?;
    Ok(())
}

/// Logits (`[ids.len()][vocab]`) for every position of `ids`, recomputed from scratch, the
/// matmuls multiplying the activations themselves.
pub fn forward_cpu(gguf: &Gguf<'_>, cfg: &ModelConfig, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
    forward_cpu_with(gguf, cfg, ids, 0, Activations::F32)
}

/// Logits for the positions `first_logit..ids.len()` of `ids` only (`[ids.len() - first_logit][vocab]`),
/// recomputed from scratch: the output projection runs only for those positions.
pub fn forward_cpu_from(gguf: &Gguf<'_>, cfg: &ModelConfig, ids: &[u32], first_logit: usize) -> Result<Vec<Vec<f32>>, ModelError> {
    forward_cpu_with(gguf, cfg, ids, first_logit, Activations::F32)
}

/// [`forward_cpu_from`] with the matmuls' [`Activations`] (those of the engine compared with).
pub fn forward_cpu_with(gguf: &Gguf<'_>, cfg: &ModelConfig, ids: &[u32], first_logit: usize, act: Activations) -> Result<Vec<Vec<f32>>, ModelError> {
    let table = cfg.tensors();
    let name = |role: Role| table.spec(None, role).map(|t| t.name.as_str());
    let embd = dequant(gguf, name(Role::TokenEmbd)?)?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= embd.rows) {
        return Err(ModelError::Format(format!("token {id} is outside the embedding's {} rows", embd.rows)));
    }
    // The scale as the GPU applies it: an f32 factor on the f32 dequantized values.
    let scale = cfg.embedding_scale;
    let mut x: Vec<Vec<f64>> = ids.iter().map(|&t| embd.row(t as usize).iter().map(|&v| f64::from(v * scale)).collect()).collect();
    for l in 0..cfg.n_layers {
        layer(gguf, (cfg, &table), l, &mut x, act)?;
    }
    let out_norm = vector(gguf, name(Role::OutputNorm)?)?;
    let h: Vec<Vec<f64>> = x[first_logit.min(x.len())..].iter().map(|xt| rms_norm(xt, &out_norm, cfg.rms_eps as f64)).collect();
    let output = table.spec(None, Role::Output)?;
    let out_w = if output.present_in(gguf) { dequant(gguf, &output.name)? } else { embd };
    Ok(matmul(&out_w, &h, act).into_iter().map(|row| row.into_iter().map(|v| softcap(v, cfg.final_softcap) as f32).collect()).collect())
}
