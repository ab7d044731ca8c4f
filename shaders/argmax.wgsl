// Greedy sampling: out[r] = the index of the largest logit of row r, in one pass (scan_row) or two
// (scan_parts, pick_best).
// Order: numbers compare as usual (-0 == +0); NaN ranks below every number, -inf included;
// ties go to the lowest index. A row of only NaNs gives 0.
// Comparisons run on integer keys built from the float bits (order_key, the prelude), so a
// compiler that assumes no NaNs (WGSL allows it) cannot change the result.
//
// Pass `scan_parts`: invocation p of row r scans columns p, p + n_parts, p + 2 n_parts, ... (adjacent
//   invocations read adjacent logits, which the CPU "GPUs" vectorise) and keeps its best (key, index).
// Pass `pick_best`: one invocation per row picks the best of the row's n_parts partial results.
// One pass `scan_row`: a workgroup per row, invocation i scanning columns i, i + WG, ... as in
//   scan_parts (n_parts = WG), then the WG results meet in workgroup memory behind one barrier
//   and the first invocation picks the best, writing out[row]: no second dispatch. Not through
//   subgroups: the final pick reads WG pairs once per row after each invocation has scanned
//   vocab / WG logits, under 1% of the kernel's loads, so subgroup reductions would save nothing
//   measurable.
//
// Bindings: io is the pass's own buffer: the logits [n_rows, vocab] f32 read as bits in pass
// `scan_parts`, the result [n_rows] u32 written in pass `pick_best`. One declaration serves both, because
// a bind group built from the "auto" layout must match each entry point's bindings exactly.
// partials: [n_rows, n_parts] (key, index).
// out: scan_row only: [n_rows] u32 (io holds the logits there).

struct Params { n_rows: u32, vocab: u32, n_parts: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> partials: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> io: array<u32>;
@group(0) @binding(2) var<storage, read> params: Params;

@group(0) @binding(3) var<storage, read_write> out: array<u32>;

override WG: u32 = 64u;

var<workgroup> row_best: array<vec2<u32>, WG>;

// Whether (key, index) a ranks before b: a larger key, or the same key at a lower index.
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y < b.y);
}

// order_key() comes from the order_key prelude (shared with sample.wgsl).

@compute @workgroup_size(WG)
fn scan_parts(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let n_parts = params.n_parts;
    if (item >= params.n_rows * n_parts) {
        return;
    }
    let row = item / n_parts;
    let part = item % n_parts;
    let base = row * params.vocab;
    // n_parts <= vocab, so every invocation owns column `part` at least; starting from it with
    // key 0 keeps the lowest index when all its columns are NaN.
    var best_key = 0u;
    var best_index = part;
    for (var col = part; col < params.vocab; col += n_parts) {
        let key = order_key(io[base + col]);
        if (key > best_key) {
            best_key = key;
            best_index = col;
        }
    }
    partials[item] = vec2<u32>(best_key, best_index);
}

@compute @workgroup_size(WG)
fn pick_best(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= params.n_rows) {
        return;
    }
    let base = row * params.n_parts;
    var best = partials[base];
    for (var p = 1u; p < params.n_parts; p += 1u) {
        let candidate = partials[base + p];
        if (before(candidate, best)) {
            best = candidate;
        }
    }
    io[row] = best.y;
}

@compute @workgroup_size(WG)
fn scan_row(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wg.x + wg.y * nwg.x;
    // As scan_parts with n_parts = WG; an invocation past the vocab keeps (0, lid), which only
    // an all-NaN row could pick, and there invocation 0's (0, 0) ranks first.
    var best = vec2<u32>(0u, lid);
    if (row < params.n_rows) {
        let base = row * params.vocab;
        for (var col = lid; col < params.vocab; col += WG) {
            let key = order_key(io[base + col]);
            if (key > best.x) {
                best = vec2<u32>(key, col);
            }
        }
    }
    row_best[lid] = best;
    workgroupBarrier();
    if (lid == 0u && row < params.n_rows) {
        for (var i = 1u; i < WG; i += 1u) {
            let candidate = row_best[i];
            if (before(candidate, best)) {
                best = candidate;
            }
        }
        out[row] = best.y;
    }
}
