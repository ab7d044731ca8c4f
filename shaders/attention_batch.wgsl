// Batched causal decode attention (llama, GQA) over the paged KV pool (f32 or INT8), for
// continuous batching:
// query row r of a dispatch belongs to its own sequence, described per step by the host in
// `batch`, so one pipeline serves any mix of sequences and lengths without being rebuilt.
//
// One invocation owns one row, one KV head, up to 4 of the query heads sharing that KV head (the
// components of a vec4: heads kv_head * group + 4 * quad + 0..3; a group of more than 4 heads
// takes several quads) and at most CHUNK keys of the row's sequence. Each K/V vec4 it loads
// serves all of its heads: q and the accumulator of head dims [4d, 4d+4) are one mat4x4 per d (a
// column per head). Rows of different sequences read different keys, so lanes are never packed
// across rows: with SmolLM2's 3 heads per KV head one lane of 4 idles.
//
// The key loop is written out per vec4 of head_dim (q0..q31, a0..a31) for the reason given in
// attention.wgsl: on lavapipe, private arrays indexed in a large loop become per-lane gathers
// (2-3x slower). The statements for d >= D4 fold away once D4 is fixed at pipeline creation.
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
// INT8 (src/kv/quant.rs, as in attention.wgsl): the pools hold 8-bit codes, 4 per u32, and one
// f32 scale per key (or value) and KV head, dequantized in registers as they are loaded: the
// codes of a vec4 of head dims become floats, the key's scale multiplies its 4 scores once, and
// the value's scale folds into its softmax weight. No f32 copy of the cache exists.
//
// Loop budget: lavapipe ends all loops of an invocation after 65,535 back-edges in total,
// silently. Here: at most CHUNK (key loop) + log2(max_rows) + 1 (row search) + 4 (write-out).
//
// qkv:         [max_rows, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row
//              (roped); only the q heads are read
// k_pool:      bound as vec4<u32> for both dtypes (see load_k);
//              f32:  [n_blocks, n_kv_heads, block_size, head_dim] f32: key (b, h, s) at vec4
//                    ((b * n_kv_heads + h) * block_size + s) * D4 (bitcast);
//              INT8: the same order in codes, key (b, h, s) at vec4<u32> ((b * n_kv_heads + h) *
//                    block_size + s) * D4 / 4, code d in byte d % 4 of word d / 4 (head_dim a
//                    multiple of 16), then the scales: key g = (b * n_kv_heads + h) *
//                    block_size + s has its f32 scale at word params.scale_base + g
// v_pool:      same layout as k_pool
// block_table: u32; key j of row r's sequence is in physical block
//              block_table[table_base(r) + j / block_size], slot j % block_size. A table index
//              past the table's end or a block >= n_blocks masks those keys (never read).
// batch:       the step's rows, written by the host (AttentionBatch::step):
//              batch[0]     = (n_rows, total_splits, 0, 0)
//              batch[1 + r] = (table_base, kv_len, first_split, 0) for row r < n_rows:
//                             row r attends keys 0..kv_len of its sequence (kv_len = position + 1,
//                             clamped to max_len; 0: a padding row, whose output is zeros);
//                             first_split = sum of ceil(kv_len / CHUNK) over rows 0..r-1
// dst:         SPLIT: [total_splits * n_heads, 1 + head_dim/4] vec4, record (global split, head)
//                     = ((m, l, 0, 0), acc[head_dim/4])
//              else:  out [max_rows, n_heads * head_dim] f32, rows 0..n_rows written

