// The prelude of the two attention kernels (attention.wgsl: one sequence per dispatch;
// attention_batch.wgsl: a sequence per row), prepended to each kernel's body when its module is
// created (src/gpu/shaders.rs), after attention_group.wgsl or attention_group_subgroup.wgsl (the
// invocation ids and the in-register group reductions) and attention_read.wgsl or
// attention_fresh.wgsl (the qkv and pool bindings, and what runs before the key loop). It holds what both run: the bindings they
// share, the q and K/V loads (f32 or INT8), the key loop over the paged pool with its online
// softmax, and the write-out. A kernel's body says only which lanes, keys and output records an
// invocation takes.
//
// WG_SPLIT (decode, one dispatch at any context): a workgroup owns one item (4 lanes of one KV
// head, one slice) and its WG invocations split the item's keys into WG contiguous parts. They
// combine their online-softmax states in the workgroup, so that no reduce kernel follows: first
// in registers per group (a subgroup, with subgroup reductions, or each invocation alone), then
// each group's leader writes a record (per lane (m, l) and acc) to `state`, a storage barrier, and
// every invocation normalizes some of the item's output vec4 from the records. ONE_GROUP (the
// workgroup is one subgroup) needs neither records nor barrier: the leader writes the output. The
// body calls attend() in uniform control flow (no return before it depends on the invocation),
// as the barrier and the subgroup reductions require.
//
// One invocation owns 4 lanes (the components of a vec4: 4 query rows, or 4 query heads, of one
// KV head) and a range of at most CHUNK keys of one sequence. Each K/V vec4 it loads serves all 4
// lanes: q and the accumulator of head dims [4d, 4d+4) are one mat4x4 per d (a column per lane),
// so a key costs 2 * head_dim/4 loads for 4 lanes. No shared memory, no barriers: both are costly
// on CPU adapters (lavapipe, SwiftShader).
//
// Why the key loop is written out per vec4 of head_dim (q0..q31, a0..a31) instead of looping over
// arrays: on lavapipe, loops with bodies this large are not unrolled, private arrays indexed in a
// loop become per-lane gathers, and the kernel runs 2-3x slower (measured). The statements for
// d >= D4 fold away once D4 is fixed at pipeline creation.
//
// Heads wider than 32 vec4 (Gemma 3's 256) are cut into slices of D4S vec4 (SLICED): an
// invocation accumulates one slice of the output dims, and computes each key's whole score in a
// small loop over the head dims that reads q from qkv (still one invocation per 4 lanes). Writing
// out 64 vec4 of q and accumulator instead makes a pipeline take minutes to compile on lavapipe.
// The slices of a row compute the same scores, so they write the same (m, l).
//
// Loop budget: lavapipe ends every loop of an invocation after 65,535 back-edges in total (all
// loops together, LP_MAX_TGSI_LOOP_ITERATIONS), silently. attend() takes at most CHUNK keys with
// no inner loop (SLICED: D4 / 8 back-edges per key, so CHUNK * (D4 / 8 + 1) in all), plus 4 back-edges of
// write-out.
//
// INT8 (crate::quant::kv_int8): the pools hold 8-bit codes, 4 per u32, and one f32 scale per key
// (or value) and KV head. They are dequantized in registers as they are loaded: the codes of a
// vec4 of head dims become floats, the key's scale multiplies its 4 scores once, and the value's
// scale folds into its softmax weight. No f32 copy of the cache exists.
//
// qkv:         [rows, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped);
//              only the q heads are read
// k_pool:      bound as vec4<u32> for both dtypes;
//              f32:  [n_blocks, n_kv_heads, block_size, head_dim] f32: key (b, h, s) at vec4
//                    ((b * n_kv_heads + h) * block_size + s) * D4 (bitcast);
//              INT8: the same order in codes, key (b, h, s) at vec4<u32> ((b * n_kv_heads + h) *
//                    block_size + s) * D4 / 4, code d in byte d % 4 of word d / 4 (head_dim a
//                    multiple of 16), then the scales: key g = (b * n_kv_heads + h) *
//                    block_size + s has its f32 scale at word params.scale_base + g
// v_pool:      same layout as k_pool
// block_table: u32; key j of a sequence whose table row starts at table_base is in physical block
//              block_table[table_base + j / block_size], slot j % block_size. A table index past
//              the table's end or a block >= n_blocks masks those keys.
// dst:         the kernel's output records (see each body): SPLIT, one unnormalized record
//              ((m, l, 0, 0), acc[head_dim/4]) per split and head; else the normalized output.
// state:       WG_SPLIT: [items, WG, 2 + 4 * D4S] vec4, the record of group s (an invocation, or a
//              subgroup: group_index) of workgroup g at ((g * WG + s) * (2 + 4 * D4S)), group_count
//              of them used: per lane m, per lane l, then for each vec4 i of
//              the slice's head dims the 4 lanes' accumulators (acc[i] of lane r at 2 + 4 * i + r),
//              unnormalized; a record with l = 0 holds no keys (its accumulators are never read).
//              Without WG_SPLIT see each body.

