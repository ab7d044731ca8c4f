// RMSNorm (llama): out[r, c] = x[r, c] / sqrt(mean_c(x[r, c]²) + eps) * weight[c], after
// rms_common.wgsl and quantize_common.wgsl. x: [n_rows, dim] f32, weight: [dim] f32, out:
// [n_rows, dim] f32 (written with F32_OUT); with QUANT the same values also go, quantized per
// 32-value block, into xq ([n_rows · dim / 32 · 3] vec4<u32>, quantize_common.wgsl's layout): the
// int8 activations of the matmul after the norm, without a dispatch of their own.

struct Params { n_rows: u32, dim: u32, eps: f32, _pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read_write> xq: array<vec4<u32>>;

override WG: u32 = 64u;
override F32_OUT: bool = true;
override QUANT: bool = false;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= params.n_rows) {
        return;
    }
    let dim = params.dim;
    let base = row * dim;
    let scale = inv_rms(base, dim, params.eps);
    if (F32_OUT) {
        for (var k = 0u; k < dim; k += 1u) {
            out[base + k] = x[base + k] * scale * weight[k];
        }
    }
    if (QUANT) {
        // The same products as above, per block of 32 (dim is a multiple of 32 here).
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
