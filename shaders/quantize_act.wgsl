// Quantizes activations to int8 per 32-value block (quantize_common.wgsl, whose layout xq has):
// the activations a matmul with int8 activations reads when their producer did not quantize them.
// x: [n_rows, nb · 32] f32 (read as vec4); xq: [n_rows · nb · 3] vec4<u32>. One invocation per block.

struct Params {
    blocks: u32,  // n_rows · nb
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

override WG: u32 = 32u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let blk = gid.x + gid.y * nwg.x * WG;
    if (blk >= params.blocks) {
        return;
    }
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = x[blk * 8u + i];
    }
    let q = quantize_block(v);
    xq[blk * 3u] = q[0];
    xq[blk * 3u + 1u] = q[1];
    xq[blk * 3u + 2u] = q[2];
}
