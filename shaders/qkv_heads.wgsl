// Everything between the qkv matmul and attention in one dispatch, after rms_common.wgsl (the
// RMS), rope_common.wgsl (the rotation) and kv_common.wgsl (the bindings of the KV write, the
// slot lookup, the quantization): on the fused qkv rows x ([n_tokens, (n_heads + 2 *
// n_kv_heads) * head_dim] f32, each row q heads, k heads, v heads),
// - q and k heads: [QK_NORM: x / sqrt(mean(x²) + eps) * q_norm (or k_norm), per head (Gemma 3)],
//   then RoPE at the token's position, in place (attention reads the q heads from x);
// - k heads (roped) and v heads: written to the layer's pool at the token's slot, f32 or INT8.
// One invocation per (token, head of the row): a head's steps need nothing of other heads, so
// the invocation runs them one after the other on its own head, each with the same arithmetic
// as the kernel it replaces (head_norm.wgsl, rope.wgsl, kv_write.wgsl, whose shared pieces are
// these preludes): the results are those of running the three in order, bit for bit.
// No workgroup memory and no barriers: on CPU adapters a layout of one invocation per pair of
// dims (rope.wgsl's, the angle formed once per token) that shares the RMS and the INT8 maximum
// through workgroup memory measured slower, its barriers costing more than the angles saved
// (Gemma 3 heads: 1.6-2.2x the three kernels' time at 512 rows on lavapipe, 3.4-4.5x on
// SwiftShader). This layout's price: each q and k head forms its pairs' angles itself.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
    scale_base: u32, // INT8: first word of the scales; unused for f32
    eps: f32,        // QK_NORM only
    // The turn table of rope_common.wgsl.
    turns: array<vec4<u32>, 128>,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read> params: Params;
// [2, head_dim] f32: the q heads' norm weights, then the k heads' (one buffer: with params in
// storage the kernel binds WebGPU's default 8 storage buffers per stage). Read only with QK_NORM
// (without it any buffer stands in).
@group(0) @binding(7) var<storage, read> qk_norm: array<f32>;

override WG: u32 = 64u;
override QK_NORM: bool = false;
override INT8: bool = false;
// RoPE turns the first ROT_HALF pairs, of the first 2 * ROT_HALF dims of a head, paired within
// them (partial rotary; 0: no RoPE, a NoPE layer); the other dims stay. Default: every pair.
override ROT_HALF: u32 = 0xffffffffu;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let n_q = params.n_heads;
    let n_kv = params.n_kv_heads;
    let heads = n_q + 2u * n_kv;
    if (item >= params.n_tokens * heads) {
        return;
    }
    let token = item / heads;
    let head = item % heads;
    let dim = params.head_dim;
    // Heads are head_dim apart and rows are whole heads: head `head` of row `token` starts here.
    let base = item * dim;
    if (head < n_q + n_kv) {
        if (QK_NORM) {
            let scale = inv_rms(base, dim, params.eps);
            let weight = select(0u, dim, head >= n_q);
            for (var d = 0u; d < dim; d += 1u) {
                x[base + d] = x[base + d] * scale * qk_norm[weight + d];
            }
        }
        let pos = positions[token];
        let half = min(dim / 2u, ROT_HALF);
        for (var pair = 0u; pair < half; pair += 1u) {
            let dims = pair_dims(pair, half);
            let j = base + dims.x;
            let r = rotated(vec2<f32>(x[j], x[j + dims.y]), pair_sin_cos(params.turns[pair / 2u], pair, pos));
            x[j] = r.x;
            x[j + dims.y] = r.y;
        }
    }
    if (head < n_q) {
        return;
    }
    let is_v = head >= n_q + n_kv;
    let group = kv_group(token, (head - n_q) % n_kv, n_kv, params.block_size, params.n_blocks);
    if (group == NO_GROUP) {
        return;
    }
    if (INT8) {
        store_int8(is_v, group, base, dim, params.scale_base);
    } else {
        store_f32(is_v, group * dim, base, 0u, dim);
    }
}