// The parameters of both kernels (read-only storage, see Context::params_init); fields marked
// with one kernel are unused by the other.
struct Params {
    rows: u32,            // query rows qkv and the output hold (single: n_tokens; batch: max_rows)
    n_heads: u32,
    group: u32,           // n_heads / n_kv_heads: query heads per KV head
    quads: u32,           // lane quads per KV head: invocations per (split or row, KV head)
    items_per_split: u32, // quads * n_kv_heads
    qkv_stride4: u32,     // qkv row length in vec4
    n_kv_heads: u32,
    block_size: u32,      // keys per block of the pool
    n_blocks: u32,        // blocks in the pool
    max_len: u32,         // the longest sequence (max_seq_len)
    scale: f32,           // 1 / sqrt(head_dim)
    scale_base: u32,      // INT8: the word where the pools' scales start; unused for f32
    max_splits: u32,      // single: splits per row (1 without SPLIT)
    pass_begin: u32,      // single, passes: first key of this dispatch, a multiple of CHUNK
    window: u32,          // sliding window: a query at position p sees keys p - window < j <= p; 0: all
    slices: u32,          // D4 / D4S: invocations per lane quad, one per slice of the head dims
    // attention_fresh.wgsl only: rope_common.wgsl's turn table of the layer (empty otherwise).
    turns: array<vec4<u32>>,
}

// qkv (binding 0) and the pools (bindings 1, 2) are declared by the prelude before this one:
// read-only (attention_read.wgsl), or read_write where the kernel writes its step's heads
// (attention_fresh.wgsl).
@group(0) @binding(3) var<storage, read> block_table: array<u32>;
@group(0) @binding(4) var<storage, read> params: Params;
@group(0) @binding(5) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> state: array<vec4<f32>>;

override D4: u32 = 16u;      // head_dim / 4
override D4S: u32 = 16u;     // vec4 of head dims one invocation accumulates: D4, or 32 with SLICED
override SLICED: bool = false;
override SPLIT: bool = false;
override CHUNK: u32 = 128u;  // keys per invocation
override WG: u32 = 8u;
override INT8: bool = false;
override WG_SPLIT: bool = false;
override ONE_GROUP: bool = false; // WG_SPLIT with subgroups where the workgroup is one subgroup
// Passes on devices with subgroups of 8 or more: every invocation of a subgroup attends the same
// keys of one KV head (the body walks their union; src/gpu/ops/attention pads each KV head's lane
// quads to whole workgroups), so 8 lanes share each key's loads (load_lanes) and broadcast them.
// On lavapipe a storage load is a loop over the SIMD lanes and a broadcast one vector instruction.
override SHARED_KV: bool = false;

// vec4 of one WG_SPLIT record in `state`.
const REC_HEAD: u32 = 2u;
fn record_len() -> u32 {
    return REC_HEAD + 4u * D4S;
}

// The first key a query whose keys end below `lim` sees: lim - window, or 0 (no window, or a
// window longer than the keys).
fn window_low(lim: vec4<u32>) -> vec4<u32> {
    let w = vec4<u32>(params.window);
    return select(vec4<u32>(0u), lim - w, (lim > w) & vec4<bool>(params.window > 0u));
}

// Below any score; exp(NEG_BIG - s) is exactly 0 and NEG_BIG - s stays finite.
const NEG_BIG: f32 = -3.0e38;

