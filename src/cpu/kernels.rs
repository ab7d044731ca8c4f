//! The CPU backend's kernels: the same arithmetic as the WGSL kernels (f32 activations, weights
//! dequantized from their GGUF blocks as they are read, K/V in the paged pool's own layout), in
//! plain Rust written so the compiler vectorizes it (SIMD128 in wasm, SSE/AVX/NEON natively), and
//! spread over the machine's cores natively (rayon; one thread in the browser).
//!
//! Shape contracts are in each function's documentation and checked by the forward pass
//! ([`super::forward`]) before it calls them; slices of the wrong length panic here (a bug).

use crate::gguf::GgmlType;
use crate::model::arch::Rope;
use crate::quant::kv_int8;
use crate::quant::{bytes_of, dequantize};

use super::qdot::{self, dot, Acts, Weights};

/// Parallel tasks per thread a matmul is cut into: enough that two or more threads finish
/// together when some rows cost more (or a thread is late), few enough that a task outweighs
/// its scheduling.
const TASKS_PER_THREAD: usize = 8;

/// A weight matrix `[rows, cols]` (GGUF `ne0 = cols`) kept in its file's block format.
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// The rows' blocks, `row_bytes` per row (F32 matrices keep their values in `f32`).
    data: Vec<u8>,
    /// F32 matrices: the values.
    f32: Vec<f32>,
    row_bytes: usize,
}

impl QMatrix {
    /// A matrix of type `ty` from its raw bytes (`rows · cols` values of `ty`).
    pub fn new(ty: GgmlType, rows: usize, cols: usize, raw: &[u8]) -> Result<QMatrix, String> {
        if ty == GgmlType::F32 {
            let values = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            return QMatrix::from_f32(rows, cols, values);
        }
        QMatrix::from_raw(ty, rows, cols, raw.to_vec())
    }

    /// An F32 matrix owning `values` (`rows · cols`, row after row).
    pub fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Result<QMatrix, String> {
        if values.len() != rows * cols {
            return Err(format!("{rows}×{cols} F32 values are {}, not {}", rows * cols, values.len()));
        }
        Ok(QMatrix { ty: GgmlType::F32, rows, cols, data: Vec::new(), f32: values, row_bytes: cols * 4 })
    }

    /// A matrix of a block type `ty` owning its GGUF bytes `raw` (kept as they are: no copy).
    pub fn from_raw(ty: GgmlType, rows: usize, cols: usize, raw: Vec<u8>) -> Result<QMatrix, String> {
        let row_bytes = bytes_of(ty, cols as u64).ok_or_else(|| format!("{cols} columns are not whole {} blocks", ty.name()))? as usize;
        if raw.len() != row_bytes * rows {
            return Err(format!("{rows}×{cols} {} values take {} bytes, not {}", ty.name(), row_bytes * rows, raw.len()));
        }
        if ty == GgmlType::F32 {
            return Err("F32 matrices keep their values as f32 (QMatrix::from_f32)".into());
        }
        // Checks the type is one pagedlm decodes, once, on the first row.
        let mut probe = vec![0f32; cols];
        if rows > 0 {
            dequantize(ty, &raw[..row_bytes], &mut probe).map_err(|e| e.to_string())?;
        }
        Ok(QMatrix { ty, rows, cols, data: raw, f32: Vec::new(), row_bytes })
    }

    /// Bytes the matrix holds in memory.
    pub fn bytes(&self) -> u64 {
        (self.data.len() + self.f32.len() * 4) as u64
    }

    /// Rows `first..first + count` (within the matrix) in their stored form.
    pub fn weights(&self, first: usize, count: usize) -> Weights<'_> {
        if self.ty == GgmlType::F32 {
            Weights::F32(&self.f32[first * self.cols..(first + count) * self.cols])
        } else {
            Weights::Blocks(self.ty, &self.data[first * self.row_bytes..(first + count) * self.row_bytes])
        }
    }

    /// Row `r`'s values into `out` (`cols` of them).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        if self.ty == GgmlType::F32 {
            out.copy_from_slice(&self.f32[r * self.cols..(r + 1) * self.cols]);
        } else {
            // The type and length were checked when the matrix was made.
            dequantize(self.ty, &self.data[r * self.row_bytes..(r + 1) * self.row_bytes], out).expect("checked at load");
        }
    }
}

/// `y += a · x` elementwise (same length).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Threads the kernels use: rayon's pool natively (`RAYON_NUM_THREADS`, else one per core), one
/// in the browser.
pub fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    return rayon::current_num_threads();
    #[cfg(target_arch = "wasm32")]
    return 1;
}

