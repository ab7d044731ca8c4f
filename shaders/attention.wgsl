// Causal attention (llama, GQA) over a contiguous KV cache.
//
// One invocation owns a tile of query rows, TT tokens x HT heads of one KV group, so every K/V
// vec4 it loads serves all rows of the tile (the GQA heads of a group share their K/V rows;
// consecutive prefill tokens share their keys). On CPU adapters this is the cheap kind of reuse:
// no shared memory, no barriers, the tile lives in private memory.
//
// An invocation never handles more than CHUNK keys: lavapipe ends every loop of an invocation
// after 65,535 back-edges in total (all loops together, LP_MAX_TGSI_LOOP_ITERATIONS), silently.
// SPLIT (flash-decoding): the key range is cut into CHUNK-key splits, one per invocation; each
// writes its unnormalized online-softmax state (max, sum, acc) for attention_reduce.wgsl to combine.
// Without SPLIT (passes, for prefill): one dispatch per CHUNK keys starting at params.pass_begin,
// in order; each merges its keys into the normalized output and the per-row state.
//
// qkv:       [n_tokens, (n_heads + 2*n_kv_heads) * head_dim] f32, q heads first in each row (roped)
// k_cache:   [n_kv_heads, max_len, head_dim] f32
// v_cache:   [n_kv_heads, max_len, head_dim] f32
// positions: [n_tokens] u32; token t attends keys 0..=positions[t] (clamped to max_len - 1)
// dst:       SPLIT: [n_tokens * n_heads * max_splits, 1 + head_dim/4] vec4, record (row, split) =
//                   ((m, l, 0, 0), acc[head_dim/4]) with row = t * n_heads + h
//            else:  out [n_tokens, n_heads * head_dim] f32
// state:     passes: [n_tokens * n_heads] (m, l) of the keys merged so far; unused with SPLIT

struct Params {
    n_tokens: u32,
    n_heads: u32,
    group: u32,           // n_heads / n_kv_heads: query heads per KV head
    max_len: u32,
    qkv_stride4: u32,     // qkv row length in vec4
    head_blocks: u32,     // ceil(group / HT)
    token_blocks: u32,    // ceil(n_tokens / TT)
    items_per_split: u32, // token_blocks * head_blocks * n_kv_heads
    max_splits: u32,
    scale: f32,           // 1 / sqrt(head_dim)
    pass_begin: u32,      // first key of this dispatch (passes), a multiple of CHUNK
}

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> state: array<vec2<f32>>;

override D4: u32 = 16u;      // head_dim / 4
override HT: u32 = 1u;       // heads of one KV group per invocation
override TT: u32 = 1u;       // tokens per invocation
override SPLIT: bool = false;
override CHUNK: u32 = 128u;  // keys per invocation: per split, or per pass
override WG: u32 = 8u;

