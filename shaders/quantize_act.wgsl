// Quantizes activations to int8 per 32-value block (llama.cpp's Q8_1 idea) for the INT8 variant of
// matmul_q4_1 / matmul_q8_0: value ≈ d · q with d = max|x| / 127, q = round(x / d) in [-127, 127].
// Block b of row a is 3 vec4<u32> at (a · nb + b) · 3:
//   [0], [1]  the 32 quants, 4 per u32 in order (pack4xI8), values 0..15 then 16..31;
//   [2]       x: d (f32 bits), y: the exact f32 sum of the block's 32 inputs (for Q4_1's minimum), z, w: 0.
//
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
    var amax = vec4<f32>(0.0);
    var sum = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        v[i] = x[blk * 8u + i];
        amax = max(amax, abs(v[i]));
        sum += v[i];
    }
    let m = max(max(amax.x, amax.y), max(amax.z, amax.w));
    let d = m / 127.0;
    let inv = select(0.0, 1.0 / d, d > 0.0);
    var packed: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        packed[i] = pack4xI8(vec4<i32>(round(v[i] * inv)));
    }
    let base = blk * 3u;
    xq[base] = vec4<u32>(packed[0], packed[1], packed[2], packed[3]);
    xq[base + 1u] = vec4<u32>(packed[4], packed[5], packed[6], packed[7]);
    xq[base + 2u] = vec4<u32>(bitcast<u32>(d), bitcast<u32>(dot(sum, vec4<f32>(1.0))), 0u, 0u);
}
