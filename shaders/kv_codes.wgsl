// How keys and values are written to a layer's paged KV pool, without bindings: the prelude,
// before kv_common.wgsl, of the kernels that write keys and values (kv_write.wgsl,
// qkv_heads.wgsl), and of the decode attention that writes its step's own (attention_fresh.wgsl),
// so that all find the slot and quantize alike (crate::quant::kv_int8), bit for bit. Each module
// that includes it declares `block_table` (array<u32>) and defines the two accessors the stores go
// through: kv_src(i), element i of the rows the heads are read from, and pool_store(is_v, word,
// value), word `word` of the V pool (is_v) or of the K pool. Pool layout: kv_common.wgsl.

// kv_slot's answer for a position whose slot is no block.
const NO_GROUP: u32 = 0xffffffffu;

// The group (b * n_kv_heads + head) * block_size + slot that position `pos` of KV head `head` of
// the sequence whose table row starts at `table_base` goes to: logical block pos / block_size,
// slot pos % block_size. NO_GROUP when its table entry is past the table or its block >= n_blocks.
fn kv_slot(pos: u32, table_base: u32, head: u32, n_kv_heads: u32, block_size: u32, n_blocks: u32) -> u32 {
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

// f32 pools: copies dims first..end of the head at kv_src(src) to the group starting at word dst.
fn store_f32(is_v: bool, dst: u32, src: u32, first: u32, end: u32) {
    for (var d = first; d < end; d += 1u) {
        pool_store(is_v, dst + d, bitcast<u32>(kv_src(src + d)));
    }
}

// The largest |value| of the dim values at kv_src(src).
fn head_max(src: u32, dim: u32) -> f32 {
    var m = 0.0;
    for (var d = 0u; d < dim; d += 1u) {
        m = max(m, abs(kv_src(src + d)));
    }
    return m;
}

// INT8 pools: quantizes the head of dim values at kv_src(src) as group `group` (its codes, then
// its scale at word scale_base + group). The scale needs the whole group's maximum first.
fn store_int8(is_v: bool, group: u32, src: u32, dim: u32, scale_base: u32) {
    let m = head_max(src, dim);
    let inv = inverse_step(m);
    let words = dim / 4u;
    for (var w = 0u; w < words; w += 1u) {
        let at = src + 4u * w;
        let v = vec4<f32>(kv_src(at), kv_src(at + 1u), kv_src(at + 2u), kv_src(at + 3u));
        pool_store(is_v, group * words + w, codes_of(v, inv));
    }
    pool_store(is_v, scale_base + group, bitcast<u32>(m / 127.0));
}

// 127 / max, or 0 for an all-zero group (its codes stay 0). quant.rs computes the same.
fn inverse_step(group_max: f32) -> f32 {
    return select(0.0, 127.0 / group_max, group_max > 0.0);
}

// Codes of the 4 values v, round half to even like quant.rs, packed little end first.
fn codes_of(v: vec4<f32>, inv: f32) -> u32 {
    let q = vec4<i32>(clamp(round(v * inv), vec4<f32>(-127.0), vec4<f32>(127.0)));
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

