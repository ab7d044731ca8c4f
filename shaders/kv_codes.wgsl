// The INT8 KV format's arithmetic (crate::quant::kv_int8), without bindings: the prelude, before
// kv_common.wgsl, of the kernels that write keys and values (kv_write.wgsl, qkv_heads.wgsl), and
// of the decode attention that writes its step's own (attention_fresh.wgsl), so that all quantize
// alike, bit for bit.

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

