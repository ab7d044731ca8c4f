// The prelude of the kernels that append keys and values to a layer's paged KV pool
// (kv_write.wgsl; qkv_heads.wgsl, which first norms and ropes the heads), prepended to each body
// after kv_codes.wgsl (src/gpu/shaders.rs), so both find the slot and quantize with the same
// code. It declares the
// bindings both share; each body declares binding 0, `x` (the fused qkv rows the values are
// read from, [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row q heads, k heads,
// v heads), and binding 4, its parameters (read-only storage, see Context::params_init).
//
// k_pool, v_pool (bound as u32 words for both dtypes):
//      f32:  [n_blocks, n_kv_heads, block_size, head_dim] f32: element (b, h, s, d) at
//            ((b * n_kv_heads + h) * block_size + s) * head_dim + d, head-major inside a block so
//            that attention streams one head's keys of a block contiguously;
//      INT8: the same order in codes, 4 per word (code d in byte d % 4 of word d / 4 of the
//            group), group g = (b * n_kv_heads + h) * block_size + s at word g * head_dim / 4,
//            then its f32 scale at word scale_base + g (crate::quant::kv_int8);
// positions: [n_tokens] u32, the absolute position of each token in its sequence;
// block_table: u32; token t's sequence's row starts at row_tables[t] (its table_base): logical
//      block i of that sequence is physical block block_table[table_base + i]. Tokens of one
//      dispatch may belong to different sequences (continuous batching).
// Position p goes to logical block p / block_size, slot p % block_size. A table index past the
// table's end or a physical block >= n_blocks writes nothing (never out of bounds).

@group(0) @binding(1) var<storage, read_write> k_pool: array<u32>;
@group(0) @binding(2) var<storage, read_write> v_pool: array<u32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> block_table: array<u32>;
@group(0) @binding(6) var<storage, read> row_tables: array<u32>;

// kv_group's answer for a token whose slot is no block.
const NO_GROUP: u32 = 0xffffffffu;

// The group (b * n_kv_heads + head) * block_size + slot that token `token` of KV head `head`
// goes to, or NO_GROUP when its table entry is past the table or its block >= n_blocks.
fn kv_group(token: u32, head: u32, n_kv_heads: u32, block_size: u32, n_blocks: u32) -> u32 {
    let pos = positions[token];
    let table_base = row_tables[token];
    let entry = table_base + pos / block_size;
    // The sum wraps only for absurd bases; entry < table_base catches it.
    if (entry >= arrayLength(&block_table) || entry < table_base) {
        return NO_GROUP;
    }
    let block = block_table[entry];
    if (block >= n_blocks) {
        return NO_GROUP;
    }
    return (block * n_kv_heads + head) * block_size + pos % block_size;
}

// Stores one word of the V pool (is_v) or of the K pool.
fn pool_store(is_v: bool, word: u32, value: u32) {
    if (is_v) {
        v_pool[word] = value;
    } else {
        k_pool[word] = value;
    }
}

// f32 pools: copies dims first..end of the head at x[src] to the group starting at word dst.
fn store_f32(is_v: bool, dst: u32, src: u32, first: u32, end: u32) {
    for (var d = first; d < end; d += 1u) {
        pool_store(is_v, dst + d, bitcast<u32>(x[src + d]));
    }
}

// The largest |value| of the dim values at src.
fn group_max(src: u32, dim: u32) -> f32 {
    var m = 0.0;
    for (var d = 0u; d < dim; d += 1u) {
        m = max(m, abs(x[src + d]));
    }
    return m;
}

// Codes of the 4 values at src (kv_codes.wgsl).
fn pack_codes(src: u32, inv: f32) -> u32 {
    return codes_of(vec4<f32>(x[src], x[src + 1u], x[src + 2u], x[src + 3u]), inv);
}

// INT8 pools: quantizes the head of dim values at x[src] as group `group` (its codes, then its
// scale at word scale_base + group). The scale needs the whole group's maximum first.
fn store_int8(is_v: bool, group: u32, src: u32, dim: u32, scale_base: u32) {
    let m = group_max(src, dim);
    let inv = inverse_step(m);
    let words = dim / 4u;
    for (var w = 0u; w < words; w += 1u) {
        pool_store(is_v, group * words + w, pack_codes(src + 4u * w, inv));
    }
    pool_store(is_v, scale_base + group, bitcast<u32>(m / 127.0));
}
