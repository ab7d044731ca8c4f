//! CPU references of the matmul kernels (tests and benchmarks only).

use super::layout::Layout;
use super::layout_of;
use crate::gguf::GgmlType;
use crate::gpu::{shape_err, GpuError};
use crate::quant::{Q4_1_BLOCK_BYTES, QK};

/// Checks `raw` against its type and shape for `op`, returning the type's layout.
fn checked(op: &'static str, t: GgmlType, raw: &[u8], rows: u32, cols: u32) -> Result<Layout, GpuError> {
    let layout = layout_of(op, t)?;
    layout.check_raw(raw, rows, cols).map_err(|e| shape_err(op, e))?;
    Ok(layout)
}

/// The largest |error| int8 activations can add to output [a, n] (`int8_activations`):
/// Σ_k |d·q[n,k]| · step(a,k) / 2, where d·q is the weight without Q4_1's minimum (the minimum
/// multiplies the exact f32 sum of the block) and step = max |x| / 127 over the activation block
/// holding k. f32 rounding comes on top. raw: GGUF [rows, cols]; x: [n_rows, cols]; returns [n_rows, rows].
pub fn int8_error_bound(kind: GgmlType, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f64>, GpuError> {
    checked("int8_error_bound", kind, raw, rows, cols)?;
    let (rows, cols) = (rows as usize, cols as usize);
    if x.len() != n_rows as usize * cols {
        return Err(shape_err("int8_error_bound", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let mut scaled = dequantize(kind, raw, rows * cols);
    if kind == GgmlType::Q4_1 {
        for (block, values) in raw.chunks_exact(Q4_1_BLOCK_BYTES).zip(scaled.chunks_exact_mut(QK)) {
            let m = half::f16::from_le_bytes([block[2], block[3]]).to_f32();
            values.iter_mut().for_each(|v| *v -= m);
        }
    }
    let mut out = Vec::with_capacity(n_rows as usize * rows);
    for xa in x.chunks_exact(cols) {
        let half_steps: Vec<f64> = xa.chunks_exact(QK).map(|block| block.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0 / 2.0).collect();
        for wn in scaled.chunks_exact(cols) {
            out.push(wn.iter().enumerate().map(|(k, v)| v.abs() as f64 * half_steps[k / QK]).sum());
        }
    }
    Ok(out)
}

/// CPU reference: dequantizes the GGUF matrix and takes f64 dot products.
/// raw: [rows, cols] in GGUF blocks; x: [n_rows, cols]; returns [n_rows, rows].
pub fn matmul_cpu(kind: GgmlType, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f32>, GpuError> {
    checked("matmul_cpu", kind, raw, rows, cols)?;
    let (rows, cols, n_rows) = (rows as usize, cols as usize, n_rows as usize);
    if x.len() != n_rows * cols {
        return Err(shape_err("matmul_cpu", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let weights = dequantize(kind, raw, rows * cols);
    let mut y = vec![0f32; n_rows * rows];
    for a in 0..n_rows {
        let xa = &x[a * cols..][..cols];
        for n in 0..rows {
            let wn = &weights[n * cols..][..cols];
            y[a * rows + n] = wn.iter().zip(xa).map(|(&p, &q)| p as f64 * q as f64).sum::<f64>() as f32;
        }
    }
    Ok(y)
}

/// CPU reference of the int8-activation variant: quantizes every 32-value block of x as
/// quantize_act.wgsl does (d = max|x| / 127, q = x · (1/d) rounded half to even), then takes
/// Σ_b d_w · d_x · Σ q_w q_x (+ m · Σ x for Q4_1) in f64.
/// raw: [rows, cols] in GGUF blocks; x: [n_rows, cols]; returns [n_rows, rows].
pub fn matmul_int8_cpu(kind: GgmlType, raw: &[u8], rows: u32, cols: u32, x: &[f32], n_rows: u32) -> Result<Vec<f32>, GpuError> {
    let layout = checked("matmul_int8_cpu", kind, raw, rows, cols)?;
    if !layout.has_int8_path() {
        return Err(shape_err("matmul_int8_cpu", format!("{} parts have no int8-activation path", kind.name())));
    }
    let (rows, nb) = (rows as usize, cols as usize / QK);
    if x.len() != n_rows as usize * cols as usize {
        return Err(shape_err("matmul_int8_cpu", format!("x has {} values, {n_rows} × {cols} expected", x.len())));
    }
    let bb = layout.block_bytes as usize;
    let f16_at = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32() as f64;
    let mut y = Vec::with_capacity(n_rows as usize * rows);
    for xa in x.chunks_exact(cols as usize) {
        // (d, Σx, quants) per activation block.
        let blocks: Vec<(f64, f64, [i32; QK])> = xa
            .chunks_exact(QK)
            .map(|v| {
                let d = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let mut q = [0i32; QK];
                q.iter_mut().zip(v).for_each(|(q, x)| *q = (x * inv).round_ties_even() as i32);
                (d as f64, v.iter().sum::<f32>() as f64, q)
            })
            .collect();
        for n in 0..rows {
            let mut sum = 0f64;
            for (b, (dx, sx, qx)) in blocks.iter().enumerate() {
                let block = &raw[(n * nb + b) * bb..][..bb];
                let dw = f16_at(block, 0);
                let (dot, min_term) = match kind {
                    GgmlType::Q4_1 => {
                        let dot: i32 = (0..16).map(|j| (block[4 + j] & 15) as i32 * qx[j] + (block[4 + j] >> 4) as i32 * qx[j + 16]).sum();
                        (dot, f16_at(block, 2) * sx)
                    }
                    _ => ((0..QK).map(|j| block[2 + j] as i8 as i32 * qx[j]).sum(), 0.0),
                };
                sum += dw * dx * dot as f64 + min_term;
            }
            y.push(sum as f32);
        }
    }
    Ok(y)
}

/// Dequantizes `n` values of GGUF `kind` data (the caller has checked the length).
pub(crate) fn dequantize(kind: GgmlType, raw: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    crate::quant::dequantize(kind, raw, &mut out).expect("checked by the caller");
    out
}