// Scores soft-capped to SOFTCAP * tanh(s / SOFTCAP) before the softmax (Gemma 2); 0: none. tanh
// from one exp of a non-positive argument (no overflow at any |s|), as softcap.wgsl.
override SOFTCAP: f32 = 0.0;

fn soft_capped(s: vec4<f32>) -> vec4<f32> {
    let t = s / SOFTCAP;
    let e = exp(-2.0 * abs(t));
    return SOFTCAP * sign(t) * (1.0 - e) / (1.0 + e);
}

// q of the 4 lanes for head dims [4d, 4d+4), a column per lane, pre-scaled so that scores need no
// multiply per key. base: vec4 index of each lane's q head in qkv.
fn load_q(d: u32, base: vec4<u32>, valid: vec4<bool>) -> mat4x4<f32> {
    if (d >= D4 || SLICED) {
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

// Head dims [4d, 4d+4) of the key (is_v false) or the value at vec4 index `row` as floats (INT8:
// its codes, in units of its scale, which the caller applies): SHARED_KV from the lane that loaded
// them (`kl`), else loaded here. is_v is a constant at every call.
fn kv_dims(is_v: bool, row: u32, d: u32, kl: KvLanes) -> vec4<f32> {
    let n = select(d, d / 4u, INT8);
    var w: vec4<u32>;
    if (SHARED_KV && is_v) {
        w = shared_vec4(kl.v0, kl.v1, kl.v2, kl.v3, n);
    } else if (SHARED_KV) {
        w = shared_vec4(kl.k0, kl.k1, kl.k2, kl.k3, n);
    } else if (is_v) {
        w = v_pool[row + n];
    } else {
        w = k_pool[row + n];
    }
    if (INT8) {
        return codes(w[d % 4u]);
    }
    return bitcast<vec4<f32>>(w);
}

// The 4 lanes' partial scores against the key at vec4 index `row`, head dims [4d, 4d+4)
// (INT8: in units of the key's scale, which the caller applies once per key).
fn k_times_q(row: u32, d: u32, q: mat4x4<f32>, kl: KvLanes) -> vec4<f32> {
    if (d >= D4) {
        return vec4<f32>(0.0);
    }
    return kv_dims(false, row, d, kl) * q;
}

// SHARED_KV: a key's (or value's) vec4s, lane l of the subgroup holding vec4s l, 8 + l, 16 + l and
// 24 + l of the row (repeating its last vec4 past the row's end), so that each invocation loads 4
// of the up to 32 vec4 (f32; 8 of codes) instead of all.
struct KvLanes {
    k0: vec4<u32>,
    k1: vec4<u32>,
    k2: vec4<u32>,
    k3: vec4<u32>,
    v0: vec4<u32>,
    v1: vec4<u32>,
    v2: vec4<u32>,
    v3: vec4<u32>,
}

// SHARED_KV: this lane's share of the key and value at vec4 index `row` (zeros, nothing loaded,
// without SHARED_KV).
fn load_lanes(row: u32, lane: u32) -> KvLanes {
    var kl = KvLanes();
    if (!SHARED_KV) {
        return kl;
    }
    let last = select(D4, D4 / 4u, INT8) - 1u;
    kl.k0 = k_pool[row + min(lane, last)];
    kl.v0 = v_pool[row + min(lane, last)];
    if (last >= 8u) {
        kl.k1 = k_pool[row + min(8u + lane, last)];
        kl.v1 = v_pool[row + min(8u + lane, last)];
    }
    if (last >= 16u) {
        kl.k2 = k_pool[row + min(16u + lane, last)];
        kl.v2 = v_pool[row + min(16u + lane, last)];
    }
    if (last >= 24u) {
        kl.k3 = k_pool[row + min(24u + lane, last)];
        kl.v3 = v_pool[row + min(24u + lane, last)];
    }
    return kl;
}

// SHARED_KV: vec4 n of the row whose lane shares are x0..x3 (n a constant once inlined).
fn shared_vec4(x0: vec4<u32>, x1: vec4<u32>, x2: vec4<u32>, x3: vec4<u32>, n: u32) -> vec4<u32> {
    let g = n / 8u;
    return from_lane(select(select(select(x0, x1, g == 1u), x2, g == 2u), x3, g == 3u), n % 8u);
}

// SLICED: the 4 lanes' whole scores against the key at vec4 index `row`, q read from qkv (INT8: in
// units of the key's scale), 8 vec4 of head dims per iteration (D4 a multiple of 8): D4 / 8
// back-edges. Lanes without a query read the q at base 0 (in bounds); their scores are never used.
fn score_loop(row: u32, base: vec4<u32>) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var d0 = 0u; d0 < D4; d0 += 8u) {
        s += score_term(row, base, d0 + 0u);
        s += score_term(row, base, d0 + 1u);
        s += score_term(row, base, d0 + 2u);
        s += score_term(row, base, d0 + 3u);
        s += score_term(row, base, d0 + 4u);
        s += score_term(row, base, d0 + 5u);
        s += score_term(row, base, d0 + 6u);
        s += score_term(row, base, d0 + 7u);
    }
    return s * params.scale;
}

