// The prelude of the kernels that append keys and values to a layer's paged KV pool
// (kv_write.wgsl; qkv_heads.wgsl, which first norms and ropes the heads), prepended to each body
// after kv_codes.wgsl (src/gpu/shaders.rs), whose slot rule and stores both use. It declares the
// bindings both share and kv_codes.wgsl's accessors; each body declares binding 0, `x` (the fused qkv rows the values are
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

// The group token `token` of KV head `head` goes to (kv_codes.wgsl's kv_slot at its position,
// through its sequence's table row), or NO_GROUP.
fn kv_group(token: u32, head: u32, n_kv_heads: u32, block_size: u32, n_blocks: u32) -> u32 {
    return kv_slot(positions[token], row_tables[token], head, n_kv_heads, block_size, n_blocks);
}

// kv_codes.wgsl's accessors: the values come from the body's `x`, the pools are words.
fn kv_src(i: u32) -> f32 {
    return x[i];
}

fn pool_store(is_v: bool, word: u32, value: u32) {
    if (is_v) {
        v_pool[word] = value;
    } else {
        k_pool[word] = value;
    }
}
