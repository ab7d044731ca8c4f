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
    write_normed(base, dim, scale);
}