// The 4 lanes' partial scores over head dims [4d, 4d+4), q read from qkv.
fn score_term(row: u32, base: vec4<u32>, d: u32) -> vec4<f32> {
    let q = mat4x4<f32>(qkv[base.x + d], qkv[base.y + d], qkv[base.z + d], qkv[base.w + d]);
    // SLICED never shares loads (src/gpu/ops/attention): kv_dims loads the key itself.
    return kv_dims(false, row, d, KvLanes()) * q;
}

// acc = acc * corr + p * v for head dims [4d, 4d+4), d = dim0 + i, per lane (column). INT8: p
// includes the value's scale. SHARED_KV: v from the lane that loaded it (`kl`, kv_dims).
fn accumulate(a: mat4x4<f32>, row: u32, kl: KvLanes, dim0: u32, i: u32, corr: vec4<f32>, p: vec4<f32>) -> mat4x4<f32> {
    if (i >= D4S) {
        return a;
    }
    let v = kv_dims(true, row, dim0 + i, kl);
    return mat4x4<f32>(a[0] * corr.x + v * p.x, a[1] * corr.y + v * p.y, a[2] * corr.z + v * p.z, a[3] * corr.w + v * p.w);
}

// Column r of a, selected without a runtime matrix index: indexing a0..a31 at run time would
// keep them in memory for the whole shader on some compilers.
fn column(a: mat4x4<f32>, r: u32) -> vec4<f32> {
    return select(select(select(a[0], a[1], r == 1u), a[2], r == 2u), a[3], r == 3u);
}

// dst[base + d] = acc * w_acc, d = dim0 + i, plus the value there * w_old when merging with
// earlier passes.
fn emit(base: u32, dim0: u32, i: u32, acc: vec4<f32>, w_old: f32, w_acc: f32, merge: bool) {
    if (i >= D4S) {
        return;
    }
    let d = dim0 + i;
    var value = acc * w_acc;
    if (merge) {
        value += dst[base + d] * w_old;
    }
    dst[base + d] = value;
}

// WG_SPLIT: a's columns (lanes) scaled by w and summed over the invocation's group, for head dims
// vec4 i of the slice.
fn group_scaled(a: mat4x4<f32>, i: u32, w: vec4<f32>) -> mat4x4<f32> {
    if (i >= D4S) {
        return a;
    }
    return mat4x4<f32>(group_sum(a[0] * w.x), group_sum(a[1] * w.y), group_sum(a[2] * w.z), group_sum(a[3] * w.w));
}

// WG_SPLIT: the 4 lanes' accumulators of head dims vec4 i into the record at `rec`.
fn put_record(rec: u32, i: u32, a: mat4x4<f32>) {
    if (i >= D4S) {
        return;
    }
    let at = rec + REC_HEAD + 4u * i;
    state[at] = a[0];
    state[at + 1u] = a[1];
    state[at + 2u] = a[2];
    state[at + 3u] = a[3];
}

