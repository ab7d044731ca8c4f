// Per-head RMSNorm in place (Gemma 3's q and k norms), after rms_common.wgsl: in each of n_rows
// rows of row_stride floats, the n_heads heads of head_dim floats from column `first` on become
// x / sqrt(mean(x²) + eps) * weight, one weight [head_dim] shared by every head.
// One invocation per (row, head).

struct Params { n_rows: u32, row_stride: u32, first: u32, n_heads: u32, head_dim: u32, eps: f32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> params: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    if (item >= params.n_rows * params.n_heads) {
        return;
    }
    let row = item / params.n_heads;
    let head = item % params.n_heads;
    let dim = params.head_dim;
    let base = row * params.row_stride + params.first + head * dim;
    let scale = inv_rms(base, dim, params.eps);
    for (var k = 0u; k < dim; k += 1u) {
        x[base + k] = x[base + k] * scale * weight[k];
    }
}
