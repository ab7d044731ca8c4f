// Causal attention (llama, GQA) over the paged KV cache, f32 or INT8.
//
// One invocation owns 4 query rows of one KV head (the components of a vec4: rows 4*quad..4*quad+3
// of that head, row i = token i / group, head i % group) and a range of at most CHUNK keys. Each
// K/V vec4 it loads serves all 4 rows: q and the accumulator of head dims [4d, 4d+4) are one
// mat4x4 per d (a column per row), so a key costs 2 * head_dim/4 loads for 4 rows.
//
// Why the key loop is written out per vec4 of head_dim (q0..q31, a0..a31) instead of looping over
// arrays: on lavapipe, loops with bodies this large are not unrolled, private arrays indexed in a
// loop become per-lane gathers, and the kernel runs 2-3x slower (measured). The statements for
// d >= D4 fold away once D4 is fixed at pipeline creation.
//
// An invocation never takes more than CHUNK keys: lavapipe ends every loop of an invocation after
// 65,535 back-edges in total (all loops together, LP_MAX_TGSI_LOOP_ITERATIONS), silently.
// SPLIT (flash-decoding): the key range is cut into CHUNK-key splits, one per invocation; each
// writes its unnormalized online-softmax state (max, sum, acc) for attention_reduce.wgsl to combine.
// Without SPLIT (passes, for prefill): one dispatch per CHUNK keys starting at params.pass_begin,
// in order; each merges its keys into the normalized output and the per-row state.
//
// INT8 (src/kv/quant.rs): the pools hold 8-bit codes, 4 per u32, and one f32 scale per key (or
// value) and KV head. They are dequantized in registers as they are loaded: the codes of a
// vec4 of head dims become floats, the key's scale multiplies its 4 scores once, and the value's
// scale folds into its softmax weight. No f32 copy of the cache exists.
//
// qkv:       [n_tokens, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped)
// k_pool:    bound as vec4<u32> for both dtypes;
//            f32:  [n_blocks, n_kv_heads, block_size, head_dim] f32: key (b, h, s) at vec4
//                  ((b * n_kv_heads + h) * block_size + s) * D4 (bitcast);
//            INT8: the same order in codes, key (b, h, s) at vec4<u32> ((b * n_kv_heads + h) *
//                  block_size + s) * D4 / 4, code d in byte d % 4 of word d / 4 (head_dim a
//                  multiple of 16), then the scales: key g = (b * n_kv_heads + h) * block_size + s
//                  has its f32 scale at word params.scale_base + g
// v_pool:    same layout as k_pool
// block_table: u32; key j of the sequence is in physical block block_table[step.table_base +
//            j / block_size], slot j % block_size. Every row of a dispatch belongs to that one
//            sequence. A table index past the table's end or a block >= n_blocks masks the keys.
// positions: [n_tokens] u32; token t attends keys 0..=positions[t] (clamped to max_len - 1)
// dst:       SPLIT: [n_tokens * n_heads * max_splits, 1 + head_dim/4] vec4, record (row, split) =
//                   ((m, l, 0, 0), acc[head_dim/4]) with row = t * n_heads + h
//            else:  out [n_tokens, n_heads * head_dim] f32
// state:     passes: [n_tokens * n_heads] (m, l) of the keys merged so far; unused with SPLIT

struct Params {
    n_tokens: u32,
    n_heads: u32,
    group: u32,           // n_heads / n_kv_heads: query heads per KV head
    max_len: u32,         // the longest sequence (max_seq_len)
    qkv_stride4: u32,     // qkv row length in vec4
    quads: u32,           // ceil(n_tokens * group / 4): invocations per KV head and split
    items_per_split: u32, // quads * n_kv_heads
    max_splits: u32,
    scale: f32,           // 1 / sqrt(head_dim)
    pass_begin: u32,      // first key of this dispatch (passes), a multiple of CHUNK
    n_kv_heads: u32,
    block_size: u32,      // keys per block of the pool
    n_blocks: u32,        // blocks in the pool
    scale_base: u32,      // INT8: the word where the pools' scales start; unused for f32
}

struct Step { table_base: u32 } // the sequence's first entry in block_table, set per step

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_pool: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> state: array<vec2<f32>>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;
@group(0) @binding(8) var<uniform> step: Step;

override D4: u32 = 16u;      // head_dim / 4, at most 32
override SPLIT: bool = false;
override CHUNK: u32 = 128u;  // keys per invocation: per split, or per pass
override WG: u32 = 8u;
override INT8: bool = false;