// WG_SPLIT, after the barrier: the workgroup's records combined into the normalized output, each
// invocation taking the output vec4 o = lid, lid + WG, ... of the item's 4 * D4S (lane o % 4,
// head dims vec4 o / 4 of the slice) over the workgroup's group_count records (its subgroups', so
// on a GPU a few loads each, not one per invocation). Zeros for a lane that saw no visible key.
// Loop budget: (4 * D4S / WG + 1) * (2 * WG + 1) at most.
fn combine_records(keys: Keys, out: Out) {
    let first = keys.item * WG * record_len();
    for (var o = keys.lid; o < 4u * D4S; o += WG) {
        let r = o % 4u;
        let i = o / 4u;
        if (!out.write[r]) {
            continue;
        }
        var m = NEG_BIG;
        for (var s = 0u; s < keys.groups; s++) {
            m = max(m, state[first + s * record_len()][r]);
        }
        var l = 0.0;
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < keys.groups; s++) {
            let rec = first + s * record_len();
            let l_s = state[rec + 1u][r];
            let w = exp(state[rec][r] - m);
            l += l_s * w;
            // select, not a product: a record without keys holds stale accumulators.
            acc += select(vec4<f32>(0.0), state[rec + REC_HEAD + 4u * i + r] * w, l_s > 0.0);
        }
        dst[out.base[r] + keys.dim0 + i] = select(acc / l, vec4<f32>(0.0), l == 0.0);
    }
}

// What one invocation attends: its 4 lanes over keys begin..end of one sequence.
struct Keys {
    q_base: vec4<u32>,  // vec4 index of each lane's q head in qkv
    valid: vec4<bool>,  // lanes that hold a query (the others read q = 0)
    low: vec4<u32>,     // a lane sees the keys from its low (its window's first key) ...
    lim: vec4<u32>,     // ... to below its lim
    table_base: u32,    // the sequence's first entry in block_table
    kv_head: u32,
    begin: u32,
    end: u32,
    dim0: u32,          // the first vec4 of head dims this invocation accumulates (its slice)
    // WG_SPLIT only: the workgroup's item (its records), the invocation in it, whether it leads
    // its group, its group's index (its record) and the workgroup's count of groups (records).
    item: u32,
    lid: u32,
    leader: bool,
    group: u32,
    groups: u32,
    // SHARED_KV: the invocation's lane among the 8 that share each key's loads.
    lane: u32,
}

// Where an invocation writes its lanes.
struct Out {
    base: vec4<u32>,    // dst vec4 of each lane's head dim 0 (SPLIT: after its record's header)
    write: vec4<bool>,  // lanes that write
    // Without SPLIT: fold the keys into the output dst already holds, normalized over an
    // earlier softmax state (m_old, l_old) (the passes after the first).
    merge: bool,
    m_old: vec4<f32>,
    l_old: vec4<f32>,
}

// Each lane's softmax state over all keys written so far: max score and sum of weights.
struct Softmax {
    m: vec4<f32>,
    l: vec4<f32>,
}