struct Params {
    max_rows: u32,        // rows the batch, qkv and out buffers hold
    n_heads: u32,
    group: u32,           // n_heads / n_kv_heads: query heads per KV head
    quads: u32,           // ceil(group / 4): invocations per (row or split, KV head)
    items_per_split: u32, // quads * n_kv_heads
    qkv_stride4: u32,     // qkv row length in vec4
    n_kv_heads: u32,
    block_size: u32,      // keys per block of the pool
    n_blocks: u32,        // blocks in the pool
    max_len: u32,         // the longest sequence (max_seq_len)
    scale: f32,           // 1 / sqrt(head_dim)
    scale_base: u32,      // INT8: the word where the pools' scales start; unused for f32
}

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_pool: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> block_table: array<u32>;
@group(0) @binding(4) var<storage, read> batch: array<vec4<u32>>;
@group(0) @binding(5) var<uniform> params: Params;
@group(0) @binding(6) var<storage, read_write> dst: array<vec4<f32>>;

override D4: u32 = 16u;      // head_dim / 4, at most 32
override SPLIT: bool = true;
override CHUNK: u32 = 128u;  // keys per invocation: per split, or the single pass's maximum
override WG: u32 = 8u;
override INT8: bool = false;

// Below any score; exp(NEG_BIG - s) is exactly 0 and NEG_BIG - s stays finite.
const NEG_BIG: f32 = -3.0e38;

// K/V loads: with key_stride and the per-key scales in the key loop, the only code that knows
// the pool's element type. key: vec4 index of the key's (or value's) head dims in its pool;
// d: vec4 of head dims. INT8: in units of the key's (value's) scale, applied by the caller once
// per key.
fn load_k(key: u32, d: u32) -> vec4<f32> {
    if (INT8) {
        let w = k_pool[key + d / 4u];
        return codes(w[d % 4u]);
    }
    return bitcast<vec4<f32>>(k_pool[key + d]);
}

fn load_v(key: u32, d: u32) -> vec4<f32> {
    if (INT8) {
        let w = v_pool[key + d / 4u];
        return codes(w[d % 4u]);
    }
    return bitcast<vec4<f32>>(v_pool[key + d]);
}

// vec4 of the pool per key: D4 of f32, D4 / 4 of codes.
fn key_stride() -> u32 {
    return select(D4, D4 / 4u, INT8);
}

