// Appends the new tokens' keys and values to one layer's paged KV pool, as f32 or as INT8.
// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row q heads, k heads, v heads
//      (after RoPE); positions: [n_tokens] u32, the absolute position of each token in its sequence;
// k_pool, v_pool (bound as u32 words for both dtypes):
//      f32:  [n_blocks, n_kv_heads, block_size, head_dim] f32: element (b, h, s, d) at
//            ((b * n_kv_heads + h) * block_size + s) * head_dim + d, head-major inside a block so
//            that attention streams one head's keys of a block contiguously;
//      INT8: the same order in codes, 4 per word (code d in byte d % 4 of word d / 4 of the
//            group), group g = (b * n_kv_heads + h) * block_size + s at word g * head_dim / 4,
//            then its f32 scale at word scale_base + g (crate::quant::kv_int8);
// block_table: u32; token t's sequence's row starts at row_tables[t] (its table_base): logical
//      block i of that sequence is physical block block_table[table_base + i]. Tokens of one
//      dispatch may belong to different sequences (continuous batching).
// Position p goes to logical block p / block_size, slot p % block_size. A table index past the
// table's end or a physical block >= n_blocks writes nothing (never out of bounds).
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

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_pool: array<u32>;
@group(0) @binding(2) var<storage, read_write> v_pool: array<u32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> block_table: array<u32>;
@group(0) @binding(6) var<storage, read> row_tables: array<u32>;

override WG: u32 = 64u;
override PER: u32 = 4u;
override INT8: bool = false;

// The largest |value| of the head_dim values at src.
fn group_max(src: u32) -> f32 {
    var m = 0.0;
    for (var d = 0u; d < params.head_dim; d += 1u) {
        m = max(m, abs(qkv[src + d]));
    }
    return m;
}

// 127 / max, or 0 for an all-zero group (its codes stay 0). quant.rs computes the same.
fn inverse_step(group_max: f32) -> f32 {
    return select(0.0, 127.0 / group_max, group_max > 0.0);
}

// Codes of the 4 values at src, round half to even like quant.rs, packed little end first.
fn pack_codes(src: u32, inv: f32) -> u32 {
    let x = vec4<f32>(qkv[src], qkv[src + 1u], qkv[src + 2u], qkv[src + 3u]);
    let q = vec4<i32>(clamp(round(x * inv), vec4<f32>(-127.0), vec4<f32>(127.0)));
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

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
    let pos = positions[token];
    let logical = pos / params.block_size;
    let table_base = row_tables[token];
    let entry = table_base + logical;
    // The sum wraps only for absurd bases; entry < table_base catches it.
    if (entry >= arrayLength(&block_table) || entry < table_base) {
        return;
    }
    let block = block_table[entry];
    if (block >= params.n_blocks) {
        return;
    }
    let row_stride = (params.n_heads + 2u * n_kv) * head_dim;
    let k_src = token * row_stride + (params.n_heads + head) * head_dim;
    let v_src = k_src + n_kv * head_dim;
    let group = (block * n_kv + head) * params.block_size + pos % params.block_size;
    if (INT8) {
        let k_max = group_max(k_src);
        let v_max = group_max(v_src);
        let k_inv = inverse_step(k_max);
        let v_inv = inverse_step(v_max);
        let words = head_dim / 4u;
        for (var w = 0u; w < words; w += 1u) {
            k_pool[group * words + w] = pack_codes(k_src + 4u * w, k_inv);
            v_pool[group * words + w] = pack_codes(v_src + 4u * w, v_inv);
        }
        k_pool[params.scale_base + group] = bitcast<u32>(k_max / 127.0);
        v_pool[params.scale_base + group] = bitcast<u32>(v_max / 127.0);
        return;
    }
    let dst = group * head_dim;
    for (var k = 0u; k < PER; k += 1u) {
        let d = dim0 + k;
        if (d < head_dim) {
            k_pool[dst + d] = bitcast<u32>(qkv[k_src + d]);
            v_pool[dst + d] = bitcast<u32>(qkv[v_src + d]);
        }
    }
}
