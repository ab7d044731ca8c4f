// Sampling on the GPU: for each logit row, the token crate::sampler's definition chooses
// (repetition penalty, greedy or temperature with top-k and top-p, a counter-based draw), written
// to out[out_offset + row * out_stride]. The order_key prelude comes first. The definition is in
// src/sampler.rs; this file finds the same token without sorting.
//
// Kernels, recorded in this order (src/gpu/ops/sample.rs builds them once):
//   prepare        zero this step's scratch and indirect arguments; penalize the distinct window
//                  tokens in place
//   (argmax.wgsl)  the argmax of each penalized row, into scratch[row]: greedy's answer, the max
//   step × STEPS   each advances every row's search by one phase (below); dispatched indirectly,
//                  with 0 workgroups once no row has work left
//   finish         out[...] = the argmax (greedy) or the drawn token (and into the history ring)
//
// Every row runs three searches (stages) in turn, each for the first member of its set in ranking
// order (key descending, then id ascending) whose cumulative weight reaches a goal:
//   stage 0, top-k: set C (the candidates), weight 1 per member, goal k
//   stage 1, top-p: set K (C up to stage 0's cut), weight q, goal max(1, Z_K * P / 2^24)
//   stage 2, draw:  set N (K up to stage 1's cut), weight q, goal Z_N * u / 2^24 + 1
// A stage not asked for is skipped (no cut). A search narrows a key range [lo, hi] holding its
// answer, one phase per step:
//   REFINE     every invocation (row, part) scans its ids (part, part + n_parts, ...) and adds
//              the count, weight and smallest and largest key of the members in each of 16
//              buckets of the range to global bins (atomics: integer sums do not depend on the
//              order of additions, so every run gives the same bins). The stage's first REFINE
//              buckets by the scaled gap x (float keys are logarithmic: key buckets would put
//              every positive logit in one); later ones split the range's keys. The next step's
//              invocations all read the bins and pick the same bucket (where the running weight,
//              from the top, reaches the goal); its [smallest, largest] key is the new range. The
//              first REFINE's bins also sum to the stage's total weight, hence its goal.
//   GATHER     once the bucket holds at most CAP members: they are appended to a list, or, when
//              the members above the range are few enough too, the whole ranking prefix down to
//              lo (a "prefix list", which holds every member of the later stages' sets: those
//              stages then run on the list without reading the row). A list of more than SMALL
//              entries is refined further by REFINEs over the list's entries instead of the row's.
//   RESOLVE    each of at most SMALL entries (or one tied key's) sums the weight of the members
//              ranked at or before it (no sort, no barrier); the one that reaches the goal is the cut
//   TIE_COUNT  a bucket of one key with more than CAP members (ties) is resolved by id: the
//   TIE_FIND   members are counted per part (contiguous ids), then the j-th found by prefix
// After its first REFINE a range of up to 2^32 keys shrinks 16x per REFINE, on the row or on the
// list (bucket widths are powers of two under the range's width), so a stage takes at most
// 1 + 8 REFINEs and two more phases: STEPS = 3 * 11 always suffice. The usual case takes 3-4 steps per stage that reads the
// row, 1 per stage that resolves on a prefix list, and the steps after the last request nothing.
//
// Why this shape: on the CPU adapters (lavapipe, SwiftShader) barriers and workgroup memory cost
// 3-40x (KERNELS.md), so an invocation keeps its 16 buckets in private arrays and touches global
// atomics once per non-empty bucket; both sides of a branch run under a mask, so per-id work is a
// cheap test into a bitmask and the costly part loops over the set bits only (a loop ends when no
// lane has work left); a dispatch costs 0.1-0.5 ms even when its invocations return at once, and
// an indirect dispatch of 0 workgroups ~7 us, so finished steps are dispatched empty. lavapipe
// also ends every loop of an invocation after 65,535 back-edges in all: an invocation scans at
// most vocab / n_parts ids (<= 1,024 + block overhead) and visits at most CAP / 32 list entries,
// each against the whole list.
//
// Bindings (not every entry point uses all; the launcher binds what each uses):
//   logits:    [n_rows, vocab] f32 as bits, read_write: the penalty is applied in place
//   params:    [n_rows] RowParams, written by the caller before each step
//   work:      [n_rows, WORK_ROW] atomic u32: bins [3 sets][bucket][5], the list's length, cuts
//              [stage][valid, key, id]; zeroed by prepare
//   scratch:   [n_rows] argmax ids, then [n_rows, SCRATCH_ROW]: the state [2 slots][STATE_WORDS],
//              the list [CAP][key, id, weight lo, weight hi], part counts [MAX_PARTS]
//   shape:     read-only storage, the launcher's shape plus this kernel's step. Not a uniform:
//              lavapipe (Mesa 22) inlines uniform values that steer control flow into the shader
//              and recompiles it at every dispatch whose uniforms differ from the last one's
//              (~5-10 ms each here); it never does so for storage buffers.
//   history:   [n_rings, history_cap] u32 rings (RowParams.history_ring, history_head, history_len:
//              a ring per sequence, whatever row it takes in a step); finish writes the token at
//              the head of rows flagged FLAG_APPEND_HISTORY; a ring index >= n_rings is no ring
//   out:       u32, the token of row r at out_offset + r * out_stride
//   mask:      [n_rows, ceil(vocab / 32)] u32, read by prepare for rows flagged FLAG_MASKED: token t
//              is allowed when bit t % 32 of word t / 32 is set; prepare sets every other logit of
//              the row to -inf (before the argmax, so greedy and sampled rows alike choose among
//              the allowed tokens only)
//   next_args: the indirect arguments [x, y, z] of the next step (steps alternate between two
//              buffers, args_even and args_odd, as a dispatch may not write its own)