/// Runs `work(first_row, rows_out)` over `out` cut into tasks of `per_task · width` values
/// (`width` values per row), in parallel natively and in order in the browser.
fn par_rows(out: &mut [f32], width: usize, per_task: usize, work: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = (per_task * width).max(1);
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, part)| work(i * per_task, part));
    }
    #[cfg(target_arch = "wasm32")]
    out.chunks_mut(chunk).enumerate().for_each(|(i, part)| work(i * per_task, part));
}

/// `out[t][r] = Σ_c w[r][c] · x[t][c]`: x `[n][cols]`, out `[n][rows]`, with f32 activations
/// ([`matmul_acts`]).
pub fn matmul(w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    matmul_acts(w, Acts::F32(x), n, out)
}

/// `out[t][r] = Σ_c w[r][c] · x[t][c]` for the `n` activation rows `x` (`[n][cols]`, as f32
/// or also quantized to int8: [`qdot::Acts`], whose int8 rows must be `n` rows of `cols`),
/// out `[n][rows]`. The weight rows are shared among threads in runs of consecutive rows; each
/// weight row is unpacked once and multiplied with every activation row ([`qdot::rows_times`]).
pub fn matmul_acts(w: &QMatrix, acts: Acts<'_>, n: usize, out: &mut [f32]) {
    let x = match acts {
        Acts::F32(x) | Acts::Int8(_, x) => x,
    };
    assert_eq!(x.len(), n * w.cols, "matmul input");
    assert_eq!(out.len(), n * w.rows, "matmul output");
    if let Acts::Int8(q, _) = acts {
        assert_eq!((q.n, q.cols), (n, w.cols), "matmul int8 input");
    }
    if n == 0 || w.rows == 0 {
        return;
    }
    let per_task = w.rows.div_ceil(threads() * TASKS_PER_THREAD).max(1);
    let work = |first: usize, part: &mut [f32]| qdot::rows_times(w.weights(first, part.len() / n), w.cols, acts, n, part);
    if n == 1 {
        par_rows(out, 1, per_task, work);
        return;
    }
    // [rows][n], so that a task owns a contiguous run of rows.
    let mut by_row = vec![0f32; w.rows * n];
    par_rows(&mut by_row, n, per_task, work);
    for (r, ys) in by_row.chunks_exact(n).enumerate() {
        for (t, y) in ys.iter().enumerate() {
            out[t * w.rows + r] = *y;
        }
    }
}

/// `out = x / rms(x) · w` (over `x.len()`, `w` of the same length).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = dot(x, x) / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * s * g;
    }
}

/// [`rms_norm`] of each `w.len()`-wide piece of `x` in place (per-head norms, or rows).
pub fn rms_norm_pieces(x: &mut [f32], w: &[f32], eps: f32) {
    let mut tmp = vec![0f32; w.len()];
    for piece in x.chunks_mut(w.len()) {
        rms_norm(piece, w, eps, &mut tmp);
        piece.copy_from_slice(&tmp);
    }
}

/// Rotary embedding of the `head_dim`-wide heads of `x` at position `pos`: pair i of the first
/// `rope.dims` dimensions (its pairing within them) turns by pos · base^(-2i/dims) /
/// factors[i], cos and sin times `rope.scale`; angles computed in f64, applied in f32.
pub fn rope(x: &mut [f32], head_dim: usize, pos: u32, rope: &Rope, factors: Option<&[f32]>) {
    let rot = rope.dims as usize;
    for head in x.chunks_mut(head_dim) {
        for i in 0..rot / 2 {
            let factor = factors.map_or(1.0, |f| f64::from(f[i]));
            let theta = (rope.base as f64).powf(-2.0 * i as f64 / rot as f64) * pos as f64 / factor;
            let (s, c) = theta.sin_cos();
            let scale = f64::from(rope.scale);
            let (s, c) = ((s * scale) as f32, (c * scale) as f32);
            let (d0, d1) = rope.pairing.dims(i, rot);
            let (a, b) = (head[d0], head[d1]);
            head[d0] = a * c - b * s;
            head[d1] = a * s + b * c;
        }
    }
}

/// `y[row] += b` for every `b.len()`-wide row of `y`.
pub fn add_bias(y: &mut [f32], b: &[f32]) {
    for row in y.chunks_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
    }
}

/// `c · tanh(x / c)` of every value of `x`.
pub fn softcap(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v = c * (*v / c).tanh());
}