// Private tile storage is sized for the largest tile the launcher allows: HT * TT * D4 <= MAX_TILE.
const MAX_ROWS: u32 = 16u;
const MAX_TILE: u32 = 256u;
// Below any score; exp(NEG_BIG - s) is exactly 0 and NEG_BIG - s stays finite.
const NEG_BIG: f32 = -3.0e38;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let split = item / params.items_per_split;
    if ((SPLIT && split >= params.max_splits) || (!SPLIT && split > 0u)) {
        return;
    }
    let rest = item % params.items_per_split;
    let token_block = rest % params.token_blocks;
    let head_block = (rest / params.token_blocks) % params.head_blocks;
    let kv_head = rest / (params.token_blocks * params.head_blocks);

    var q: array<vec4<f32>, MAX_TILE>;
    var acc: array<vec4<f32>, MAX_TILE>;
    // Keys below lim[r] are visible to row r; 0 marks a row outside the problem (ragged tile).
    var lim: array<u32, MAX_ROWS>;
    var m: array<f32, MAX_ROWS>;
    var l: array<f32, MAX_ROWS>;
    var score: array<f32, MAX_ROWS>;
    var p: array<f32, MAX_ROWS>;
    var corr: array<f32, MAX_ROWS>;

    var key_end = 0u;
    for (var r = 0u; r < HT * TT; r++) {
        let t = token_block * TT + r / HT;
        let hg = head_block * HT + r % HT;
        m[r] = NEG_BIG;
        l[r] = 0.0;
        lim[r] = 0u;
        if (t < params.n_tokens && hg < params.group) {
            lim[r] = min(positions[t], params.max_len - 1u) + 1u;
            key_end = max(key_end, lim[r]);
        }
        let h = kv_head * params.group + hg;
        for (var d = 0u; d < D4; d++) {
            // Pre-scaled so the score needs no multiply per key.
            if (lim[r] > 0u) {
                q[r * D4 + d] = qkv[t * params.qkv_stride4 + h * D4 + d] * params.scale;
            } else {
                q[r * D4 + d] = vec4<f32>(0.0);
            }
            acc[r * D4 + d] = vec4<f32>(0.0);
        }
    }

    var key_begin = params.pass_begin;
    if (SPLIT) {
        key_begin = split * CHUNK;
    }
    key_end = min(key_end, key_begin + CHUNK);
    if (key_begin >= key_end) {
        return;
    }

    let kv_base = kv_head * params.max_len * D4;
    for (var j = key_begin; j < key_end; j++) {
        let row = kv_base + j * D4;
        for (var r = 0u; r < HT * TT; r++) {
            score[r] = 0.0;
        }
        for (var d = 0u; d < D4; d++) {
            let kv = k_cache[row + d];
            for (var r = 0u; r < HT * TT; r++) {
                score[r] += dot(q[r * D4 + d], kv);
            }
        }
        // Online softmax: rescale the running sum and accumulator only when the max grows.
        for (var r = 0u; r < HT * TT; r++) {
            p[r] = 0.0;
            corr[r] = 1.0;
            if (j < lim[r]) {
                if (score[r] > m[r]) {
                    corr[r] = exp(m[r] - score[r]);
                    m[r] = score[r];
                }
                p[r] = exp(score[r] - m[r]);
                l[r] = l[r] * corr[r] + p[r];
            }
        }
        for (var d = 0u; d < D4; d++) {
            let vv = v_cache[row + d];
            for (var r = 0u; r < HT * TT; r++) {
                acc[r * D4 + d] = acc[r * D4 + d] * corr[r] + p[r] * vv;
            }
        }
    }

    for (var r = 0u; r < HT * TT; r++) {
        if (lim[r] <= key_begin) {
            continue;
        }
        let t = token_block * TT + r / HT;
        let h = kv_head * params.group + head_block * HT + r % HT;
        let out_row = t * params.n_heads + h;
        if (SPLIT) {
            let rec = (out_row * params.max_splits + split) * (D4 + 1u);
            dst[rec] = vec4<f32>(m[r], l[r], 0.0, 0.0);
            for (var d = 0u; d < D4; d++) {
                dst[rec + 1u + d] = acc[r * D4 + d];
            }
        } else if (key_begin == 0u) {
            let inv = 1.0 / l[r];
            for (var d = 0u; d < D4; d++) {
                dst[out_row * D4 + d] = acc[r * D4 + d] * inv;
            }
            state[out_row] = vec2<f32>(m[r], l[r]);
        } else {
            // Merge with the earlier passes' normalized output o_old of sum l_old at max m_old.
            let old = state[out_row];
            let m_new = max(old.x, m[r]);
            let w_old = old.y * exp(old.x - m_new);
            let w_acc = exp(m[r] - m_new);
            let l_new = w_old + l[r] * w_acc;
            let inv = 1.0 / l_new;
            for (var d = 0u; d < D4; d++) {
                let o = out_row * D4 + d;
                dst[o] = (dst[o] * w_old + acc[r * D4 + d] * w_acc) * inv;
            }
            state[out_row] = vec2<f32>(m_new, l_new);
        }
    }
}
