// The second prelude of the decode attention that appends its step's own keys (attention_read.wgsl
// is the other, with the same names), after rope_common.wgsl and kv_codes.wgsl and before
// attention_common.wgsl. Its before_keys(), which a body calls before the key loop, does for the
// workgroup's KV head and rows what qkv_heads.wgsl (without QK_NORM) does: the q heads of the KV
// head and its k head roped in place in qkv, then the roped k head and the v head written to the
// pool at the row's position (f32 or INT8); then a storage barrier, after which the key loop reads
// the new keys from the pool like the others. Same arithmetic as qkv_heads.wgsl, so the results
// are those of qkv_heads then attention bit for bit, in one dispatch instead of two. The body
// says where a row is: row_slot(t) = (its position, its sequence's table_base) (attention.wgsl:
// `positions` and `step`; attention_batch.wgsl: its batch record).
//
// Only where one workgroup owns every query row, head and head dim of its KV head that any other
// row of the step could read (WG_SPLIT, one lane quad per KV head, one slice; in a batch, each
// sequence in one row: src/gpu/ops/attention checks), so that no other workgroup reads what it
// writes. params.turns holds the layer's turn table.
//
// Loop budget (attention_common.wgsl): before_keys adds at most head_dim / 2 (RoPE) + head_dim
// (the INT8 maximum) + head_dim / 4 (codes) + 1 back-edges per invocation (113 for SmolLM2's 64,
// 225 at the 128 this kernel takes), within the margin MAX_CHUNK leaves below lavapipe's 65,535.

@group(0) @binding(0) var<storage, read_write> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> k_pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v_pool: array<vec4<u32>>;

fn qkv_get(i: u32) -> f32 {
    return qkv[i / 4u][i % 4u];
}

fn qkv_set(i: u32, value: f32) {
    qkv[i / 4u][i % 4u] = value;
}

// kv_codes.wgsl's accessors: the heads come from qkv, the pools are read as vec4 of words.
fn kv_src(i: u32) -> f32 {
    return qkv_get(i);
}

fn pool_store(is_v: bool, word: u32, value: u32) {
    if (is_v) {
        v_pool[word / 4u][word % 4u] = value;
    } else {
        k_pool[word / 4u][word % 4u] = value;
    }
}

// Items per row: the group's q heads, its k head, its v head (in that order).
fn fresh_items() -> u32 {
    return params.group + 2u;
}

// Row t's k head (is_v false) or v head at qkv element `base` into the pool at the row's
// position, through kv_codes.wgsl's slot rule and stores (nothing for a table index past the
// table or a block >= n_blocks).
fn store_head(is_v: bool, t: u32, kv_head: u32, base: u32) {
    let slot = row_slot(t);
    let group = kv_slot(slot.x, slot.y, kv_head, params.n_kv_heads, params.block_size, params.n_blocks);
    if (group == NO_GROUP) {
        return;
    }
    let dim = 4u * D4;
    if (INT8) {
        store_int8(is_v, group, base, dim, params.scale_base);
    } else {
        store_f32(is_v, group * dim, base, 0u, dim);
    }
}

// Every invocation of the workgroup calls this (it holds the barrier): items (row of rows.x ..
// rows.y, head of KV head kv_head) spread over the invocations, each roping (q and k heads) and
// storing (k and v heads) its head.
fn before_keys(lid: u32, kv_head: u32, rows: vec2<u32>) {
    let dim = 4u * D4;
    let half = dim / 2u;
    let per_row = fresh_items();
    for (var item = lid; item < (rows.y - rows.x) * per_row; item += WG) {
        let t = rows.x + item / per_row;
        let k = item % per_row;
        var head = kv_head * params.group + k;
        if (k >= params.group) {
            head = params.n_heads + (k - params.group) * params.n_kv_heads + kv_head;
        }
        let base = t * 4u * params.qkv_stride4 + head * dim;
        if (k <= params.group) {
            let pos = row_slot(t).x;
            for (var pair = 0u; pair < half; pair += 1u) {
                let dims = pair_dims(pair, half);
                let j = base + dims.x;
                let r = rotated(vec2<f32>(qkv_get(j), qkv_get(j + dims.y)), pair_sin_cos(params.turns[pair / 2u], pair, pos));
                qkv_set(j, r.x);
                qkv_set(j + dims.y, r.y);
            }
        }
        if (k >= params.group) {
            store_head(k > params.group, t, kv_head, base);
        }
    }
    storageBarrier();
}
