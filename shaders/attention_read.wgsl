// The second prelude of every attention kernel but the fresh ones (attention_fresh.wgsl is the
// other, with the same names), before attention_common.wgsl: qkv and the pools read-only, and
// nothing to do before the key loop.

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_pool: array<vec4<u32>>;

fn before_keys(lid: u32, kv_head: u32, rows: vec2<u32>) {}
