// Combines the per-split online-softmax states written by attention_batch.wgsl (SPLIT) into the
// normalized output. One invocation per (row, head, vec4 of head_dim). Row r owns the global
// splits first_split(r) .. first_split(r) + ceil(kv_len(r) / CHUNK); every one of them saw at
// least one key of r in this step (splits of other steps are never read).
//
// batch: the step's rows, as in attention_batch.wgsl: batch[0] = (n_rows, total_splits, 0, 0),
//        batch[1 + r] = (table_base, kv_len, first_split, 0)
// parts: [total_splits * n_heads, 1 + head_dim/4] vec4, record (global split, head) =
//        ((m, l, 0, 0), acc)
// out:   [max_rows, n_heads * head_dim] f32; rows 0..n_rows written, zeros for a row without keys

struct Params {
    max_rows: u32,
    n_heads: u32,
    max_len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> batch: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> parts: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

override D4: u32 = 16u;     // head_dim / 4
override CHUNK: u32 = 128u; // keys per split, as in attention_batch.wgsl
override WG: u32 = 8u;

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
    let stride = params.n_heads * (D4 + 1u);
    let base = (row_info.z * params.n_heads + h) * (D4 + 1u);

    var m = -3.0e38;
    for (var s = 0u; s < n_splits; s++) {
        m = max(m, parts[base + s * stride].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < n_splits; s++) {
        let rec = base + s * stride;
        let w = exp(parts[rec].x - m);
        l += parts[rec].y * w;
        o += parts[rec + 1u + d] * w;
    }
    // No visible key (kv_len 0, or every block unmapped): zeros, not 0 / 0.
    out[row_head * D4 + d] = select(o / l, vec4<f32>(0.0), l == 0.0);
}