// The 4 signed 8-bit codes of a word (byte i = code i) as floats, exactly.
fn codes(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<i32>(bitcast<i32>(w)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Word `i` of a pool read as vec4<u32> (an INT8 scale).
fn k_word(i: u32) -> u32 {
    return k_pool[i / 4u][i % 4u];
}

fn v_word(i: u32) -> u32 {
    return v_pool[i / 4u][i % 4u];
}

// q of the 4 heads for head dims [4d, 4d+4), a column per head, pre-scaled so that scores need
// no multiply per key. base: vec4 index of each head's q in qkv.
fn load_q(d: u32, base: vec4<u32>, valid: vec4<bool>) -> mat4x4<f32> {
    if (d >= D4) {
        return mat4x4<f32>();
    }
    let zero = vec4<f32>(0.0);
    return mat4x4<f32>(
        select(zero, qkv[base.x + d], valid.x),
        select(zero, qkv[base.y + d], valid.y),
        select(zero, qkv[base.z + d], valid.z),
        select(zero, qkv[base.w + d], valid.w),
    ) * params.scale;
}

// The 4 heads' partial scores against the key at `key`, head dims [4d, 4d+4).
fn key_scores(key: u32, d: u32, q: mat4x4<f32>) -> vec4<f32> {
    if (d >= D4) {
        return vec4<f32>(0.0);
    }
    return load_k(key, d) * q;
}

// acc = acc * corr + p * v for head dims [4d, 4d+4), per head (column).
fn accumulate(a: mat4x4<f32>, key: u32, d: u32, corr: vec4<f32>, p: vec4<f32>) -> mat4x4<f32> {
    if (d >= D4) {
        return a;
    }
    let v = load_v(key, d);
    return mat4x4<f32>(a[0] * corr.x + v * p.x, a[1] * corr.y + v * p.y, a[2] * corr.z + v * p.z, a[3] * corr.w + v * p.w);
}

// Column r of a, selected without a runtime matrix index: indexing a0..a31 at run time would
// keep them in memory for the whole shader on some compilers.
fn column(a: mat4x4<f32>, r: u32) -> vec4<f32> {
    return select(select(select(a[0], a[1], r == 1u), a[2], r == 2u), a[3], r == 3u);
}

fn emit(base: u32, d: u32, acc: vec4<f32>, w: f32) {
    if (d >= D4) {
        return;
    }
    dst[base + d] = acc * w;
}

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
    let rest = item % params.items_per_split;
    let kv_head = rest / params.quads;
    let quad = rest % params.quads;
    let n_rows = min(batch[0].x, params.max_rows);
    var row = work;
    if (SPLIT) {
        row = find_row(work, n_rows);
    }
    if (row >= n_rows) {
        return;
    }
    let row_info = batch[1u + row];
    let table_base = row_info.x;
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

    let q0 = load_q(0u, q_base, valid);
    let q1 = load_q(1u, q_base, valid);
    let q2 = load_q(2u, q_base, valid);
    let q3 = load_q(3u, q_base, valid);
    let q4 = load_q(4u, q_base, valid);
    let q5 = load_q(5u, q_base, valid);
    let q6 = load_q(6u, q_base, valid);
    let q7 = load_q(7u, q_base, valid);
    let q8 = load_q(8u, q_base, valid);
    let q9 = load_q(9u, q_base, valid);
    let q10 = load_q(10u, q_base, valid);
    let q11 = load_q(11u, q_base, valid);
    let q12 = load_q(12u, q_base, valid);
    let q13 = load_q(13u, q_base, valid);
    let q14 = load_q(14u, q_base, valid);
    let q15 = load_q(15u, q_base, valid);
    let q16 = load_q(16u, q_base, valid);
    let q17 = load_q(17u, q_base, valid);
    let q18 = load_q(18u, q_base, valid);
    let q19 = load_q(19u, q_base, valid);
    let q20 = load_q(20u, q_base, valid);
    let q21 = load_q(21u, q_base, valid);
    let q22 = load_q(22u, q_base, valid);
    let q23 = load_q(23u, q_base, valid);
    let q24 = load_q(24u, q_base, valid);
    let q25 = load_q(25u, q_base, valid);
    let q26 = load_q(26u, q_base, valid);
    let q27 = load_q(27u, q_base, valid);
    let q28 = load_q(28u, q_base, valid);
    let q29 = load_q(29u, q_base, valid);
    let q30 = load_q(30u, q_base, valid);
    let q31 = load_q(31u, q_base, valid);
    var a0 = mat4x4<f32>();
    var a1 = mat4x4<f32>();
    var a2 = mat4x4<f32>();
    var a3 = mat4x4<f32>();
    var a4 = mat4x4<f32>();
    var a5 = mat4x4<f32>();
    var a6 = mat4x4<f32>();
    var a7 = mat4x4<f32>();
    var a8 = mat4x4<f32>();
    var a9 = mat4x4<f32>();
    var a10 = mat4x4<f32>();
    var a11 = mat4x4<f32>();
    var a12 = mat4x4<f32>();
    var a13 = mat4x4<f32>();
    var a14 = mat4x4<f32>();
    var a15 = mat4x4<f32>();
    var a16 = mat4x4<f32>();
    var a17 = mat4x4<f32>();
    var a18 = mat4x4<f32>();
    var a19 = mat4x4<f32>();
    var a20 = mat4x4<f32>();
    var a21 = mat4x4<f32>();
    var a22 = mat4x4<f32>();
    var a23 = mat4x4<f32>();
    var a24 = mat4x4<f32>();
    var a25 = mat4x4<f32>();
    var a26 = mat4x4<f32>();
    var a27 = mat4x4<f32>();
    var a28 = mat4x4<f32>();
    var a29 = mat4x4<f32>();
    var a30 = mat4x4<f32>();
    var a31 = mat4x4<f32>();
    var m = vec4<f32>(NEG_BIG);
    var l = vec4<f32>(0.0);
    // The block table is read once per block of keys, when j enters it, not per key (no inner
    // loop: every back-edge counts against lavapipe's budget). row_base wraps around u32 so that
    // key j of the current block is at vec4 row_base + j * key_stride(), its INT8 scale at word
    // scale_row + j.
    let table_len = arrayLength(&block_table);
    let stride = key_stride();
    var block_end = key_begin;
    var row_base = 0u;
    var scale_row = 0u;
    var block_ok = false;
    for (var j = key_begin; j < key_end; j++) {
        if (j == block_end) {
            let logical = j / params.block_size;
            let entry = table_base + logical;
            var block = params.n_blocks;
            if (entry < table_len) {
                block = block_table[entry];
            }
            // A missing block reads block 0 (in bounds) and masks its keys.
            block_ok = block < params.n_blocks;
            let first = logical * params.block_size;
            let group = select(0u, (block * params.n_kv_heads + kv_head) * params.block_size, block_ok);
            row_base = group * stride - first * stride;
            scale_row = params.scale_base + group - first;
            block_end = first + params.block_size;
        }
        let key = row_base + j * stride;
        var s = key_scores(key, 0u, q0)
            + key_scores(key, 1u, q1)
            + key_scores(key, 2u, q2)
            + key_scores(key, 3u, q3)
            + key_scores(key, 4u, q4)
            + key_scores(key, 5u, q5)
            + key_scores(key, 6u, q6)
            + key_scores(key, 7u, q7)
            + key_scores(key, 8u, q8)
            + key_scores(key, 9u, q9)
            + key_scores(key, 10u, q10)
            + key_scores(key, 11u, q11)
            + key_scores(key, 12u, q12)
            + key_scores(key, 13u, q13)
            + key_scores(key, 14u, q14)
            + key_scores(key, 15u, q15)
            + key_scores(key, 16u, q16)
            + key_scores(key, 17u, q17)
            + key_scores(key, 18u, q18)
            + key_scores(key, 19u, q19)
            + key_scores(key, 20u, q20)
            + key_scores(key, 21u, q21)
            + key_scores(key, 22u, q22)
            + key_scores(key, 23u, q23)
            + key_scores(key, 24u, q24)
            + key_scores(key, 25u, q25)
            + key_scores(key, 26u, q26)
            + key_scores(key, 27u, q27)
            + key_scores(key, 28u, q28)
            + key_scores(key, 29u, q29)
            + key_scores(key, 30u, q30)
            + key_scores(key, 31u, q31);
        if (INT8) {
            s *= bitcast<f32>(k_word(scale_row + j));
        }
        // Online softmax per head; a masked key gets weight 0 and leaves the max alone.
        let m_new = max(m, select(vec4<f32>(NEG_BIG), s, block_ok));
        let corr = exp(m - m_new);
        var p = select(vec4<f32>(0.0), exp(s - m_new), block_ok);
        m = m_new;
        l = l * corr + p;
        if (INT8) {
            // A masked slot's scale may be any bits (a stale or unwritten slot); keep it out.
            p = select(vec4<f32>(0.0), p * bitcast<f32>(v_word(scale_row + j)), block_ok);
        }
        a0 = accumulate(a0, key, 0u, corr, p);
        a1 = accumulate(a1, key, 1u, corr, p);
        a2 = accumulate(a2, key, 2u, corr, p);
        a3 = accumulate(a3, key, 3u, corr, p);
        a4 = accumulate(a4, key, 4u, corr, p);
        a5 = accumulate(a5, key, 5u, corr, p);
        a6 = accumulate(a6, key, 6u, corr, p);
        a7 = accumulate(a7, key, 7u, corr, p);
        a8 = accumulate(a8, key, 8u, corr, p);
        a9 = accumulate(a9, key, 9u, corr, p);
        a10 = accumulate(a10, key, 10u, corr, p);
        a11 = accumulate(a11, key, 11u, corr, p);
        a12 = accumulate(a12, key, 12u, corr, p);
        a13 = accumulate(a13, key, 13u, corr, p);
        a14 = accumulate(a14, key, 14u, corr, p);
        a15 = accumulate(a15, key, 15u, corr, p);
        a16 = accumulate(a16, key, 16u, corr, p);
        a17 = accumulate(a17, key, 17u, corr, p);
        a18 = accumulate(a18, key, 18u, corr, p);
        a19 = accumulate(a19, key, 19u, corr, p);
        a20 = accumulate(a20, key, 20u, corr, p);
        a21 = accumulate(a21, key, 21u, corr, p);
        a22 = accumulate(a22, key, 22u, corr, p);
        a23 = accumulate(a23, key, 23u, corr, p);
        a24 = accumulate(a24, key, 24u, corr, p);
        a25 = accumulate(a25, key, 25u, corr, p);
        a26 = accumulate(a26, key, 26u, corr, p);
        a27 = accumulate(a27, key, 27u, corr, p);
        a28 = accumulate(a28, key, 28u, corr, p);
        a29 = accumulate(a29, key, 29u, corr, p);
        a30 = accumulate(a30, key, 30u, corr, p);
        a31 = accumulate(a31, key, 31u, corr, p);
    }

    var base = vec4<u32>(0u);
    var w = vec4<f32>(1.0);
    if (SPLIT) {
        // Record (global split, head): ((m, l, 0, 0), acc), left unnormalized.
        base = (work * params.n_heads + h) * (D4 + 1u) + 1u;
    } else {
        base = (row * params.n_heads + h) * D4;
        // No visible key (kv_len 0, or every block unmapped): zeros, not 0 / 0.
        w = select(1.0 / l, vec4<f32>(0.0), l == vec4<f32>(0.0));
    }
    for (var r = 0u; r < 4u; r++) {
        if (!valid[r]) {
            continue;
        }
        if (SPLIT) {
            dst[base[r] - 1u] = vec4<f32>(m[r], l[r], 0.0, 0.0);
        }
        emit(base[r], 0u, column(a0, r), w[r]);
        emit(base[r], 1u, column(a1, r), w[r]);
        emit(base[r], 2u, column(a2, r), w[r]);
        emit(base[r], 3u, column(a3, r), w[r]);
        emit(base[r], 4u, column(a4, r), w[r]);
        emit(base[r], 5u, column(a5, r), w[r]);
        emit(base[r], 6u, column(a6, r), w[r]);
        emit(base[r], 7u, column(a7, r), w[r]);
        emit(base[r], 8u, column(a8, r), w[r]);
        emit(base[r], 9u, column(a9, r), w[r]);
        emit(base[r], 10u, column(a10, r), w[r]);
        emit(base[r], 11u, column(a11, r), w[r]);
        emit(base[r], 12u, column(a12, r), w[r]);
        emit(base[r], 13u, column(a13, r), w[r]);
        emit(base[r], 14u, column(a14, r), w[r]);
        emit(base[r], 15u, column(a15, r), w[r]);
        emit(base[r], 16u, column(a16, r), w[r]);
        emit(base[r], 17u, column(a17, r), w[r]);
        emit(base[r], 18u, column(a18, r), w[r]);
        emit(base[r], 19u, column(a19, r), w[r]);
        emit(base[r], 20u, column(a20, r), w[r]);
        emit(base[r], 21u, column(a21, r), w[r]);
        emit(base[r], 22u, column(a22, r), w[r]);
        emit(base[r], 23u, column(a23, r), w[r]);
        emit(base[r], 24u, column(a24, r), w[r]);
        emit(base[r], 25u, column(a25, r), w[r]);
        emit(base[r], 26u, column(a26, r), w[r]);
        emit(base[r], 27u, column(a27, r), w[r]);
        emit(base[r], 28u, column(a28, r), w[r]);
        emit(base[r], 29u, column(a29, r), w[r]);
        emit(base[r], 30u, column(a30, r), w[r]);
        emit(base[r], 31u, column(a31, r), w[r]);
    }
}
