//! Greedy sampling on the GPU: the index of each row's largest logit, so that a decode step
//! reads back one u32 per sequence instead of the logits.

use super::{check_binding, check_size, grid, whole};
use crate::gpu::kernel::split_workgroups;
use crate::gpu::{shape_err, AdapterClass, Context, GpuError, Kernel};

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

/// How [`argmax_with`] spreads a row over invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgmaxPlan {
    /// Partial maxima over [`PARTS_PER_ROW`] interleaved column sets in workgroups of 64, then a
    /// pass over them per row: two dispatches, a row spread over several workgroups.
    TwoPasses,
    /// One workgroup of this many invocations per row, whose partial maxima meet in workgroup
    /// memory: one dispatch.
    OneDispatch(u32),
}

impl ArgmaxPlan {
    /// One dispatch in workgroups of 64 on CPU adapters (8 of lavapipe's SIMD rows) up to 65,536
    /// logits a row, two passes past that (a row spread over both cores); one dispatch in
    /// workgroups of 128 on integrated and 256 on discrete GPUs (not measured on one). Measured
    /// on lavapipe (tests/kernels_ops.rs `argmax_time`, a busy machine), one row: 49,152 logits
    /// 110 µs in one dispatch against 146 µs in two passes, 262,144 logits 1,744 against 1,445.
    pub fn auto(ctx: &Context, vocab: u32) -> ArgmaxPlan {
        match ctx.class() {
            AdapterClass::Cpu if vocab > 65_536 => ArgmaxPlan::TwoPasses,
            AdapterClass::Cpu => ArgmaxPlan::OneDispatch(64),
            AdapterClass::Integrated => ArgmaxPlan::OneDispatch(128),
            AdapterClass::Discrete => ArgmaxPlan::OneDispatch(256),
        }
    }
}

/// `out[r] = argmax(logits[r, :])` as [`ArgmaxPlan::auto`] computes it ([`argmax_with`]).
pub fn argmax(ctx: &Context, logits: &wgpu::Buffer, out: &wgpu::Buffer, n_rows: u32, vocab: u32) -> Result<Vec<Kernel>, GpuError> {
    argmax_with(ctx, (logits, out), n_rows, vocab, ArgmaxPlan::auto(ctx, vocab))
}

/// `out[r] = argmax(logits[r, :])`, as the kernels to record in order that `plan` takes.
/// logits: [n_rows, vocab] f32, out: [n_rows] u32. `n_rows`, `vocab` >= 1.
/// Order: the usual float order with -0 == +0; NaN ranks below every number (so a NaN logit is
/// never chosen over a number, -inf included); ties go to the LOWEST index; a row of only NaNs
/// gives 0. The scratch buffer of partial results belongs to the returned kernels.
pub fn argmax_with(ctx: &Context, (logits, out): (&wgpu::Buffer, &wgpu::Buffer), n_rows: u32, vocab: u32, plan: ArgmaxPlan) -> Result<Vec<Kernel>, GpuError> {
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
    if let ArgmaxPlan::OneDispatch(wg) = plan {
        if wg == 0 || wg > ctx.limits.max_compute_invocations_per_workgroup || wg as u64 * 8 > ctx.limits.max_compute_workgroup_storage_size as u64 {
            return Err(shape_err(OP, format!("workgroup size {wg} is unsupported")));
        }
        let params = ctx.params_init("argmax.params", bytemuck::bytes_of(&ArgmaxParams { n_rows, vocab, n_parts: wg, _pad: 0 }));
        let pipeline = ctx.pipeline("argmax", "scan_row", &[("WG", wg as f64)])?;
        let bindings = [(1, whole(logits)), (2, whole(&params)), (3, whole(out))];
        let kernel = Kernel::with_bindings(ctx, "argmax.scan_row", pipeline, &bindings, split_workgroups(ctx, n_rows));
        return Ok(vec![kernel.owning(params)]);
    }
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
    let pick = Kernel::new(ctx, "argmax.pick_best", pick, &[whole(&partials), whole(out), whole(&params)], grid(ctx, n_rows as u64, ARGMAX_WG), None);
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
