// Causal attention (llama, GQA) over the paged KV cache, f32 or INT8: every row of a dispatch
// belongs to ONE sequence (one table_base, set per step in `step`). After attention_common.wgsl,
// which holds the bindings 0-5, the loads, the key loop and the write-out.
//
// An invocation's 4 lanes are 4 query rows of one KV head: rows 4*quad..4*quad+3 of that head,
// row i = token i / group, head i % group (for SmolLM2's decode: the 3 query heads of a group).
// SPLIT (flash-decoding): the key range is cut into CHUNK-key splits, one per invocation; each
// writes its unnormalized online-softmax state (max, sum, acc) for attention_reduce.wgsl to combine.
// Without SPLIT (passes, for prefill): one dispatch per CHUNK keys starting at params.pass_begin,
// in order; each merges its keys into the normalized output and the per-row state.
// WG_SPLIT (decode and short prefill chunks, one dispatch): a workgroup per item (rows quad, KV
// head, slice), its invocations splitting all the item's keys and combining them in the
// workgroup (attention_common.wgsl); no reduce follows.
// No invocation returns before attend(): with WG_SPLIT it holds a barrier and subgroup
// reductions, and WGSL's uniformity analysis does not follow override constants, so every mode
// keeps its control flow uniform up to there (an invocation with nothing to do attends no keys
// and writes nothing).
//
// positions: [n_tokens] u32; token t attends keys 0..=positions[t] (clamped to max_len - 1), only
//            the last params.window of them with a sliding window
// dst:       SPLIT: [n_tokens * n_heads * max_splits, 1 + head_dim/4] vec4, record (row, split) =
//                   ((m, l, 0, 0), acc[head_dim/4]) with row = t * n_heads + h
//            else:  out [n_tokens, n_heads * head_dim] f32
// state:     passes: [n_tokens * n_heads * slices] (m, l, 0, 0) of the keys merged so far (each
//            slice its own copy: the slices of a row run side by side); WG_SPLIT: the records
//            (attention_common.wgsl); unused with SPLIT
// (params.rows is n_tokens.)

struct Step { table_base: u32 } // the sequence's first entry in block_table, set per step

@group(0) @binding(6) var<storage, read> positions: array<u32>;
@group(0) @binding(8) var<uniform> step: Step;

// Where row t is (attention_fresh.wgsl): (its position, the sequence's table_base).
fn row_slot(t: u32) -> vec2<u32> {
    return vec2<u32>(positions[t], step.table_base);
}

@compute @workgroup_size(WG)
fn main(ids: Ids) {
    let wg_index = ids.wg.x + ids.wg.y * ids.nwg.x;
    // WG_SPLIT: the workgroup's item, every invocation one of WG parts of its keys.
    let item = select(wg_index * WG + ids.lid, wg_index, WG_SPLIT);
    let split = item / params.items_per_split;
    // Invocations past the dispatch's items (it is rounded up to whole workgroups) attend nothing.
    let busy = !((SPLIT && split >= params.max_splits) || (!SPLIT && split > 0u));
    // items_per_split = slices * n_kv_heads * quads, the slice slowest.
    let rest = item % params.items_per_split;
    let per_slice = params.quads * params.n_kv_heads;
    let slice = rest / per_slice;
    let quad = rest % params.quads;
    let kv_head = (rest % per_slice) / params.quads;

    let i = vec4<u32>(0u, 1u, 2u, 3u) + 4u * quad;
    let t = i / params.group;
    let h = kv_head * params.group + i % params.group;
    let valid = (t < vec4<u32>(params.rows)) & vec4<bool>(busy);
    let tc = min(t, vec4<u32>(params.rows - 1u));
    let pos = vec4<u32>(positions[tc.x], positions[tc.y], positions[tc.z], positions[tc.w]);
    // Keys below lim are visible to a row; 0 for rows past the batch.
    let lim = select(vec4<u32>(0u), min(pos, vec4<u32>(params.max_len - 1u)) + 1u, valid);
    let q_base = select(vec4<u32>(0u), tc * params.qkv_stride4 + h * D4, valid);

    var key_begin = params.pass_begin;
    if (SPLIT) {
        key_begin = split * CHUNK;
    }
    var key_end = min(max(max(lim.x, lim.y), max(lim.z, lim.w)), key_begin + CHUNK);
    if (WG_SPLIT) {
        key_end = max(max(lim.x, lim.y), max(lim.z, lim.w));
    }
    // Nothing to attend (no valid lane sees a key here): an empty key range, and no lane writes.
    key_end = max(key_end, key_begin);

    // Rows that see a key of this split or pass write; the others keep what they have.
    let write = lim > vec4<u32>(key_begin);
    let out_row = t * params.n_heads + h;
    var out = Out(vec4<u32>(0u), write, false, vec4<f32>(0.0), vec4<f32>(0.0));
    if (SPLIT) {
        // Record: (m, l, 0, 0), then the accumulator.
        out.base = (out_row * params.max_splits + split) * (D4 + 1u) + 1u;
    } else {
        out.base = out_row * D4;
        // Merge with the earlier passes' normalized output, of sum l_old at max m_old.
        out.merge = key_begin > 0u;
        if (out.merge) {
            let idx = select(vec4<u32>(0u), out_row * params.slices + slice, write);
            let s0 = state[idx.x].xy;
            let s1 = state[idx.y].xy;
            let s2 = state[idx.z].xy;
            let s3 = state[idx.w].xy;
            out.m_old = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
            out.l_old = vec4<f32>(s0.y, s1.y, s2.y, s3.y);
        }
    }
    // Keys before every lane's window are skipped, but a lane that writes in this split or pass
    // still writes (an empty record, or its state merged unchanged), so that the reduce and the
    // later passes read only what this step wrote.
    let low = window_low(lim);
    let low_valid = select(vec4<u32>(0xffffffffu), low, valid);
    let first = min(max(key_begin, min(min(low_valid.x, low_valid.y), min(low_valid.z, low_valid.w))), key_end);
    var begin = first;
    var end = key_end;
    if (WG_SPLIT) {
        // Part lid of WG: contiguous, so that each reads the block table once per block.
        let per = (key_end - first + WG - 1u) / WG;
        begin = min(first + ids.lid * per, key_end);
        end = min(begin + per, key_end);
    }
    if (SHARED_KV) {
        // The subgroup walks the union of its invocations' keys (each lane masks the others').
        let span = shared_span(begin, end);
        begin = span.x;
        end = span.y;
    }
    // attention_fresh.wgsl: the step's heads roped and their keys written, behind a barrier.
    before_keys(ids.lid, kv_head, vec2<u32>(0u, params.rows));
    let leader = group_leader(ids);
    let keys = Keys(q_base, valid, low, lim, step.table_base, kv_head, begin, end, slice * D4S, item, ids.lid, leader, group_index(ids), group_count(ids), kv_lane(ids));
    let merged = attend(keys, out);
    if (!SPLIT && !WG_SPLIT) {
        for (var r = 0u; r < 4u; r++) {
            if (write[r]) {
                state[out_row[r] * params.slices + slice] = vec4<f32>(merged.m[r], merged.l[r], 0.0, 0.0);
            }
        }
    }
}
