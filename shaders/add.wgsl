// Element-wise add: x[i] += y[i] (a residual add), or with WIDTH > 0 a row vector added to every
// row of x: x[i] += y[i % WIDTH] (q/k/v biases).
// x: [n] f32 (read-write), y: [n] f32, or [WIDTH] with WIDTH. params.n = n.

struct Params { n: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> params: Params;

override WG: u32 = 64u;
override WIDTH: u32 = 0u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i < params.n) {
        x[i] = x[i] + y[select(i, i % max(WIDTH, 1u), WIDTH > 0u)];
    }
}
