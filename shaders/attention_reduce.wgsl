// Combines the per-split online-softmax states written by attention.wgsl (SPLIT) into the
// normalized attention output. One invocation per (row, vec4 of head_dim), row = t * n_heads + h.
// Token t used splits 0..=positions[t] / CHUNK; each of them saw at least one key of t, so every
// state read here is written in this step (later splits hold stale data and are never read).
//
// positions: [n_tokens] u32
// parts:     [n_tokens * n_heads * max_splits, 1 + head_dim/4] vec4, record ((m, l, 0, 0), acc)
// out:       [n_tokens, n_heads * head_dim] f32

struct Params {
    n_rows: u32,      // n_tokens * n_heads
    n_heads: u32,
    max_len: u32,
    max_splits: u32,
}

@group(0) @binding(0) var<storage, read> positions: array<u32>;
@group(0) @binding(1) var<storage, read> parts: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

override D4: u32 = 16u;     // head_dim / 4
override CHUNK: u32 = 128u; // keys per split, as in attention.wgsl
override WG: u32 = 8u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let row = idx / D4;
    let d = idx % D4;
    if (row >= params.n_rows) {
        return;
    }
    let t = row / params.n_heads;
    let pos = min(positions[t], params.max_len - 1u);
    let n_splits = min(pos / CHUNK + 1u, params.max_splits);
    let base = row * params.max_splits * (D4 + 1u);

    var m = parts[base].x;
    for (var s = 1u; s < n_splits; s++) {
        m = max(m, parts[base + s * (D4 + 1u)].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < n_splits; s++) {
        let rec = base + s * (D4 + 1u);
        let w = exp(parts[rec].x - m);
        l += parts[rec].y * w;
        o += parts[rec + 1u + d] * w;
    }
    out[row * D4 + d] = o / l;
}
