//! Token embedding lookup from the quantized table that also serves as the output projection.

use super::matmul::{linear_grid, GgmlKind, QuantMatrix};
use super::{check_binding, check_size, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};
use crate::quant::QK;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedParams {
    n: u32,
    nb: u32,
    vocab: u32,
    _pad: u32,
}

const EMBED_WG: u32 = 32;

/// out[i, :] = table[ids[i], :], dequantized. An id ≥ vocab yields a zero row (the kernel cannot fail).
/// table: Q8_0, rows = vocab, cols = hidden, in the repacked layout of [`QuantMatrix`];
/// ids: [n] u32; out: [n, hidden] f32 (may be a larger buffer).
pub fn embedding(ctx: &Context, table: &QuantMatrix, ids: &wgpu::Buffer, out: &wgpu::Buffer, n: u32) -> Result<Kernel, GpuError> {
    const OP: &str = "embedding";
    if table.ggml_type != GgmlKind::Q8_0 {
        return Err(shape_err(OP, format!("the table is {:?}; only Q8_0 tables are supported", table.ggml_type)));
    }
    if n == 0 {
        return Err(shape_err(OP, "n must be positive"));
    }
    check_size(OP, "ids", ids, n as u64 * 4)?;
    check_size(OP, "out", out, n as u64 * table.cols as u64 * 4)?;
    check_binding(ctx, OP, "out", out.size())?;
    let nb = table.cols / QK as u32;
    let params = EmbedParams { n, nb, vocab: table.rows, _pad: 0 };
    let uniform = ctx.uniform_init("embedding.params", bytemuck::bytes_of(&params));
    let pipeline = ctx.pipeline("embed_q8_0", "main", &[("WG", EMBED_WG as f64)])?;
    let workgroups = linear_grid(ctx, OP, (n as u64 * nb as u64).div_ceil(EMBED_WG as u64))?;
    let kernel = Kernel::new(ctx, "embed_q8_0", pipeline, &[whole(&table.buffer), whole(ids), whole(out), whole(&uniform)], workgroups, None);
    Ok(kernel.owning(uniform))
}

#[cfg(feature = "testing")]
/// CPU reference: the dequantized rows `ids` of a GGUF Q8_0 table [vocab, hidden]; zeros for ids ≥ vocab.
pub fn embedding_cpu(raw: &[u8], vocab: u32, hidden: u32, ids: &[u32]) -> Result<Vec<f32>, GpuError> {
    let row_bytes = hidden as usize / QK * GgmlKind::Q8_0.block_bytes();
    if hidden as usize % QK != 0 || raw.len() != vocab as usize * row_bytes {
        return Err(shape_err("embedding_cpu", format!("{} bytes is not a Q8_0 table of {vocab} × {hidden}", raw.len())));
    }
    let mut out = vec![0f32; ids.len() * hidden as usize];
    for (i, &id) in ids.iter().enumerate() {
        if id < vocab {
            let row = &raw[id as usize * row_bytes..][..row_bytes];
            crate::quant::dequantize_q8_0(row, &mut out[i * hidden as usize..][..hidden as usize]);
        }
    }
    Ok(out)
}
