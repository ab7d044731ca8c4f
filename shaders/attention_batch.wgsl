// Batched causal decode attention (llama, GQA) over the paged KV pool (f32 or INT8), for
// continuous batching: query row r of a dispatch belongs to its own sequence, described per step
// by the host in `batch`, so one pipeline serves any mix of sequences and lengths without being
// rebuilt. After attention_common.wgsl, which holds the bindings 0-5, the loads, the key loop and
// the write-out.
//
// An invocation's 4 lanes are up to 4 of the query heads of one row sharing one KV head (heads
// kv_head * group + 4 * quad + 0..3; a group of more than 4 heads takes several quads). Rows of
// different sequences read different keys, so lanes are never packed across rows: with
// SmolLM2's 3 heads per KV head one lane of 4 idles.
//
// SPLIT (flash-decoding): the keys of each row are cut into CHUNK-key splits, numbered across
// the batch: row r owns the global splits first_split(r) .. first_split(r) + ceil(kv_len / CHUNK),
// so a long row gets many invocations and a short one few, and no invocation idles on a row
// that is shorter than the longest. An invocation finds its row by binary search over the rows'
// first_split and writes its unnormalized online-softmax state (max, sum, acc) for
// attention_batch_reduce.wgsl.
// Without SPLIT (single pass, for steps whose every row has at most CHUNK keys): one invocation
// per (row, KV head, quad) over keys 0..kv_len, writing the normalized output.
//
// Loop budget (see attention_common.wgsl): at most CHUNK (key loop) + log2(max_rows) + 1 (row
// search) + 4 (write-out) back-edges.
//
// batch:       the step's rows, written by the host (AttentionBatch::step):
//              batch[0]     = (n_rows, total_splits, 0, 0)
//              batch[1 + r] = (table_base, kv_len, first_split, 0) for row r < n_rows:
//                             row r attends keys 0..kv_len of its sequence (the last
//                             params.window of them with a sliding window) (kv_len = position + 1,
//                             clamped to max_len; 0: a padding row, whose output is zeros);
//                             first_split = sum of ceil(kv_len / CHUNK) over rows 0..r-1
// dst:         SPLIT: [total_splits * n_heads, 1 + head_dim/4] vec4, record (global split, head)
//                     = ((m, l, 0, 0), acc[head_dim/4])
//              else:  out [max_rows, n_heads * head_dim] f32, rows 0..n_rows written
// (params.rows is max_rows.)

@group(0) @binding(6) var<storage, read> batch: array<vec4<u32>>;

// The row owning global split `work`: the last row whose first split is <= work (first splits
// ascend with the row; rows without keys own none). n_rows when there is none.
fn find_row(work: u32, n_rows: u32) -> u32 {
    if (n_rows == 0u || batch[1u].z > work) {
        return n_rows;
    }
    var lo = 0u;
    var hi = n_rows;
    // [lo, hi) halves every time, whatever the data: at most log2(max_rows) + 1 back-edges.
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (batch[1u + mid].z <= work) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    // SPLIT: the global split; else the row.
    let work = item / params.items_per_split;
    // items_per_split = slices * n_kv_heads * quads, the slice slowest.
    let rest = item % params.items_per_split;
    let per_slice = params.quads * params.n_kv_heads;
    let slice = rest / per_slice;
    let kv_head = (rest % per_slice) / params.quads;
    let quad = rest % params.quads;
    let n_rows = min(batch[0].x, params.rows);
    var row = work;
    if (SPLIT) {
        row = find_row(work, n_rows);
    }
    if (row >= n_rows) {
        return;
    }
    let row_info = batch[1u + row];
    let kv_len = min(row_info.y, params.max_len);
    var key_begin = 0u;
    if (SPLIT) {
        key_begin = (work - row_info.z) * CHUNK;
        // Past the row's last split: the dispatch is rounded up to whole workgroups.
        if (key_begin >= kv_len) {
            return;
        }
    }
    let key_end = min(kv_len, key_begin + CHUNK);

    // Head of each lane within the group; lanes past the group idle (q = 0, never written).
    let lane = vec4<u32>(0u, 1u, 2u, 3u) + 4u * quad;
    let valid = lane < vec4<u32>(params.group);
    let h = kv_head * params.group + lane;
    let q_base = select(vec4<u32>(0u), row * params.qkv_stride4 + h * D4, valid);

    var base = (row * params.n_heads + h) * D4;
    if (SPLIT) {
        // Record (global split, head): ((m, l, 0, 0), acc), left unnormalized.
        base = (work * params.n_heads + h) * (D4 + 1u) + 1u;
    }
    // Every key of the row's window (all keys below kv_len without one) is visible to every lane;
    // a split before the window still writes its (empty) record for the reduce.
    let lim = vec4<u32>(kv_len);
    let low = window_low(lim);
    let keys = Keys(q_base, valid, low, lim, row_info.x, kv_head, min(max(key_begin, low.x), key_end), key_end, slice * D4S);
    attend(keys, Out(base, valid, false, vec4<f32>(0.0), vec4<f32>(0.0)));
}
