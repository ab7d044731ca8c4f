// Token embedding lookup for every weight type, after quant_common.wgsl and the table's
// quant_<type>.wgsl: out[i, :] = table[ids[i], :] · scale for the ids this part of the table holds
// (row0 ≤ id < row0 + rows); other parts write the other ids. Ids ≥ zero_from (the vocabulary,
// set on the last part only) yield a zero row, so the lookup cannot fail.
//
// table: one part of a QuantMatrix (binding 0, `wq`); ids: [n] u32; out: [n, nb · 32] f32
// (written as vec4). One invocation per (token, 32-value chunk).

struct Params {
    n: u32,          // tokens
    nb: u32,         // 32-value chunks per row (hidden / 32)
    row0: u32,       // the first row this part holds
    rows: u32,       // rows this part holds
    zero_from: u32,  // ids from here on are zero rows (0xFFFFFFFF: none)
    scale: f32,      // every value times this (Gemma: √hidden; else 1)
}

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> params: Params;

override WG: u32 = 32u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    if (idx >= params.n * params.nb) {
        return;
    }
    let id = ids[idx / params.nb];
    let kc = idx % params.nb;
    let dst = idx * 8u;
    if (id >= params.zero_from) {
        for (var k = 0u; k < 8u; k++) {
            out[dst + k] = vec4<f32>(0.0);
        }
        return;
    }
    if (id < params.row0 || id - params.row0 >= params.rows) {
        return;
    }
    let c = decode(id - params.row0, kc, params.nb);
    for (var k = 0u; k < 8u; k++) {
        let h = k / 4u;
        out[dst + k] = (c.q[k] * c.d[h] + c.m[h]) * params.scale;
    }
}
