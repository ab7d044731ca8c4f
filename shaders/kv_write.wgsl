// Appends the new tokens' keys and values to one layer's paged KV pool, as f32 or as INT8, after
// kv_common.wgsl (the bindings, the pool layout, the slot lookup, the quantization).
// x: the fused qkv rows, after RoPE.
// f32: each invocation copies PER consecutive dims of one (token, kv head), keys and values.
// INT8: each invocation quantizes one (token, kv head) whole (PER = head_dim): the scale needs
// the group's maximum before any code is written.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    n_blocks: u32,
    scale_base: u32, // INT8: first word of the scales; unused for f32
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> params: Params;

override WG: u32 = 64u;
override PER: u32 = 4u;
override INT8: bool = false;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = gid.x + gid.y * nwg.x * WG;
    let head_dim = params.head_dim;
    let n_kv = params.n_kv_heads;
    let chunks = (head_dim + PER - 1u) / PER;
    if (item >= params.n_tokens * n_kv * chunks) {
        return;
    }
    let token = item / (n_kv * chunks);
    let rest = item % (n_kv * chunks);
    let head = rest / chunks;
    let dim0 = (rest % chunks) * PER;
    let group = kv_group(token, head, n_kv, params.block_size, params.n_blocks);
    if (group == NO_GROUP) {
        return;
    }
    let row_stride = (params.n_heads + 2u * n_kv) * head_dim;
    let k_src = token * row_stride + (params.n_heads + head) * head_dim;
    let v_src = k_src + n_kv * head_dim;
    if (INT8) {
        store_int8(false, group, k_src, head_dim, params.scale_base);
        store_int8(true, group, v_src, head_dim, params.scale_base);
        return;
    }
    let end = min(dim0 + PER, head_dim);
    store_f32(false, group * head_dim, k_src, dim0, end);
    store_f32(true, group * head_dim, v_src, dim0, end);
}
