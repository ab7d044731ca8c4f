// Appends the new tokens' keys and values to one layer's paged KV pool.
// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row q heads, k heads, v heads
//      (after RoPE); positions: [n_tokens] u32, the absolute position of each token in its sequence;
// k_pool, v_pool: [n_blocks, n_kv_heads, block_size, head_dim] f32: element (b, h, s, d) at
//      ((b * n_kv_heads + h) * block_size + s) * head_dim + d, head-major inside a block so that
//      attention streams one head's keys of a block contiguously;
// block_table: u32, the sequence's row starts at step.table_base: logical block i of the sequence
//      is physical block block_table[table_base + i].
// Position p goes to logical block p / block_size, slot p % block_size. A table index past the
// table's end or a physical block >= n_blocks writes nothing (never out of bounds).
// Each invocation copies PER consecutive dims of one (token, kv head), keys and values.

struct Params { n_tokens: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, block_size: u32, n_blocks: u32 }
struct Step { table_base: u32 }

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_pool: array<f32>;
@group(0) @binding(2) var<storage, read_write> v_pool: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> block_table: array<u32>;
@group(0) @binding(6) var<uniform> step: Step;

override WG: u32 = 64u;
override PER: u32 = 4u;

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
    let entry = step.table_base + logical;
    // The sum wraps only for absurd bases; entry < table_base catches it.
    if (entry >= arrayLength(&block_table) || entry < step.table_base) {
        return;
    }
    let block = block_table[entry];
    if (block >= params.n_blocks) {
        return;
    }
    let row_stride = (params.n_heads + 2u * n_kv) * head_dim;
    let k_src = token * row_stride + (params.n_heads + head) * head_dim;
    let v_src = k_src + n_kv * head_dim;
    let dst = ((block * n_kv + head) * params.block_size + pos % params.block_size) * head_dim;
    for (var k = 0u; k < PER; k += 1u) {
        let d = dim0 + k;
        if (d < head_dim) {
            k_pool[dst + d] = qkv[k_src + d];
            v_pool[dst + d] = qkv[v_src + d];
        }
    }
}
