// Token embedding lookup: out[i, :] = table[ids[i], :], the table in the repacked Q8_0 layout of
// matmul_q8_0.wgsl (group g = id / 8 holds rows 8g..8g+7; block b of the group is 17 vec4<u32>:
// the 8 f16 scales, then 2 vec4 of quant bytes per row). An id ≥ vocab yields a zero row.
//
// table: [groups · nb · 17] vec4<u32>; ids: [n] u32; out: [n, nb · 32] f32 (written as vec4).
// One invocation per (token, block): 32 values.

struct Params {
    n: u32,       // tokens
    nb: u32,      // 32-value blocks per row (hidden / 32)
    vocab: u32,   // rows of the table
}

@group(0) @binding(0) var<storage, read> table: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

override WG: u32 = 32u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    if (idx >= params.n * params.nb) {
        return;
    }
    let i = idx / params.nb;
    let b = idx % params.nb;
    let id = ids[i];
    let dst = idx * 8u;
    if (id >= params.vocab) {
        for (var k = 0u; k < 8u; k++) {
            out[dst + k] = vec4<f32>(0.0);
        }
        return;
    }
    let r = id % 8u;
    let base = ((id / 8u) * params.nb + b) * 17u;
    let d = unpack2x16float(table[base][r / 2u])[r % 2u];
    for (var h = 0u; h < 2u; h++) {
        let q = table[base + 1u + 2u * r + h];
        for (var k = 0u; k < 4u; k++) {
            out[dst + 4u * h + k] = vec4<f32>(unpack4xI8(q[k])) * d;
        }
    }
}