// Below any score; exp(NEG_BIG - s) is exactly 0 and NEG_BIG - s stays finite.
const NEG_BIG: f32 = -3.0e38;

// q of the 4 rows for head dims [4d, 4d+4), a column per row, pre-scaled so that scores need no
// multiply per key. base: vec4 index of each row's q head in qkv.
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

// The 4 rows' partial scores against the key at vec4 index `row`, head dims [4d, 4d+4)
// (INT8: in units of the key's scale, which the caller applies once per key).
fn k_times_q(row: u32, d: u32, q: mat4x4<f32>) -> vec4<f32> {
    if (d >= D4) {
        return vec4<f32>(0.0);
    }
    if (INT8) {
        let w = k_pool[row + d / 4u];
        return codes(w[d % 4u]) * q;
    }
    return bitcast<vec4<f32>>(k_pool[row + d]) * q;
}

// acc = acc * corr + p * v for head dims [4d, 4d+4), per row (column). INT8: p includes the
// value's scale.
fn accumulate(a: mat4x4<f32>, row: u32, d: u32, corr: vec4<f32>, p: vec4<f32>) -> mat4x4<f32> {
    if (d >= D4) {
        return a;
    }
    var v: vec4<f32>;
    if (INT8) {
        let w = v_pool[row + d / 4u];
        v = codes(w[d % 4u]);
    } else {
        v = bitcast<vec4<f32>>(v_pool[row + d]);
    }
    return mat4x4<f32>(a[0] * corr.x + v * p.x, a[1] * corr.y + v * p.y, a[2] * corr.z + v * p.z, a[3] * corr.w + v * p.w);
}

// Column r of a, selected without a runtime matrix index: indexing a0..a31 at run time would
// keep them in memory for the whole shader on some compilers.
fn column(a: mat4x4<f32>, r: u32) -> vec4<f32> {
    return select(select(select(a[0], a[1], r == 1u), a[2], r == 2u), a[3], r == 3u);
}

