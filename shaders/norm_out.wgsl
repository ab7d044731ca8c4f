// The output of a norm kernel (rms_norm.wgsl, residual_norm.wgsl): row `base` of x (dim values)
// times `scale` and the norm weight, as f32 in `out` (F32_OUT) and as int8 blocks in `xq` (QUANT,
// quantize_common.wgsl's layout; dim is a multiple of 32 there). Both products are the same.
// The kernel declares x, weight, out, xq, F32_OUT and QUANT.
fn write_normed(base: u32, dim: u32, scale: f32) {
    if (F32_OUT) {
        for (var k = 0u; k < dim; k += 1u) {
            out[base + k] = x[base + k] * scale * weight[k];
        }
    }
    if (QUANT) {
        for (var b = 0u; b < dim / 32u; b++) {
            var v: array<vec4<f32>, 8>;
            for (var i = 0u; i < 8u; i++) {
                let k = base + 32u * b + 4u * i;
                let c = 32u * b + 4u * i;
                v[i] = vec4<f32>(x[k], x[k + 1u], x[k + 2u], x[k + 3u]) * scale * vec4<f32>(weight[c], weight[c + 1u], weight[c + 2u], weight[c + 3u]);
            }
            let q = quantize_block(v);
            let at = (base / 32u + b) * 3u;
            xq[at] = q[0];
            xq[at + 1u] = q[1];
            xq[at + 2u] = q[2];
        }
    }
}
