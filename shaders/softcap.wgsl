// Soft-capping in place: x[i] = CAP * tanh(x[i] / CAP) (Gemma 2's final logits).
// x: [n] f32 (read-write). params.n = n.
//
// tanh from one exp of a non-positive argument (no overflow at any |x|, unlike a builtin that
// forms exp(2x)): |error| ~1e-7 absolute.

struct Params { n: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> params: Params;

override WG: u32 = 64u;
override CAP: f32 = 1.0;

fn soft_capped(v: f32) -> f32 {
    let t = v / CAP;
    let e = exp(-2.0 * abs(t));
    return CAP * sign(t) * (1.0 - e) / (1.0 + e);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i < params.n) {
        x[i] = soft_capped(x[i]);
    }
}
