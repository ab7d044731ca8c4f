// RMSNorm (llama): out[r, c] = x[r, c] / sqrt(mean_c(x[r, c]²) + eps) * weight[c], after
// rms_common.wgsl. x: [n_rows, dim] f32, weight: [dim] f32, out: [n_rows, dim] f32.

struct Params { n_rows: u32, dim: u32, eps: f32, _pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= params.n_rows) {
        return;
    }
    let dim = params.dim;
    let base = row * dim;
    let scale = inv_rms(base, dim, params.eps);
    for (var k = 0u; k < dim; k += 1u) {
        out[base + k] = x[base + k] * scale * weight[k];
    }
}
