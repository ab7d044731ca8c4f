// Appends the new tokens' keys and values to one layer's contiguous KV cache.
// qkv: [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] f32, each row q heads, k heads, v heads
//      (after RoPE); positions: [n_tokens] u32, the cache slot of each token;
// k_cache, v_cache: [n_kv_heads, max_len, head_dim] f32, head-major so that attention streams one
//      head's keys contiguously. A position >= max_len is skipped (never written out of bounds).
// Each invocation copies PER consecutive dims of one (token, kv head), keys and values.

struct Params { n_tokens: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, max_len: u32 }

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;

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
    if (pos >= params.max_len) {
        return;
    }
    let row_stride = (params.n_heads + 2u * n_kv) * head_dim;
    let k_src = token * row_stride + (params.n_heads + head) * head_dim;
    let v_src = k_src + n_kv * head_dim;
    let dst = (head * params.max_len + pos) * head_dim;
    for (var k = 0u; k < PER; k += 1u) {
        let d = dim0 + k;
        if (d < head_dim) {
            k_cache[dst + d] = qkv[k_src + d];
            v_cache[dst + d] = qkv[v_src + d];
        }
    }
}
