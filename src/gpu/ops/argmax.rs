//! Greedy sampling on the GPU: the index of each row's largest logit, so that a decode step
//! reads back one u32 per sequence instead of the logits.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::{shape_err, Context, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ArgmaxParams {
    n_rows: u32,
    vocab: u32,
    n_parts: u32,
    _pad: u32,
}

const ARGMAX_WG: u64 = 64;
/// Partial results per row in the first pass: 49,152 logits become 192 per invocation and a
/// 256-long final scan, with enough workgroups (4 per row) to keep both CPU cores busy.
const PARTS_PER_ROW: u32 = 256;

/// `out[r] = argmax(logits[r, :])`, as two kernels to record in order (partial maxima over
/// interleaved columns, then one pass over them per row).
/// logits: [n_rows, vocab] f32, out: [n_rows] u32. `n_rows`, `vocab` >= 1.
/// Order: the usual float order with -0 == +0; NaN ranks below every number (so a NaN logit is
/// never chosen over a number, -inf included); ties go to the LOWEST index; a row of only NaNs
/// gives 0. The scratch buffer of partial results belongs to the returned kernels.
pub fn argmax(
    ctx: &Context,
    logits: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n_rows: u32,
    vocab: u32,
) -> Result<Vec<Kernel>, GpuError> {
    const OP: &str = "argmax";
    if n_rows == 0 || vocab == 0 {
        return Err(shape_err(OP, format!("n_rows ({n_rows}) and vocab ({vocab}) must be at least 1")));
    }
    if logits == out {
        return Err(shape_err(OP, "out must be a different buffer from logits"));
    }
    check_size(OP, "logits", logits, n_rows as u64 * vocab as u64 * 4)?;
    check_size(OP, "out", out, n_rows as u64 * 4)?;
    check_binding(ctx, OP, "logits", logits.size())?;
    check_binding(ctx, OP, "out", out.size())?;
    let n_parts = PARTS_PER_ROW.min(vocab);
    let partial_bytes = n_rows as u64 * n_parts as u64 * 8;
    check_binding(ctx, OP, "the partial results", partial_bytes)?;

    let partials = ctx.storage_zeroed("argmax.partials", partial_bytes);
    let params = ArgmaxParams { n_rows, vocab, n_parts, _pad: 0 };
    let params = ctx.params_init("argmax.params", bytemuck::bytes_of(&params));
    let constants = [("WG", ARGMAX_WG as f64)];
    let scan = ctx.pipeline("argmax", "scan_parts", &constants)?;
    let pick = ctx.pipeline("argmax", "pick_best", &constants)?;
    let scan = Kernel::new(
        ctx,
        "argmax.scan_parts",
        scan,
        &[whole(&partials), whole(logits), whole(&params)],
        grid(ctx, n_rows as u64 * n_parts as u64, ARGMAX_WG),
        None,
    );
    let pick = Kernel::new(
        ctx,
        "argmax.pick_best",
        pick,
        &[whole(&partials), whole(out), whole(&params)],
        grid(ctx, n_rows as u64, ARGMAX_WG),
        None,
    );
    // Both bind groups hold both buffers; each kernel keeps one handle so neither depends on the other.
    Ok(vec![scan.owning(params), pick.owning(partials)])
}

#[cfg(feature = "testing")]
/// CPU reference of [`argmax`] with the same order: skips NaNs, keeps the first strictly
/// larger value (so -0 and +0 tie), 0 for a row without numbers. logits: [n_rows, vocab].
pub fn argmax_cpu(logits: &[f32], n_rows: usize, vocab: usize) -> Vec<u32> {
    (0..n_rows)
        .map(|r| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in row.iter().enumerate() {
                if v.is_nan() {
                    continue;
                }
                match best {
                    Some((_, b)) if v <= b => {}
                    _ => best = Some((i, v)),
                }
            }
            best.map_or(0, |(i, _)| i as u32)
        })
        .collect()
}
