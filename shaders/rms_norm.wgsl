// RMSNorm (llama): out[r, c] = x[r, c] / sqrt(mean_c(x[r, c]²) + eps) * weight[c].
// x: [n_rows, dim] f32, weight: [dim] f32, out: [n_rows, dim] f32.
// One invocation per row: on CPU "GPUs" a serial loop without barriers beats a workgroup
// tree reduction (KERNELS.md), and dim is small (576).

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
    let scale = 1.0 / sqrt(total / f32(dim) + params.eps);
    for (var k = 0u; k < dim; k += 1u) {
        out[base + k] = x[base + k] * scale * weight[k];
    }
}