/// Where one layer's K/V live: its buffers' words (the pool's layout, [`crate::kv::pool`]) and
/// its pool's shape.
#[derive(Clone, Copy)]
pub struct PoolView {
    pub n_kv_heads: usize,
    pub block_size: usize,
    pub head_dim: usize,
    /// INT8: the word where the scales start ([`kv_int8::Int8Layout::data_words`]); `None` for f32.
    pub int8_scales_at: Option<usize>,
}

impl PoolView {
    /// Index of (block, kv head, slot): the f32 pool's value index / head_dim, INT8's group.
    fn group(&self, block: u32, kv_head: usize, slot: usize) -> usize {
        (block as usize * self.n_kv_heads + kv_head) * self.block_size + slot
    }

    /// Writes one token's `x` (`head_dim` values) of `kv_head` into `words` at `block`, `slot`.
    pub fn write(&self, words: &mut [u32], (block, kv_head, slot): (u32, usize, usize), x: &[f32]) {
        let g = self.group(block, kv_head, slot);
        match self.int8_scales_at {
            None => words[g * self.head_dim..(g + 1) * self.head_dim].iter_mut().zip(x).for_each(|(w, v)| *w = v.to_bits()),
            Some(scales) => {
                let mut codes = vec![0i8; self.head_dim];
                let scale = kv_int8::quantize_group(x, &mut codes);
                let at = g * self.head_dim / 4;
                for (w, c) in words[at..at + self.head_dim / 4].iter_mut().zip(codes.chunks_exact(4)) {
                    *w = kv_int8::pack4([c[0], c[1], c[2], c[3]]);
                }
                words[scales + g] = scale.to_bits();
            }
        }
    }

    /// Reads one token's values of `kv_head` at `block`, `slot` into `out` (`head_dim`).
    pub fn read(&self, words: &[u32], (block, kv_head, slot): (u32, usize, usize), out: &mut [f32]) {
        let g = self.group(block, kv_head, slot);
        match self.int8_scales_at {
            None => out.iter_mut().zip(&words[g * self.head_dim..(g + 1) * self.head_dim]).for_each(|(o, w)| *o = f32::from_bits(*w)),
            Some(scales) => {
                let scale = f32::from_bits(words[scales + g]);
                let at = g * self.head_dim / 4;
                for (o, w) in out.chunks_exact_mut(4).zip(&words[at..at + self.head_dim / 4]) {
                    let c = kv_int8::unpack4(*w);
                    for i in 0..4 {
                        o[i] = f32::from(c[i]) * scale;
                    }
                }
            }
        }
    }
}

/// One query row of attention: the keys it sees and where they are.
pub struct AttnRow<'a> {
    /// Its sequence's block table in this layer's group (`u32::MAX` for a block freed out of a
    /// window, never read).
    pub table: &'a [u32],
    /// Keys `first..=last` (absolute positions).
    pub first: u32,
    pub last: u32,
}

/// Causal attention of `rows` (q `[rows][n_heads · head_dim]`, already rotated) over the K/V in
/// `k_words`/`v_words` (`pool`'s layout), scaled by 1/√head_dim (then soft-capped to
/// `c · tanh(s / c)` with `softcap`), each query head reading KV head
/// `head / (n_heads / n_kv_heads)`: out `[rows][n_heads · head_dim]`. Online softmax in f32.
pub fn attention(
    pool: &PoolView,
    (k_words, v_words): (&[u32], &[u32]),
    rows: &[AttnRow<'_>],
    q: &[f32],
    (n_heads, softcap): (usize, Option<f32>),
    out: &mut [f32],
) {
    let hd = pool.head_dim;
    let group = n_heads / pool.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // One task per (row, head): out is [rows][heads][hd].
    par_rows(out, hd, 1, |task, o| {
        let (r, head) = (task / n_heads, task % n_heads);
        let row = &rows[r];
        let qh = &q[(r * n_heads + head) * hd..(r * n_heads + head + 1) * hd];
        let kvh = head / group;
        let (mut k, mut v) = (vec![0f32; hd], vec![0f32; hd]);
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        o.fill(0.0);
        for j in row.first..=row.last {
            let at = (row.table[(j as usize) / pool.block_size], kvh, j as usize % pool.block_size);
            pool.read(k_words, at, &mut k);
            let s = dot(qh, &k) * scale;
            let s = softcap.map_or(s, |c| c * (s / c).tanh());
            if s > max {
                // A new maximum rescales what was summed so far (one exp only then).
                let correction = (max - s).exp();
                sum *= correction;
                o.iter_mut().for_each(|x| *x *= correction);
                max = s;
            }
            let p = (s - max).exp();
            sum += p;
            pool.read(v_words, at, &mut v);
            axpy(o, p, &v);
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        o.iter_mut().for_each(|x| *x *= inv);
    });
}
