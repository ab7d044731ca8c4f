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
// WG_SPLIT (one dispatch at any context): a workgroup per (row, KV head, quad, slice), its
// invocations splitting the row's keys and combining them in the workgroup
// (attention_common.wgsl), writing the normalized output; no reduce follows.
// No invocation returns before attend() (see attention.wgsl): one with nothing to do attends no
// keys and writes nothing.
//
// Loop budget (see attention_common.wgsl): at most CHUNK (key loop) + log2(max_rows) + 1 (row
// search) + 4 (write-out) back-edges.
//
// batch:       the step's rows, written by the host (AttentionBatch::step):
//              batch[0]     = (n_rows, total_splits, one_row_each, 0): one_row_each 1 when
//                             each sequence has one row (attention_fresh.wgsl works only then)
//              batch[1 + r] = (table_base, kv_len, first_split, 0) for row r < n_rows:
//                             row r attends keys 0..kv_len of its sequence (the last
//                             params.window of them with a sliding window) (kv_len = position + 1,
//                             clamped to max_len; 0: a padding row, whose output is zeros);
//                             first_split = sum of ceil(kv_len / CHUNK) over rows 0..r-1
// dst:         SPLIT: [total_splits * n_heads, 1 + head_dim/4] vec4, record (global split, head)
//                     = ((m, l, 0, 0), acc[head_dim/4])
//              else:  out [max_rows, n_heads * head_dim] f32, rows 0..n_rows written
// state:       WG_SPLIT: the records (attention_common.wgsl), [max_rows * items_per_split] items;
//              else unused
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

// Where row t is (attention_fresh.wgsl): (its position, its sequence's table_base).
fn row_slot(t: u32) -> vec2<u32> {
    let info = batch[1u + t];
    return vec2<u32>(info.y - 1u, info.x);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    let wg_index = ids.wg.x + ids.wg.y * ids.nwg.x;
    // WG_SPLIT: the workgroup's item, every invocation one of WG parts of its keys.
    let item = select(wg_index * WG + ids.lid, wg_index, WG_SPLIT);
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
    // Rows past the step's attend nothing (n_rows is 0 only when nothing runs).
    var busy = row < n_rows;
    let row_info = batch[1u + min(row, max(n_rows, 1u) - 1u)];
    let kv_len = select(0u, min(row_info.y, params.max_len), busy);
    var key_begin = 0u;
    if (SPLIT) {
        key_begin = (work - row_info.z) * CHUNK;
        // Past the row's last split: the dispatch is rounded up to whole workgroups.
        busy = busy && key_begin < kv_len;
        key_begin = min(key_begin, kv_len);
    }
    var key_end = min(kv_len, key_begin + CHUNK);
    if (WG_SPLIT) {
        key_end = kv_len;
    }

    // Head of each lane within the group; lanes past the group idle (q = 0, never written).
    let lane = vec4<u32>(0u, 1u, 2u, 3u) + 4u * quad;
    let valid = (lane < vec4<u32>(params.group)) & vec4<bool>(busy);
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
    var begin = min(max(key_begin, low.x), key_end);
    var end = key_end;
    if (WG_SPLIT) {
        // Part lid of WG: contiguous, so that each reads the block table once per block.
        let first = begin;
        let per = (key_end - first + WG - 1u) / WG;
        begin = min(first + ids.lid * per, key_end);
        end = min(begin + per, key_end);
    }
    // attention_fresh.wgsl: the row's heads roped and its keys written, behind a barrier; only
    // where each sequence has one row (else qkv_heads ran before).
    let fresh = busy && row_info.y > 0u && batch[0].z != 0u;
    before_keys(ids.lid, kv_head, select(vec2<u32>(0u), vec2<u32>(row, row + 1u), fresh));
    let keys = Keys(q_base, valid, low, lim, row_info.x, kv_head, begin, end, slice * D4S, item, ids.lid, group_leader(ids), group_index(ids), group_count(ids), kv_lane(ids));
    attend(keys, Out(base, valid, false, vec4<f32>(0.0), vec4<f32>(0.0)));
}