// Attends `keys` and writes each lane of `out`: SPLIT, its record ((m, l, 0, 0), acc) left
// unnormalized; else the normalized output (merged with the earlier passes' with out.merge; zeros
// for a lane that saw no visible key). Returns the lanes' merged softmax state.
fn attend(keys: Keys, out: Out) -> Softmax {
    let q0 = load_q(0u, keys.q_base, keys.valid);
    let q1 = load_q(1u, keys.q_base, keys.valid);
    let q2 = load_q(2u, keys.q_base, keys.valid);
    let q3 = load_q(3u, keys.q_base, keys.valid);
    let q4 = load_q(4u, keys.q_base, keys.valid);
    let q5 = load_q(5u, keys.q_base, keys.valid);
    let q6 = load_q(6u, keys.q_base, keys.valid);
    let q7 = load_q(7u, keys.q_base, keys.valid);
    let q8 = load_q(8u, keys.q_base, keys.valid);
    let q9 = load_q(9u, keys.q_base, keys.valid);
    let q10 = load_q(10u, keys.q_base, keys.valid);
    let q11 = load_q(11u, keys.q_base, keys.valid);
    let q12 = load_q(12u, keys.q_base, keys.valid);
    let q13 = load_q(13u, keys.q_base, keys.valid);
    let q14 = load_q(14u, keys.q_base, keys.valid);
    let q15 = load_q(15u, keys.q_base, keys.valid);
    let q16 = load_q(16u, keys.q_base, keys.valid);
    let q17 = load_q(17u, keys.q_base, keys.valid);
    let q18 = load_q(18u, keys.q_base, keys.valid);
    let q19 = load_q(19u, keys.q_base, keys.valid);
    let q20 = load_q(20u, keys.q_base, keys.valid);
    let q21 = load_q(21u, keys.q_base, keys.valid);
    let q22 = load_q(22u, keys.q_base, keys.valid);
    let q23 = load_q(23u, keys.q_base, keys.valid);
    let q24 = load_q(24u, keys.q_base, keys.valid);
    let q25 = load_q(25u, keys.q_base, keys.valid);
    let q26 = load_q(26u, keys.q_base, keys.valid);
    let q27 = load_q(27u, keys.q_base, keys.valid);
    let q28 = load_q(28u, keys.q_base, keys.valid);
    let q29 = load_q(29u, keys.q_base, keys.valid);
    let q30 = load_q(30u, keys.q_base, keys.valid);
    let q31 = load_q(31u, keys.q_base, keys.valid);
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
    var block_end = keys.begin;
    var row_base = 0u;
    var scale_row = 0u;
    var block_ok = false;
    for (var j = keys.begin; j < keys.end; j++) {
        if (j == block_end) {
            let logical = j / params.block_size;
            let entry = keys.table_base + logical;
            var block = params.n_blocks;
            if (entry < table_len) {
                block = block_table[entry];
            }
            // A missing block reads block 0 (in bounds) and masks its keys.
            block_ok = block < params.n_blocks;
            let first = logical * params.block_size;
            let group = select(0u, (block * params.n_kv_heads + keys.kv_head) * params.block_size, block_ok);
            row_base = group * key_vec4 - first * key_vec4;
            scale_row = params.scale_base + group - first;
            block_end = first + params.block_size;
        }
        let row = row_base + j * key_vec4;
        let kl = load_lanes(row, keys.lane);
        var s: vec4<f32>;
        if (SLICED) {
            s = score_loop(row, keys.q_base);
        } else {
            s = k_times_q(row, 0u, q0, kl)
                + k_times_q(row, 1u, q1, kl)
                + k_times_q(row, 2u, q2, kl)
                + k_times_q(row, 3u, q3, kl)
                + k_times_q(row, 4u, q4, kl)
                + k_times_q(row, 5u, q5, kl)
                + k_times_q(row, 6u, q6, kl)
                + k_times_q(row, 7u, q7, kl)
                + k_times_q(row, 8u, q8, kl)
                + k_times_q(row, 9u, q9, kl)
                + k_times_q(row, 10u, q10, kl)
                + k_times_q(row, 11u, q11, kl)
                + k_times_q(row, 12u, q12, kl)
                + k_times_q(row, 13u, q13, kl)
                + k_times_q(row, 14u, q14, kl)
                + k_times_q(row, 15u, q15, kl)
                + k_times_q(row, 16u, q16, kl)
                + k_times_q(row, 17u, q17, kl)
                + k_times_q(row, 18u, q18, kl)
                + k_times_q(row, 19u, q19, kl)
                + k_times_q(row, 20u, q20, kl)
                + k_times_q(row, 21u, q21, kl)
                + k_times_q(row, 22u, q22, kl)
                + k_times_q(row, 23u, q23, kl)
                + k_times_q(row, 24u, q24, kl)
                + k_times_q(row, 25u, q25, kl)
                + k_times_q(row, 26u, q26, kl)
                + k_times_q(row, 27u, q27, kl)
                + k_times_q(row, 28u, q28, kl)
                + k_times_q(row, 29u, q29, kl)
                + k_times_q(row, 30u, q30, kl)
                + k_times_q(row, 31u, q31, kl);
        }
        let visible = select(vec4<bool>(false), (vec4<u32>(j) < keys.lim) & (vec4<u32>(j) >= keys.low), block_ok);
        if (INT8) {
            s *= bitcast<f32>(k_word(scale_row + j));
        }
        if (SOFTCAP > 0.0) {
            s = soft_capped(s);
        }
        // Online softmax per lane; a masked key gets weight 0 and leaves the max alone.
        let m_new = max(m, select(vec4<f32>(NEG_BIG), s, visible));
        let corr = exp(m - m_new);
        var p = select(vec4<f32>(0.0), exp(s - m_new), visible);
        m = m_new;
        l = l * corr + p;
        if (INT8) {
            // A masked slot's scale may be any bits (a stale or unwritten slot); keep it out.
            p = select(vec4<f32>(0.0), p * bitcast<f32>(v_word(scale_row + j)), visible);
        }
        a0 = accumulate(a0, row, kl, keys.dim0, 0u, corr, p);
        a1 = accumulate(a1, row, kl, keys.dim0, 1u, corr, p);
        a2 = accumulate(a2, row, kl, keys.dim0, 2u, corr, p);
        a3 = accumulate(a3, row, kl, keys.dim0, 3u, corr, p);
        a4 = accumulate(a4, row, kl, keys.dim0, 4u, corr, p);
        a5 = accumulate(a5, row, kl, keys.dim0, 5u, corr, p);
        a6 = accumulate(a6, row, kl, keys.dim0, 6u, corr, p);
        a7 = accumulate(a7, row, kl, keys.dim0, 7u, corr, p);
        a8 = accumulate(a8, row, kl, keys.dim0, 8u, corr, p);
        a9 = accumulate(a9, row, kl, keys.dim0, 9u, corr, p);
        a10 = accumulate(a10, row, kl, keys.dim0, 10u, corr, p);
        a11 = accumulate(a11, row, kl, keys.dim0, 11u, corr, p);
        a12 = accumulate(a12, row, kl, keys.dim0, 12u, corr, p);
        a13 = accumulate(a13, row, kl, keys.dim0, 13u, corr, p);
        a14 = accumulate(a14, row, kl, keys.dim0, 14u, corr, p);
        a15 = accumulate(a15, row, kl, keys.dim0, 15u, corr, p);
        a16 = accumulate(a16, row, kl, keys.dim0, 16u, corr, p);
        a17 = accumulate(a17, row, kl, keys.dim0, 17u, corr, p);
        a18 = accumulate(a18, row, kl, keys.dim0, 18u, corr, p);
        a19 = accumulate(a19, row, kl, keys.dim0, 19u, corr, p);
        a20 = accumulate(a20, row, kl, keys.dim0, 20u, corr, p);
        a21 = accumulate(a21, row, kl, keys.dim0, 21u, corr, p);
        a22 = accumulate(a22, row, kl, keys.dim0, 22u, corr, p);
        a23 = accumulate(a23, row, kl, keys.dim0, 23u, corr, p);
        a24 = accumulate(a24, row, kl, keys.dim0, 24u, corr, p);
        a25 = accumulate(a25, row, kl, keys.dim0, 25u, corr, p);
        a26 = accumulate(a26, row, kl, keys.dim0, 26u, corr, p);
        a27 = accumulate(a27, row, kl, keys.dim0, 27u, corr, p);
        a28 = accumulate(a28, row, kl, keys.dim0, 28u, corr, p);
        a29 = accumulate(a29, row, kl, keys.dim0, 29u, corr, p);
        a30 = accumulate(a30, row, kl, keys.dim0, 30u, corr, p);
        a31 = accumulate(a31, row, kl, keys.dim0, 31u, corr, p);
    }

    var write = out.write;
    if (WG_SPLIT) {
        // The group's state, each invocation's rescaled to the group's max first. An invocation
        // without keys has m = NEG_BIG, l = 0 and zero accumulators: it adds nothing.
        let m_group = group_max(m);
        let w = exp(m - m_group);
        m = m_group;
        l = group_sum(l * w);
        a0 = group_scaled(a0, 0u, w);
        a1 = group_scaled(a1, 1u, w);
        a2 = group_scaled(a2, 2u, w);
        a3 = group_scaled(a3, 3u, w);
        a4 = group_scaled(a4, 4u, w);
        a5 = group_scaled(a5, 5u, w);
        a6 = group_scaled(a6, 6u, w);
        a7 = group_scaled(a7, 7u, w);
        a8 = group_scaled(a8, 8u, w);
        a9 = group_scaled(a9, 9u, w);
        a10 = group_scaled(a10, 10u, w);
        a11 = group_scaled(a11, 11u, w);
        a12 = group_scaled(a12, 12u, w);
        a13 = group_scaled(a13, 13u, w);
        a14 = group_scaled(a14, 14u, w);
        a15 = group_scaled(a15, 15u, w);
        a16 = group_scaled(a16, 16u, w);
        a17 = group_scaled(a17, 17u, w);
        a18 = group_scaled(a18, 18u, w);
        a19 = group_scaled(a19, 19u, w);
        a20 = group_scaled(a20, 20u, w);
        a21 = group_scaled(a21, 21u, w);
        a22 = group_scaled(a22, 22u, w);
        a23 = group_scaled(a23, 23u, w);
        a24 = group_scaled(a24, 24u, w);
        a25 = group_scaled(a25, 25u, w);
        a26 = group_scaled(a26, 26u, w);
        a27 = group_scaled(a27, 27u, w);
        a28 = group_scaled(a28, 28u, w);
        a29 = group_scaled(a29, 29u, w);
        a30 = group_scaled(a30, 30u, w);
        a31 = group_scaled(a31, 31u, w);
        if (!ONE_GROUP) {
            // One record per group, its leader's: the group's state.
            let rec = (keys.item * WG + keys.group) * record_len();
            if (keys.leader) {
                state[rec] = m;
                state[rec + 1u] = l;
                put_record(rec, 0u, a0);
                put_record(rec, 1u, a1);
                put_record(rec, 2u, a2);
                put_record(rec, 3u, a3);
                put_record(rec, 4u, a4);
                put_record(rec, 5u, a5);
                put_record(rec, 6u, a6);
                put_record(rec, 7u, a7);
                put_record(rec, 8u, a8);
                put_record(rec, 9u, a9);
                put_record(rec, 10u, a10);
                put_record(rec, 11u, a11);
                put_record(rec, 12u, a12);
                put_record(rec, 13u, a13);
                put_record(rec, 14u, a14);
                put_record(rec, 15u, a15);
                put_record(rec, 16u, a16);
                put_record(rec, 17u, a17);
                put_record(rec, 18u, a18);
                put_record(rec, 19u, a19);
                put_record(rec, 20u, a20);
                put_record(rec, 21u, a21);
                put_record(rec, 22u, a22);
                put_record(rec, 23u, a23);
                put_record(rec, 24u, a24);
                put_record(rec, 25u, a25);
                put_record(rec, 26u, a26);
                put_record(rec, 27u, a27);
                put_record(rec, 28u, a28);
                put_record(rec, 29u, a29);
                put_record(rec, 30u, a30);
                put_record(rec, 31u, a31);
            }
            storageBarrier();
            combine_records(keys, out);
            return Softmax(m, l);
        }
        // One group: its sums are the workgroup's; the leader writes them.
        write = write & vec4<bool>(keys.leader);
    }

    var w_old = vec4<f32>(0.0);
    var w_acc = vec4<f32>(1.0);
    let merge = !SPLIT && out.merge;
    var m_all = m;
    var l_all = l;
    if (!SPLIT) {
        if (merge) {
            // The earlier output is normalized over sum l_old at max m_old.
            m_all = max(out.m_old, m);
            w_old = out.l_old * exp(out.m_old - m_all);
            w_acc = exp(m - m_all);
        }
        l_all = w_old + l * w_acc;
        // No visible key so far (every block unmapped, or kv_len 0): zeros, not 0 / 0.
        let inv = select(1.0 / l_all, vec4<f32>(0.0), l_all == vec4<f32>(0.0));
        w_old *= inv;
        w_acc *= inv;
    }
    for (var r = 0u; r < 4u; r++) {
        if (!write[r]) {
            continue;
        }
        let base = out.base[r];
        if (SPLIT) {
            dst[base - 1u] = vec4<f32>(m[r], l[r], 0.0, 0.0);
        }
        emit(base, keys.dim0, 0u, column(a0, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 1u, column(a1, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 2u, column(a2, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 3u, column(a3, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 4u, column(a4, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 5u, column(a5, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 6u, column(a6, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 7u, column(a7, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 8u, column(a8, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 9u, column(a9, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 10u, column(a10, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 11u, column(a11, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 12u, column(a12, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 13u, column(a13, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 14u, column(a14, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 15u, column(a15, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 16u, column(a16, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 17u, column(a17, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 18u, column(a18, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 19u, column(a19, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 20u, column(a20, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 21u, column(a21, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 22u, column(a22, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 23u, column(a23, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 24u, column(a24, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 25u, column(a25, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 26u, column(a26, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 27u, column(a27, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 28u, column(a28, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 29u, column(a29, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 30u, column(a30, r), w_old[r], w_acc[r], merge);
        emit(base, keys.dim0, 31u, column(a31, r), w_old[r], w_acc[r], merge);
    }
    return Softmax(m_all, l_all);
}
