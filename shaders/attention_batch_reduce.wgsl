// Combines the per-split online-softmax states written by attention_batch.wgsl (SPLIT) into the
// normalized output, after attention_reduce_common.wgsl. Row r owns the global splits
// first_split(r) .. first_split(r) + ceil(kv_len(r) / CHUNK); every one of them saw at least one
// key of r in this step (splits of other steps are never read).
//
// batch: the step's rows, as in attention_batch.wgsl: batch[0] = (n_rows, total_splits, _, _),
//        batch[1 + r] = (table_base, kv_len, first_split, 0)
// parts: [total_splits * n_heads, 1 + head_dim/4] vec4, record (global split, head)
// out:   [max_rows, n_heads * head_dim] f32; rows 0..n_rows written, zeros for a row without keys

struct Params {
    max_rows: u32,
    n_heads: u32,
    max_len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> batch: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    let row_head = idx / D4;
    let d = idx % D4;
    let row = row_head / params.n_heads;
    let h = row_head % params.n_heads;
    if (row >= min(batch[0].x, params.max_rows)) {
        return;
    }
    let row_info = batch[1u + row];
    let kv_len = min(row_info.y, params.max_len);
    let n_splits = (kv_len + CHUNK - 1u) / CHUNK;
    // Consecutive splits of a row are n_heads records apart.
    combine(idx, (row_info.z * params.n_heads + h) * (D4 + 1u), params.n_heads * (D4 + 1u), n_splits, d);
}
