// Combines the per-split online-softmax states written by attention.wgsl (SPLIT) into the
// normalized attention output, after attention_reduce_common.wgsl. Row = t * n_heads + h.
// Token t used splits 0..=positions[t] / CHUNK; each of them saw at least one key of t, so every
// state read here is written in this step (later splits hold stale data and are never read).
//
// positions: [n_tokens] u32
// parts:     [n_tokens * n_heads * max_splits, 1 + head_dim/4] vec4, record (row, split)
// out:       [n_tokens, n_heads * head_dim] f32

struct Params {
    n_rows: u32,      // n_tokens * n_heads
    n_heads: u32,
    max_len: u32,
    max_splits: u32,
}

@group(0) @binding(0) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> params: Params;

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
    combine(idx, row * params.max_splits * (D4 + 1u), D4 + 1u, n_splits, d);
}