// dst[base + d] = acc * w_acc, plus the value there * w_old when merging with earlier passes.
fn emit(base: u32, d: u32, acc: vec4<f32>, w_old: f32, w_acc: f32, merge: bool) {
    if (d >= D4) {
        return;
    }
    var value = acc * w_acc;
    if (merge) {
        value += dst[base + d] * w_old;
    }
    dst[base + d] = value;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let split = item / params.items_per_split;
    if ((SPLIT && split >= params.max_splits) || (!SPLIT && split > 0u)) {
        return;
    }
    let rest = item % params.items_per_split;
    let quad = rest % params.quads;
    let kv_head = rest / params.quads;

    let i = vec4<u32>(0u, 1u, 2u, 3u) + 4u * quad;
    let t = i / params.group;
    let h = kv_head * params.group + i % params.group;
    let valid = t < vec4<u32>(params.n_tokens);
    let tc = min(t, vec4<u32>(params.n_tokens - 1u));
    let pos = vec4<u32>(positions[tc.x], positions[tc.y], positions[tc.z], positions[tc.w]);
    // Keys below lim are visible to a row; 0 for rows past the batch.
    let lim = select(vec4<u32>(0u), min(pos, vec4<u32>(params.max_len - 1u)) + 1u, valid);
    let q_base = select(vec4<u32>(0u), tc * params.qkv_stride4 + h * D4, valid);

    var key_begin = params.pass_begin;
    if (SPLIT) {
        key_begin = split * CHUNK;
    }
    let key_end = min(max(max(lim.x, lim.y), max(lim.z, lim.w)), key_begin + CHUNK);
    if (key_begin >= key_end) {
        return;
    }

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
    // key j of the current block is at vec4 row_base + j * key_vec4, its INT8 scale at word
    // scale_row + j.
    let table_len = arrayLength(&block_table);
    // vec4 loads per key: D4 of f32, D4 / 4 of codes.
    let key_vec4 = select(D4, D4 / 4u, INT8);
    var block_end = key_begin;
    var row_base = 0u;
    var scale_row = 0u;
    var block_ok = false;
    for (var j = key_begin; j < key_end; j++) {
        if (j == block_end) {
            let logical = j / params.block_size;
            let entry = step.table_base + logical;
            var block = params.n_blocks;
            if (entry < table_len) {
                block = block_table[entry];
            }
            // A missing block reads block 0 (in bounds) and masks its keys.
            block_ok = block < params.n_blocks;
            let first = logical * params.block_size;
            let group = select(0u, (block * params.n_kv_heads + kv_head) * params.block_size, block_ok);
            row_base = group * key_vec4 - first * key_vec4;
            scale_row = params.scale_base + group - first;
            block_end = first + params.block_size;
        }
        let row = row_base + j * key_vec4;
        var s = k_times_q(row, 0u, q0)
            + k_times_q(row, 1u, q1)
            + k_times_q(row, 2u, q2)
            + k_times_q(row, 3u, q3)
            + k_times_q(row, 4u, q4)
            + k_times_q(row, 5u, q5)
            + k_times_q(row, 6u, q6)
            + k_times_q(row, 7u, q7)
            + k_times_q(row, 8u, q8)
            + k_times_q(row, 9u, q9)
            + k_times_q(row, 10u, q10)
            + k_times_q(row, 11u, q11)
            + k_times_q(row, 12u, q12)
            + k_times_q(row, 13u, q13)
            + k_times_q(row, 14u, q14)
            + k_times_q(row, 15u, q15)
            + k_times_q(row, 16u, q16)
            + k_times_q(row, 17u, q17)
            + k_times_q(row, 18u, q18)
            + k_times_q(row, 19u, q19)
            + k_times_q(row, 20u, q20)
            + k_times_q(row, 21u, q21)
            + k_times_q(row, 22u, q22)
            + k_times_q(row, 23u, q23)
            + k_times_q(row, 24u, q24)
            + k_times_q(row, 25u, q25)
            + k_times_q(row, 26u, q26)
            + k_times_q(row, 27u, q27)
            + k_times_q(row, 28u, q28)
            + k_times_q(row, 29u, q29)
            + k_times_q(row, 30u, q30)
            + k_times_q(row, 31u, q31);
        let visible = select(vec4<bool>(false), vec4<u32>(j) < lim, block_ok);
        if (INT8) {
            s *= bitcast<f32>(k_word(scale_row + j));
        }
        // Online softmax per row; a masked key gets weight 0 and leaves the max alone.
        let m_new = max(m, select(vec4<f32>(NEG_BIG), s, visible));
        let corr = exp(m - m_new);
        var p = select(vec4<f32>(0.0), exp(s - m_new), visible);
        m = m_new;
        l = l * corr + p;
        if (INT8) {
            // A masked slot's scale may be any bits (a stale or unwritten slot); keep it out.
            p = select(vec4<f32>(0.0), p * bitcast<f32>(v_word(scale_row + j)), visible);
        }
        a0 = accumulate(a0, row, 0u, corr, p);
        a1 = accumulate(a1, row, 1u, corr, p);
        a2 = accumulate(a2, row, 2u, corr, p);
        a3 = accumulate(a3, row, 3u, corr, p);
        a4 = accumulate(a4, row, 4u, corr, p);
        a5 = accumulate(a5, row, 5u, corr, p);
        a6 = accumulate(a6, row, 6u, corr, p);
        a7 = accumulate(a7, row, 7u, corr, p);
        a8 = accumulate(a8, row, 8u, corr, p);
        a9 = accumulate(a9, row, 9u, corr, p);
        a10 = accumulate(a10, row, 10u, corr, p);
        a11 = accumulate(a11, row, 11u, corr, p);
        a12 = accumulate(a12, row, 12u, corr, p);
        a13 = accumulate(a13, row, 13u, corr, p);
        a14 = accumulate(a14, row, 14u, corr, p);
        a15 = accumulate(a15, row, 15u, corr, p);
        a16 = accumulate(a16, row, 16u, corr, p);
        a17 = accumulate(a17, row, 17u, corr, p);
        a18 = accumulate(a18, row, 18u, corr, p);
        a19 = accumulate(a19, row, 19u, corr, p);
        a20 = accumulate(a20, row, 20u, corr, p);
        a21 = accumulate(a21, row, 21u, corr, p);
        a22 = accumulate(a22, row, 22u, corr, p);
        a23 = accumulate(a23, row, 23u, corr, p);
        a24 = accumulate(a24, row, 24u, corr, p);
        a25 = accumulate(a25, row, 25u, corr, p);
        a26 = accumulate(a26, row, 26u, corr, p);
        a27 = accumulate(a27, row, 27u, corr, p);
        a28 = accumulate(a28, row, 28u, corr, p);
        a29 = accumulate(a29, row, 29u, corr, p);
        a30 = accumulate(a30, row, 30u, corr, p);
        a31 = accumulate(a31, row, 31u, corr, p);
    }

    // Rows that saw a key of this split or pass write; the others keep what they have.
    let write = lim > vec4<u32>(key_begin);
    let out_row = t * params.n_heads + h;
    var base: vec4<u32>;
    var w_old = vec4<f32>(0.0);
    var w_acc = vec4<f32>(1.0);
    var merge = false;
    var m_all = m;
    var l_all = l;
    if (SPLIT) {
        // Record: (m, l, 0, 0), then the accumulator.
        base = (out_row * params.max_splits + split) * (D4 + 1u) + 1u;
    } else {
        // Merge with the earlier passes' normalized output, of sum l_old at max m_old.
        merge = key_begin > 0u;
        if (merge) {
            let idx = select(vec4<u32>(0u), out_row, write);
            let s0 = state[idx.x];
            let s1 = state[idx.y];
            let s2 = state[idx.z];
            let s3 = state[idx.w];
            let m_old = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
            m_all = max(m_old, m);
            w_old = vec4<f32>(s0.y, s1.y, s2.y, s3.y) * exp(m_old - m_all);
            w_acc = exp(m - m_all);
        }
        l_all = w_old + l * w_acc;
        // Rows that do not write have l_all = 0; their infinite weights are never used.
        let inv = 1.0 / l_all;
        w_old *= inv;
        w_acc *= inv;
        base = out_row * D4;
    }
    for (var r = 0u; r < 4u; r++) {
        if (!write[r]) {
            continue;
        }
        if (SPLIT) {
            dst[base[r] - 1u] = vec4<f32>(m[r], l[r], 0.0, 0.0);
        } else {
            state[out_row[r]] = vec2<f32>(m_all[r], l_all[r]);
        }
        emit(base[r], 0u, column(a0, r), w_old[r], w_acc[r], merge);
        emit(base[r], 1u, column(a1, r), w_old[r], w_acc[r], merge);
        emit(base[r], 2u, column(a2, r), w_old[r], w_acc[r], merge);
        emit(base[r], 3u, column(a3, r), w_old[r], w_acc[r], merge);
        emit(base[r], 4u, column(a4, r), w_old[r], w_acc[r], merge);
        emit(base[r], 5u, column(a5, r), w_old[r], w_acc[r], merge);
        emit(base[r], 6u, column(a6, r), w_old[r], w_acc[r], merge);
        emit(base[r], 7u, column(a7, r), w_old[r], w_acc[r], merge);
        emit(base[r], 8u, column(a8, r), w_old[r], w_acc[r], merge);
        emit(base[r], 9u, column(a9, r), w_old[r], w_acc[r], merge);
        emit(base[r], 10u, column(a10, r), w_old[r], w_acc[r], merge);
        emit(base[r], 11u, column(a11, r), w_old[r], w_acc[r], merge);
        emit(base[r], 12u, column(a12, r), w_old[r], w_acc[r], merge);
        emit(base[r], 13u, column(a13, r), w_old[r], w_acc[r], merge);
        emit(base[r], 14u, column(a14, r), w_old[r], w_acc[r], merge);
        emit(base[r], 15u, column(a15, r), w_old[r], w_acc[r], merge);
        emit(base[r], 16u, column(a16, r), w_old[r], w_acc[r], merge);
        emit(base[r], 17u, column(a17, r), w_old[r], w_acc[r], merge);
        emit(base[r], 18u, column(a18, r), w_old[r], w_acc[r], merge);
        emit(base[r], 19u, column(a19, r), w_old[r], w_acc[r], merge);
        emit(base[r], 20u, column(a20, r), w_old[r], w_acc[r], merge);
        emit(base[r], 21u, column(a21, r), w_old[r], w_acc[r], merge);
        emit(base[r], 22u, column(a22, r), w_old[r], w_acc[r], merge);
        emit(base[r], 23u, column(a23, r), w_old[r], w_acc[r], merge);
        emit(base[r], 24u, column(a24, r), w_old[r], w_acc[r], merge);
        emit(base[r], 25u, column(a25, r), w_old[r], w_acc[r], merge);
        emit(base[r], 26u, column(a26, r), w_old[r], w_acc[r], merge);
        emit(base[r], 27u, column(a27, r), w_old[r], w_acc[r], merge);
        emit(base[r], 28u, column(a28, r), w_old[r], w_acc[r], merge);
        emit(base[r], 29u, column(a29, r), w_old[r], w_acc[r], merge);
        emit(base[r], 30u, column(a30, r), w_old[r], w_acc[r], merge);
        emit(base[r], 31u, column(a31, r), w_old[r], w_acc[r], merge);
    }
}
