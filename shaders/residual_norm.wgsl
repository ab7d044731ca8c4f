// A post-normed residual add and the next pre-norm in one pass (Gemma 3's sandwich norms), after
// rms_common.wgsl and quantize_common.wgsl:
//   x[r]   += delta[r] / sqrt(mean(delta[r]²) + eps) * post     (the block's post-norm)
//   out[r]  = x[r] / sqrt(mean(x[r]²) + eps) * weight           (NORM only: the next pre-norm)
// x: [n_rows, dim] f32, read and written (the residual stream); delta: [n_rows, dim] f32 (the
// block's output); post, weight: [dim] f32; out: [n_rows, dim] f32 (written with NORM and
// F32_OUT); with NORM and QUANT out's values also go, quantized per 32-value block, into xq
// ([n_rows · dim / 32 · 3] vec4<u32>, quantize_common.wgsl's layout) for the next matmul.
// The arithmetic of rms_norm, add and rms_norm in their order, so the fusion changes no bit.
// One invocation per row, as rms_norm.

struct Params { n_rows: u32, dim: u32, eps: f32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> delta: array<f32>;
@group(0) @binding(2) var<storage, read> post: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;
@group(0) @binding(6) var<storage, read_write> xq: array<vec4<u32>>;

override WG: u32 = 64u;
override NORM: bool = true;
override F32_OUT: bool = true;
override QUANT: bool = false;

// inv_rms (rms_common.wgsl) over delta: the same four running sums.
fn inv_rms_delta(base: u32, dim: u32, eps: f32) -> f32 {
    var sums = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 4u <= dim; c += 4u) {
        let v = vec4<f32>(delta[base + c], delta[base + c + 1u], delta[base + c + 2u], delta[base + c + 3u]);
        sums += v * v;
    }
    for (; c < dim; c += 1u) {
        let v = delta[base + c];
        sums.x += v * v;
    }
    let total = (sums.x + sums.y) + (sums.z + sums.w);
    return 1.0 / sqrt(total / f32(dim) + eps);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= params.n_rows) {
        return;
    }
    let dim = params.dim;
    let base = row * dim;
    let post_scale = inv_rms_delta(base, dim, params.eps);
    for (var k = 0u; k < dim; k += 1u) {
        x[base + k] = x[base + k] + delta[base + k] * post_scale * post[k];
    }
    if (NORM) {
        let scale = inv_rms(base, dim, params.eps);
        write_normed(base, dim, scale);
    }
}