struct Shape {
    n_rows: u32,
    vocab: u32,
    n_parts: u32,
    part_len: u32,
    history_cap: u32,
    out_offset: u32,
    out_stride: u32,
    step: u32,
    prep_width: u32,
    step_workgroups: u32,
    n_rings: u32,
    _pad1: u32,
}

// One row's request, as crate::gpu::ops::sample::RowParams writes it.
struct RowParams {
    flags: u32,
    temperature: f32,
    inv_temperature: f32,
    top_k: u32,
    top_p: f32,
    penalty: f32,
    inv_penalty: f32,
    window: u32,
    history_head: u32,
    history_len: u32,
    seed_lo: u32,
    seed_hi: u32,
    counter: u32,
    history_ring: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> logits: array<u32>;
@group(0) @binding(1) var<storage, read> params: array<RowParams>;
@group(0) @binding(2) var<storage, read_write> work: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(4) var<storage, read> shape: Shape;
@group(0) @binding(5) var<storage, read_write> history: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;
@group(0) @binding(7) var<storage, read_write> next_args: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> args_even: array<u32>;
@group(0) @binding(9) var<storage, read_write> args_odd: array<u32>;
@group(0) @binding(10) var<storage, read> mask: array<u32>;

override WG: u32 = 64u;
// Largest list a search ranks (src/gpu/ops/sample.rs sizes scratch with it).
override CAP: u32 = 512u;
// Most list entries RESOLVE ranks pairwise (a longer list is refined first, on the list).
const SMALL: u32 = 64u;

const FLAG_ACTIVE: u32 = 1u;
const FLAG_APPEND_HISTORY: u32 = 2u;
const FLAG_MASKED: u32 = 4u;
const NEG_INF_BITS: u32 = 0xff800000u;
const BUCKETS: u32 = 16u;
const STAGES: u32 = 3u;
const STEPS: u32 = 33u;
const MAX_PARTS: u32 = 256u;
const BIN_WORDS: u32 = 5u; // count, weight lo, weight hi, largest key, inverted smallest key
const BIN_SETS: u32 = 3u;
const STATE_WORDS: u32 = 16u;
const BINS_ROW: u32 = BIN_SETS * BUCKETS * BIN_WORDS;
const WORK_ROW: u32 = BINS_ROW + 1u + STAGES * 3u;
const X_MIN: f32 = -27.5;
const X_BUCKETS_PER_UNIT: f32 = -16.0 / 27.5;
const DONE: u32 = 3u; // the stage after the last

// Phases of a row's current stage.
const REFINE: u32 = 0u;
const GATHER: u32 = 1u;
const RESOLVE: u32 = 2u;
const TIE_COUNT: u32 = 3u;
const TIE_FIND: u32 = 4u;

struct Search {
    stage: u32,
    phase: u32,
    first: bool,       // the stage's first REFINE: x buckets over the whole row
    lo: u32,
    hi: u32,
    shift: u32,
    above: vec2<u32>,  // weight of the members ranked above [lo, hi] (u64 as lo, hi words)
    above_count: u32,  // their number
    goal: vec2<u32>,   // the cumulative weight the answer reaches
    tie_j: u32,
    prefix: bool,      // GATHER: list the whole prefix down to lo; RESOLVE: the list holds it
    from_list: bool,   // RESOLVE: the goal is still to compute from the list (stage begun on it)
    on_list: bool,     // REFINE: bucket the list's entries, not the row's
    count: u32,        // GATHER: entries it lists
}

// The facts of a row every kernel after the argmax needs (with the shape's sizes in registers:
// loops that also store would reload them from the storage buffer at every iteration).
struct Row {
    vocab: u32,
    n_parts: u32,
    base: u32,
    key_max: u32,
    max: f32,
    inv_t: f32,
    sampling: bool,
}

// ---------------------------------------------------------------- u64 as vec2<u32>(lo, hi)

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// The full 64-bit product of two u32.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// a * b mod 2^64.
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = mul_wide(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}

// floor(a * b / 2^24), for results below 2^64 (b <= 2^24).
fn scale24(a: vec2<u32>, b: u32) -> vec2<u32> {
    let low = mul_wide(a.x, b);
    let high = mul_wide(a.y, b);
    let w1 = low.y + high.x;
    let w2 = high.y + select(0u, 1u, w1 < low.y);
    return vec2<u32>((low.x >> 24u) | (w1 << 8u), (w1 >> 24u) | (w2 << 8u));
}

fn xor_shift_right(a: vec2<u32>, s: u32) -> vec2<u32> {
    return a ^ vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// crate::rng::counter_u24: the top 24 bits of SplitMix64's output number counter + 1 from seed.
fn counter_u24(seed: vec2<u32>, counter: u32) -> u32 {
    let n = vec2<u32>(counter + 1u, select(0u, 1u, counter == 0xffffffffu));
    var z = add64(seed, mul64(vec2<u32>(0x7f4a7c15u, 0x9e3779b9u), n));
    z = mul64(xor_shift_right(z, 30u), vec2<u32>(0x1ce4e5b9u, 0xbf58476du));
    z = mul64(xor_shift_right(z, 27u), vec2<u32>(0x133111ebu, 0x94d049bbu));
    z = xor_shift_right(z, 31u);
    return z.y >> 8u;
}

// ---------------------------------------------------------------- the definition's pieces

// crate::sampler::top_p_fraction.
fn top_p_fraction(top_p: f32) -> u32 {
    return min(u32(clamp(top_p, 0.0, 1.0) * 16777216.0), 1u << 24u);
}

fn row_context(row: u32) -> Row {
    let p = params[row];
    var r: Row;
    r.vocab = shape.vocab;
    r.n_parts = shape.n_parts;
    r.base = row * r.vocab;
    let bits = logits[r.base + scratch[row]];
    r.key_max = order_key(bits);
    r.max = bitcast<f32>(bits);
    r.inv_t = p.inv_temperature;
    r.sampling = (p.flags & FLAG_ACTIVE) != 0u && p.temperature > 0.0 && r.key_max != KEY_NAN;
    return r;
}

// crate::sampler::scaled_gap; -3e38 (below X_MIN) for a token excluded outright. Infinities are
// told apart by their keys, never by float arithmetic (whatever the subtraction gives for them
// is not selected). Branch-free, like the membership tests below: the CPU adapters run both
// sides of a branch anyway, under a mask.
fn scaled_gap(bits: u32, key: u32, r: Row) -> f32 {
    let excluded = (key == KEY_NEG_INF) | (r.key_max == KEY_POS_INF);
    return select(select((bitcast<f32>(bits) - r.max) * r.inv_t, -3.0e38, excluded), 0.0, key == r.key_max);
}

// crate::sampler::weight: floor(exp(x) * 2^40) as (lo, hi), computed exactly from the f32 exp:
// its 24 significant bits times 2^8 split into an integer part (hi) and a fraction (lo, in 2^-32).
fn weight(x: f32) -> vec2<u32> {
    let m = select(exp(x), 1.0, x == 0.0);
    let s = m * 256.0;
    let hi = u32(s);
    return vec2<u32>(u32((s - f32(hi)) * 4294967296.0), hi);
}

// A cut (valid, key, id): members of later stages rank at or before it.
fn load_cut(row: u32, stage: u32) -> vec3<u32> {
    let at = cut_at(row, stage);
    return vec3<u32>(atomicLoad(&work[at]), atomicLoad(&work[at + 1u]), atomicLoad(&work[at + 2u]));
}

fn store_cut(row: u32, stage: u32, key: u32, id: u32) {
    let at = cut_at(row, stage);
    atomicStore(&work[at + 1u], key);
    atomicStore(&work[at + 2u], id);
    atomicStore(&work[at], 1u);
}

fn before_cut(key: u32, id: u32, cut: vec3<u32>) -> bool {
    return (cut.x == 0u) | (key > cut.y) | ((key == cut.y) & (id <= cut.z));
}

// The earlier stages' cuts, for membership tests.
struct Cuts {
    top_k: vec3<u32>,
    top_p: vec3<u32>,
}

fn load_cuts(row: u32, stage: u32) -> Cuts {
    var c: Cuts;
    if (stage >= 1u) {
        c.top_k = load_cut(row, 0u);
    }
    if (stage >= 2u) {
        c.top_p = load_cut(row, 1u);
    }
    return c;
}

// Whether token `id` (key, scaled gap x) is in the stage's set: a candidate before every earlier cut.
fn member(key: u32, id: u32, x: f32, cuts: Cuts) -> bool {
    return (x >= X_MIN) & before_cut(key, id, cuts.top_k) & before_cut(key, id, cuts.top_p);
}

// Ids a block of the interleaved scan covers: first, first + n_parts, ... (32 of them).
const BLOCK: u32 = 32u;

// Bit i set: id first + i * n_parts has a key in [lo, hi] and, when `test_member`, is a member
// of the stage's set. The cheap test every id of a scan pays; the work per member then loops over
// the set bits only, so a scan whose range holds few members skips it (a loop ends when no lane
// has work left, while an if's body would run for every lane under a mask). After a stage's first
// REFINE the range lies between two members' keys, so every key in it is a candidate ranked before
// the earlier cuts but for ties with a cut's key, which the caller tests per member.
fn block_mask(r: Row, cuts: Cuts, lo: u32, hi: u32, first: u32, test_member: bool) -> u32 {
    var mask = 0u;
    for (var i = 0u; i < BLOCK; i += 1u) {
        let id = first + i * r.n_parts;
        let bits = logits[r.base + min(id, r.vocab - 1u)];
        let key = order_key(bits);
        var inside = (id < r.vocab) & (key >= lo) & (key <= hi) & (key != KEY_NAN);
        if (test_member) {
            inside = inside & member(key, id, scaled_gap(bits, key, r), cuts);
        }
        mask |= select(0u, 1u << i, inside);
    }
    return mask;
}

// ---------------------------------------------------------------- layout

fn bin_at(row: u32, bin_set: u32, bucket: u32) -> u32 {
    return row * WORK_ROW + (bin_set * BUCKETS + bucket) * BIN_WORDS;
}

fn list_len_at(row: u32) -> u32 {
    return row * WORK_ROW + BINS_ROW;
}

fn cut_at(row: u32, stage: u32) -> u32 {
    return row * WORK_ROW + BINS_ROW + 1u + stage * 3u;
}

fn scratch_row() -> u32 {
    return 2u * STATE_WORDS + 4u * CAP + MAX_PARTS;
}

fn state_at(row: u32, slot: u32) -> u32 {
    return shape.n_rows + row * scratch_row() + slot * STATE_WORDS;
}

fn list_at(row: u32, i: u32) -> u32 {
    return shape.n_rows + row * scratch_row() + 2u * STATE_WORDS + 4u * i;
}

fn part_count_at(row: u32, part: u32) -> u32 {
    return shape.n_rows + row * scratch_row() + 2u * STATE_WORDS + 4u * CAP + part;
}

fn load_state(row: u32, slot: u32) -> Search {
    let at = state_at(row, slot);
    var st: Search;
    st.stage = scratch[at];
    st.phase = scratch[at + 1u];
    st.first = scratch[at + 2u] != 0u;
    st.lo = scratch[at + 3u];
    st.hi = scratch[at + 4u];
    st.shift = scratch[at + 5u];
    st.above = vec2<u32>(scratch[at + 6u], scratch[at + 7u]);
    st.above_count = scratch[at + 8u];
    st.goal = vec2<u32>(scratch[at + 9u], scratch[at + 10u]);
    st.tie_j = scratch[at + 11u];
    st.prefix = scratch[at + 12u] != 0u;
    st.from_list = scratch[at + 13u] != 0u;
    st.on_list = scratch[at + 14u] != 0u;
    st.count = scratch[at + 15u];
    return st;
}

fn store_state(row: u32, slot: u32, st: Search) {
    let at = state_at(row, slot);
    scratch[at] = st.stage;
    scratch[at + 1u] = st.phase;
    scratch[at + 2u] = select(0u, 1u, st.first);
    scratch[at + 3u] = st.lo;
    scratch[at + 4u] = st.hi;
    scratch[at + 5u] = st.shift;
    scratch[at + 6u] = st.above.x;
    scratch[at + 7u] = st.above.y;
    scratch[at + 8u] = st.above_count;
    scratch[at + 9u] = st.goal.x;
    scratch[at + 10u] = st.goal.y;
    scratch[at + 11u] = st.tie_j;
    scratch[at + 12u] = select(0u, 1u, st.prefix);
    scratch[at + 13u] = select(0u, 1u, st.from_list);
    scratch[at + 14u] = select(0u, 1u, st.on_list);
    scratch[at + 15u] = st.count;
}

// ---------------------------------------------------------------- the state machine

// A bucket's weight: its count in stage 0, its summed weight otherwise.
fn bin_weight(at: u32, stage: u32) -> vec2<u32> {
    if (stage == 0u) {
        return vec2<u32>(atomicLoad(&work[at]), 0u);
    }
    return vec2<u32>(atomicLoad(&work[at + 1u]), atomicLoad(&work[at + 2u]));
}

// The goal of a stage whose members weigh `total` in all (stage 0: their number).
fn goal_of(stage: u32, total: vec2<u32>, p: RowParams) -> vec2<u32> {
    if (stage == 0u) {
        return vec2<u32>(p.top_k, 0u);
    }
    if (stage == 1u) {
        let g = scale24(total, top_p_fraction(p.top_p));
        return select(g, vec2<u32>(1u, 0u), (g.x == 0u) & (g.y == 0u));
    }
    return add64(scale24(total, counter_u24(vec2<u32>(p.seed_lo, p.seed_hi), p.counter)), vec2<u32>(1u, 0u));
}

// The first stage from `stage` on that the row asks for, begun: on the row, or on the list when
// `list_has_all` (the last list is a prefix list holding every member of the stage's set).
fn begin_stage(row: u32, stage: u32, list_has_all: bool, p: RowParams, r: Row) -> Search {
    var st: Search;
    st.stage = stage;
    while (st.stage < DONE) {
        let asked = (st.stage == 2u) | ((st.stage == 0u) & (p.top_k != 0u)) | ((st.stage == 1u) & (top_p_fraction(p.top_p) < (1u << 24u)));
        if (asked) {
            break;
        }
        st.stage += 1u;
    }
    if (list_has_all) {
        // Every member of the stage's set is on the list (with entries ranked after the earlier
        // cuts, which membership tests leave out): a short list is ranked at once, a longer one
        // refined on the list, its first round's bins giving the total as on the row.
        st.hi = r.key_max;
        if (atomicLoad(&work[list_len_at(row)]) <= SMALL) {
            st.phase = RESOLVE;
            st.prefix = true;
            st.from_list = true;
        } else {
            st.phase = REFINE;
            st.first = true;
            st.on_list = true;
            st.shift = 28u;
            st.hi = r.key_max;
        }
    } else {
        // Every candidate key is at most key_max; the first REFINE buckets by x.
        st.phase = REFINE;
        st.first = true;
        st.hi = r.key_max;
    }
    return st;
}

// The state after a step in state `st` whose bins are in `bin_set`.
fn advance(st_in: Search, row: u32, bin_set: u32, r: Row) -> Search {
    var st = st_in;
    let p = params[row];
    switch st.phase {
        case GATHER: {
            if (st.count <= SMALL) {
                st.phase = RESOLVE;
            } else {
                st.phase = REFINE;
                st.on_list = true;
                st.shift = max(32u - countLeadingZeros(st.hi - st.lo), 4u) - 4u;
            }
            return st;
        }
        case TIE_COUNT: {
            st.phase = TIE_FIND;
            return st;
        }
        case RESOLVE: {
            return begin_stage(row, st.stage + 1u, st.prefix, p, r);
        }
        case TIE_FIND: {
            return begin_stage(row, st.stage + 1u, false, p, r);
        }
        default: {}
    }
    // REFINE: pick the bucket where the running weight reaches the goal.
    if (st.first) {
        // The first REFINE's range holds every member: its bins sum to the stage's total.
        var total = vec2<u32>(0u, 0u);
        for (var b = 0u; b < BUCKETS; b += 1u) {
            total = add64(total, bin_weight(bin_at(row, bin_set, b), st.stage));
        }
        if ((st.stage == 0u) & (total.y == 0u) & (total.x <= p.top_k)) {
            return begin_stage(row, 1u, false, p, r); // k keeps every candidate: no cut
        }
        st.goal = goal_of(st.stage, total, p);
    }
    var cum = st.above;
    for (var b = 0u; b < BUCKETS; b += 1u) {
        let at = bin_at(row, bin_set, b);
        let count = atomicLoad(&work[at]);
        let reach = add64(cum, bin_weight(at, st.stage));
        if (ge64(reach, st.goal)) {
            let lo = ~atomicLoad(&work[at + 4u]);
            let hi = atomicLoad(&work[at + 3u]);
            st.above = cum;
            st.lo = lo;
            st.hi = hi;
            st.first = false;
            if (st.on_list & ((count <= SMALL) | (lo == hi))) {
                st.phase = RESOLVE;
            } else if (!st.on_list & (count <= CAP)) {
                st.phase = GATHER;
                st.prefix = st.above_count + count <= CAP;
                st.count = count;
                if (st.prefix) {
                    st.count += st.above_count;
                    st.above = vec2<u32>(0u, 0u);
                    st.above_count = 0u;
                    st.hi = r.key_max;
                }
            } else if (lo == hi) {
                st.phase = TIE_COUNT;
                st.tie_j = tie_index(st, count, r);
            } else {
                st.shift = max(32u - countLeadingZeros(hi - lo), 4u) - 4u;
            }
            return st;
        }
        cum = reach;
        st.above_count += count;
    }
    // Unreachable with consistent bins; without a cut the row falls back to its argmax.
    st.stage = DONE;
    return st;
}

// Which member (1-based, by id) of a tie of `count` members of key st.lo reaches the goal:
// they weigh the same, so the smallest j with above + j * weight >= goal.
fn tie_index(st: Search, count: u32, r: Row) -> u32 {
    if (st.stage == 0u) {
        return st.goal.x - st.above.x;
    }
    let w = weight(scaled_gap(key_bits(st.lo), st.lo, r));
    var lo = 1u;
    var hi = count;
    while (lo < hi) {
        let mid = lo + (hi - lo) / 2u;
        let reach = add64(st.above, add64(mul_wide(w.x, mid), vec2<u32>(0u, w.y * mid)));
        if (ge64(reach, st.goal)) {
            hi = mid;
        } else {
            lo = mid + 1u;
        }
    }
    return lo;
}

// The row's state during `step`.
fn step_state(row: u32, step: u32, r: Row) -> Search {
    if (step == 0u) {
        if (!r.sampling) {
            var done: Search;
            done.stage = DONE;
            return done;
        }
        return begin_stage(row, 0u, false, params[row], r);
    }
    let st = load_state(row, (step + 1u) % 2u);
    if (st.stage >= DONE) {
        return st;
    }
    return advance(st, row, (step + 2u) % BIN_SETS, r);
}

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// ---------------------------------------------------------------- kernels

@compute @workgroup_size(WG)
fn prepare(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = linear_id(gid, nwg);
    if (item >= shape.n_rows * shape.prep_width) {
        return;
    }
    let row = item / shape.prep_width;
    let i = item % shape.prep_width;
    if (i < WORK_ROW) {
        atomicStore(&work[row * WORK_ROW + i], 0u);
    }
    // Row 0 writes the steps' indirect arguments: none but the first runs unless requested, and
    // the first runs when a row samples.
    if ((row == 0u) & (i < 3u * ((STEPS + 1u) / 2u))) {
        let slot = i / 3u;
        var value = select(0u, 1u, i % 3u != 0u);
        if (i == 0u) {
            for (var q = 0u; q < shape.n_rows; q += 1u) {
                if (((params[q].flags & FLAG_ACTIVE) != 0u) & (params[q].temperature > 0.0)) {
                    value = shape.step_workgroups;
                }
            }
        }
        args_even[i] = value;
        if (slot < STEPS / 2u) {
            args_odd[i] = select(0u, 1u, i % 3u != 0u);
        }
    }
    let p = params[row];
    let masked = (p.flags & (FLAG_ACTIVE | FLAG_MASKED)) == (FLAG_ACTIVE | FLAG_MASKED);
    let words = (shape.vocab + 31u) / 32u;
    if (masked) {
        // Invocation i clears the disallowed tokens of mask words i, i + prep_width, ...
        for (var w = i; w < words; w += shape.prep_width) {
            let bits = mask[row * words + w];
            for (var b = 0u; (b < 32u) & (bits != 0xffffffffu); b += 1u) {
                let t = w * 32u + b;
                if ((((bits >> b) & 1u) == 0u) & (t < shape.vocab)) {
                    logits[row * shape.vocab + t] = NEG_INF_BITS;
                }
            }
        }
    }
    let cap = shape.history_cap;
    let n = min(p.window, min(p.history_len, cap));
    if (((p.flags & FLAG_ACTIVE) == 0u) | (p.penalty == 1.0) | (i >= n) | (p.history_ring >= shape.n_rings)) {
        return;
    }
    // Slot of the i-th most recent token: the ring's newest is just before its head.
    let head = p.history_head % cap;
    let ring = p.history_ring * cap;
    let token = history[ring + (head + cap - 1u - i) % cap];
    // A token the mask clears is -inf already, written by another invocation: leave it alone.
    if (token >= shape.vocab) {
        return;
    }
    if (masked && (((mask[row * words + token / 32u] >> (token % 32u)) & 1u) == 0u)) {
        return;
    }
    // Each distinct token once: its most recent occurrence applies the penalty.
    for (var j = 0u; j < i; j += 1u) {
        if (history[ring + (head + cap - 1u - j) % cap] == token) {
            return;
        }
    }
    let at = row * shape.vocab + token;
    let v = bitcast<f32>(logits[at]);
    logits[at] = bitcast<u32>(v * select(p.penalty, p.inv_penalty, v > 0.0));
}

@compute @workgroup_size(WG)
fn search_step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = linear_id(gid, nwg);
    if (item >= shape.n_rows * shape.n_parts) {
        return;
    }
    let row = item / shape.n_parts;
    let part = item % shape.n_parts;
    let step = shape.step;
    let r = row_context(row);
    let st = step_state(row, step, r);
    let bin_set = step % BIN_SETS;
    if (part == 0u) {
        store_state(row, step % 2u, st);
        // The set the next step histograms into was last read by this step's predecessor.
        for (var w = 0u; w < BUCKETS * BIN_WORDS; w += 1u) {
            atomicStore(&work[bin_at(row, (step + 1u) % BIN_SETS, 0u) + w], 0u);
        }
        if ((st.stage < DONE) & (st.phase == REFINE) & !st.on_list) {
            atomicStore(&work[list_len_at(row)], 0u); // a GATHER always follows a row's REFINE
        }
        if ((st.stage < DONE) & (step + 1u < STEPS)) {
            atomicMax(&next_args[3u * ((step + 1u) / 2u)], shape.step_workgroups);
        }
    }
    if (st.stage >= DONE) {
        return;
    }
    let cuts = load_cuts(row, st.stage);
    switch st.phase {
        case REFINE: {
            if (st.on_list) {
                histogram_list(row, bin_set, st, cuts, part);
            } else {
                histogram(row, bin_set, st, r, cuts, part);
            }
        }
        case GATHER: {
            for (var first = part; first < r.vocab; first += BLOCK * r.n_parts) {
                var mask = block_mask(r, cuts, st.lo, st.hi, first, false);
                while (mask != 0u) {
                    let id = first + firstTrailingBit(mask) * r.n_parts;
                    mask &= mask - 1u;
                    let bits = logits[r.base + id];
                    let key = order_key(bits);
                    let x = scaled_gap(bits, key, r);
                    if (!member(key, id, x, cuts)) {
                        continue;
                    }
                    let slot = atomicAdd(&work[list_len_at(row)], 1u);
                    if (slot < CAP) {
                        let w = weight(x);
                        let at = list_at(row, slot);
                        scratch[at] = key;
                        scratch[at + 1u] = id;
                        scratch[at + 2u] = w.x;
                        scratch[at + 3u] = w.y;
                    }
                }
            }
        }
        case RESOLVE: {
            resolve(row, st, cuts, part);
        }
        case TIE_COUNT: {
            let start = part * shape.part_len;
            let end = min(start + shape.part_len, shape.vocab);
            var count = 0u;
            for (var id = start; id < end; id += 1u) {
                let bits = logits[r.base + id];
                let key = order_key(bits);
                if ((key == st.lo) & member(key, id, scaled_gap(bits, key, r), cuts)) {
                    count += 1u;
                }
            }
            scratch[part_count_at(row, part)] = count;
        }
        case TIE_FIND: {
            var before = 0u;
            for (var q = 0u; q < part; q += 1u) {
                before += scratch[part_count_at(row, q)];
            }
            let count = scratch[part_count_at(row, part)];
            if ((st.tie_j <= before) | (st.tie_j > before + count)) {
                return;
            }
            let start = part * shape.part_len;
            let end = min(start + shape.part_len, shape.vocab);
            var seen = before;
            for (var id = start; id < end; id += 1u) {
                let bits = logits[r.base + id];
                let key = order_key(bits);
                if ((key == st.lo) & member(key, id, scaled_gap(bits, key, r), cuts)) {
                    seen += 1u;
                    if (seen == st.tie_j) {
                        store_cut(row, st.stage, key, id);
                        return;
                    }
                }
            }
        }
        default: {}
    }
}

// Adds the part's members in [st.lo, st.hi] to the step's 16 buckets (bucket 0 holds the highest
// keys). Stage 0 counts only, so it never computes exp. Both bucketings are monotone in the
// ranking, so a bucket is always the members of one key range.
fn histogram(row: u32, bin_set: u32, st: Search, r: Row, cuts: Cuts, part: u32) {
    var count: array<u32, BUCKETS>;
    var weight_lo: array<u32, BUCKETS>;
    var weight_hi: array<u32, BUCKETS>;
    var key_hi: array<u32, BUCKETS>;
    var key_lo: array<u32, BUCKETS>;
    for (var b = 0u; b < BUCKETS; b += 1u) {
        key_lo[b] = 0xffffffffu;
    }
    for (var first = part; first < r.vocab; first += BLOCK * r.n_parts) {
        var mask = block_mask(r, cuts, st.lo, st.hi, first, st.first);
        while (mask != 0u) {
            let id = first + firstTrailingBit(mask) * r.n_parts;
            mask &= mask - 1u;
            let bits = logits[r.base + id];
            let key = order_key(bits);
            let x = scaled_gap(bits, key, r);
            if (!st.first && !member(key, id, x, cuts)) {
                continue;
            }
            let b = select((st.hi - key) >> st.shift, min(u32(x * X_BUCKETS_PER_UNIT), BUCKETS - 1u), st.first);
            count[b] += 1u;
            key_hi[b] = max(key_hi[b], key);
            key_lo[b] = min(key_lo[b], key);
            if (st.stage != 0u) {
                let w = weight(x);
                let lo = weight_lo[b] + w.x;
                weight_hi[b] += w.y + select(0u, 1u, lo < w.x);
                weight_lo[b] = lo;
            }
        }
    }
    flush_bins(row, bin_set, &count, &weight_lo, &weight_hi, &key_hi, &key_lo);
}

// histogram() over the list's entries in [st.lo, st.hi] (by key only: the range is narrow, or,
// in a stage begun on the list, its first round's shift of 28 splits all keys up to key_max).
fn histogram_list(row: u32, bin_set: u32, st: Search, cuts: Cuts, part: u32) {
    var count: array<u32, BUCKETS>;
    var weight_lo: array<u32, BUCKETS>;
    var weight_hi: array<u32, BUCKETS>;
    var key_hi: array<u32, BUCKETS>;
    var key_lo: array<u32, BUCKETS>;
    for (var b = 0u; b < BUCKETS; b += 1u) {
        key_lo[b] = 0xffffffffu;
    }
    let n = min(atomicLoad(&work[list_len_at(row)]), CAP);
    for (var i = part; i < n; i += shape.n_parts) {
        let at = list_at(row, i);
        let key = scratch[at];
        let id = scratch[at + 1u];
        if ((key < st.lo) | (key > st.hi) | !(before_cut(key, id, cuts.top_k) & before_cut(key, id, cuts.top_p))) {
            continue;
        }
        let b = (st.hi - key) >> st.shift;
        let w = entry_weight(at, st.stage);
        count[b] += 1u;
        key_hi[b] = max(key_hi[b], key);
        key_lo[b] = min(key_lo[b], key);
        let lo = weight_lo[b] + w.x;
        weight_hi[b] += w.y + select(0u, 1u, lo < w.x);
        weight_lo[b] = lo;
    }
    flush_bins(row, bin_set, &count, &weight_lo, &weight_hi, &key_hi, &key_lo);
}

// Adds an invocation's non-empty buckets to the step's global bins.
fn flush_bins(row: u32, bin_set: u32, count: ptr<function, array<u32, BUCKETS>>, weight_lo: ptr<function, array<u32, BUCKETS>>,
              weight_hi: ptr<function, array<u32, BUCKETS>>, key_hi: ptr<function, array<u32, BUCKETS>>, key_lo: ptr<function, array<u32, BUCKETS>>) {
    for (var b = 0u; b < BUCKETS; b += 1u) {
        if ((*count)[b] == 0u) {
            continue;
        }
        let at = bin_at(row, bin_set, b);
        atomicAdd(&work[at], (*count)[b]);
        let old = atomicAdd(&work[at + 1u], (*weight_lo)[b]);
        atomicAdd(&work[at + 2u], (*weight_hi)[b] + select(0u, 1u, old + (*weight_lo)[b] < old));
        atomicMax(&work[at + 3u], (*key_hi)[b]);
        atomicMax(&work[at + 4u], ~(*key_lo)[b]);
    }
}

// An entry's weight in the stage: 1 in stage 0, its q otherwise.
fn entry_weight(at: u32, stage: u32) -> vec2<u32> {
    return select(vec2<u32>(scratch[at + 2u], scratch[at + 3u]), vec2<u32>(1u, 0u), stage == 0u);
}

// Ranks the list: the invocation of entry i sums the weight of the stage's members ranked at or
// before it; the entry whose sum, with the weight above the list, reaches the goal and was short
// of it before its own weight is the cut. A list kept from an earlier stage also holds entries
// ranked after that stage's cut, which are not members; on such a list the goal is computed here,
// from the members' total.
fn resolve(row: u32, st: Search, cuts: Cuts, part: u32) {
    let n = min(atomicLoad(&work[list_len_at(row)]), CAP);
    var goal = st.goal;
    if (st.from_list) {
        var total = vec2<u32>(0u, 0u);
        for (var j = 0u; j < n; j += 1u) {
            let at = list_at(row, j);
            if (before_cut(scratch[at], scratch[at + 1u], cuts.top_k) & before_cut(scratch[at], scratch[at + 1u], cuts.top_p)) {
                total = add64(total, entry_weight(at, st.stage));
            }
        }
        goal = goal_of(st.stage, total, params[row]);
    }
    for (var i = part; i < n; i += shape.n_parts) {
        let mine = list_at(row, i);
        let key = scratch[mine];
        let id = scratch[mine + 1u];
        if ((key < st.lo) | (key > st.hi) | !(before_cut(key, id, cuts.top_k) & before_cut(key, id, cuts.top_p))) {
            continue;
        }
        var reach = st.above;
        for (var j = 0u; j < n; j += 1u) {
            let at = list_at(row, j);
            let other = scratch[at];
            let other_id = scratch[at + 1u];
            let ranked_before = (other > key) | ((other == key) & (other_id <= id));
            if (ranked_before & (other <= st.hi) & before_cut(other, other_id, cuts.top_k) & before_cut(other, other_id, cuts.top_p)) {
                reach = add64(reach, entry_weight(at, st.stage));
            }
        }
        if (ge64(reach, goal) & !ge64(sub64(reach, entry_weight(mine, st.stage)), goal)) {
            store_cut(row, st.stage, key, id);
        }
    }
}

@compute @workgroup_size(WG)
fn finish(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = linear_id(gid, nwg);
    if ((row >= shape.n_rows) || ((params[row].flags & FLAG_ACTIVE) == 0u)) {
        return;
    }
    var token = scratch[row];
    let drawn = load_cut(row, 2u);
    if (row_context(row).sampling & (drawn.x != 0u)) {
        token = drawn.z;
    }
    out[shape.out_offset + row * shape.out_stride] = token;
    let cap = shape.history_cap;
    let ring = params[row].history_ring;
    if (((params[row].flags & FLAG_APPEND_HISTORY) != 0u) & (cap != 0u) & (ring < shape.n_rings)) {
        history[ring * cap + params[row].history_head % cap] = token;
    }
}
