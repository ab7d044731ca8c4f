// The prelude of the RMSNorm kernels (rms_norm.wgsl: rows into another buffer; head_norm.wgsl:
// heads of the fused qkv rows in place), prepended to each body (src/gpu/shaders.rs). Each body
// declares `x` (read, or read_write) and calls inv_rms on its rows.
// One invocation per row: on CPU "GPUs" a serial loop without barriers beats a workgroup tree
// reduction (KERNELS.md), and rows are short (576 for SmolLM2, 256 for a Gemma head).

// 1 / sqrt(mean(x[base .. base + dim]²) + eps).
fn inv_rms(base: u32, dim: u32, eps: f32) -> f32 {
    // Four running sums: a shorter dependency chain, and each sums a quarter of the squares,
    // which keeps the f32 rounding error lower than one long chain.
    var sums = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 4u <= dim; c += 4u) {
        let v = vec4<f32>(x[base + c], x[base + c + 1u], x[base + c + 2u], x[base + c + 3u]);
        sums += v * v;
    }
    for (; c < dim; c += 1u) {
        let v = x[base + c];
        sums.x += v * v;
    }
    let total = (sums.x + sums.y) + (sums.z + sums.w);
    return 1.0 / sqrt(total / f32(dim) + eps);
}
