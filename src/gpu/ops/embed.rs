//! Token embedding lookup from the table that also serves as the output projection, in any
//! weight type: one dispatch per part of the table (`shaders/embed.wgsl` after the type's
//! `quant_<type>.wgsl`), each writing the ids its rows hold.

use super::matmul::{linear_grid, QuantMatrix};
use super::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::QK;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedParams {
    n: u32,
    nb: u32,
    row0: u32,
    rows: u32,
    zero_from: u32,
    scale: f32,
    _pad: [u32; 2],
}

const EMBED_WG: u32 = 32;

/// out[i, :] = table[ids[i], :] · scale, dequantized (Gemma scales its embedding by √hidden; 1
/// elsewhere). An id ≥ vocab yields a zero row (the kernel cannot fail).
/// table: rows = vocab, cols = hidden, any type; ids: [n] u32; out: [n, hidden] f32 (may be a
/// larger buffer). One kernel per part of the table.
pub fn embedding(ctx: &Context, table: &QuantMatrix, (ids, out): (&wgpu::Buffer, &wgpu::Buffer), n: u32, scale: f32) -> Result<Vec<Kernel>, GpuError> {
    const OP: &str = "embedding";
    if n == 0 {
        return Err(shape_err(OP, "n must be positive"));
    }
    if !scale.is_finite() {
        return Err(shape_err(OP, format!("scale must be finite, got {scale}")));
    }
    check_size(OP, "ids", ids, n as u64 * 4)?;
    check_size(OP, "out", out, n as u64 * table.cols as u64 * 4)?;
    check_binding(ctx, OP, "out", out.size())?;
    let nb = table.cols / QK as u32;
    let workgroups = linear_grid(ctx, OP, (n as u64 * nb as u64).div_ceil(EMBED_WG as u64))?;
    let last = table.parts.len().saturating_sub(1);
    let mut kernels = Vec::with_capacity(table.parts.len());
    for (i, part) in table.parts.iter().enumerate() {
        let zero_from = if i == last { table.rows } else { u32::MAX };
        let params = EmbedParams { n, nb, row0: part.row0, rows: part.rows, zero_from, scale, _pad: [0; 2] };
        let uniform = ctx.params_init("embedding.params", bytemuck::bytes_of(&params));
        let name = part.layout.embed_shader();
        let pipeline = ctx.pipeline(name, "main", &[("WG", EMBED_WG as f64)])?;
        let kernel = Kernel::new(ctx, name, pipeline, &[whole(&part.buffer), whole(ids), whole(out), whole(&uniform)], workgroups, None);
        kernels.push(kernel.owning(uniform));
    }
    Ok(kernels)
}

#[cfg(feature = "testing")]
/// CPU reference: the dequantized rows `ids` of a GGUF table of type `t`, [vocab, hidden]; zeros
/// for ids ≥ vocab.
pub fn embedding_cpu(t: crate::gguf::GgmlType, raw: &[u8], vocab: u32, hidden: u32, ids: &[u32]) -> Result<Vec<f32>, GpuError> {
    let layout = super::matmul::layout::Layout::of(t).ok_or_else(|| shape_err("embedding_cpu", format!("type {} is not supported", t.name())))?;
    layout.check_raw(raw, vocab, hidden).map_err(|e| shape_err("embedding_cpu", e))?;
    let row_bytes = layout.row_bytes(hidden) as usize;
    let mut out = vec![0f32; ids.len() * hidden as usize];
    for (i, &id) in ids.iter().enumerate() {
        if id < vocab {
            let row = &raw[id as usize * row_bytes..][..row_bytes];
            crate::quant::dequantize(t, row, &mut out[i * hidden as usize..][..hidden as usize]).map_err(|e| shape_err("embedding_cpu", e.to_string()))?;
        }
    }
    Ok(out)
}
