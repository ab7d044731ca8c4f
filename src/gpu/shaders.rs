//! Every WGSL source of the crate, by file name (without `.wgsl`).

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`).
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => include_str!("../../shaders/add.wgsl"),
        "argmax" => include_str!("../../shaders/argmax.wgsl"),
        "kv_write" => include_str!("../../shaders/kv_write.wgsl"),
        "rms_norm" => include_str!("../../shaders/rms_norm.wgsl"),
        "rope" => include_str!("../../shaders/rope.wgsl"),
        "silu_mul" => include_str!("../../shaders/silu_mul.wgsl"),
        "embed_q8_0" => include_str!("../../shaders/embed_q8_0.wgsl"),
        "matmul_q4_1" => include_str!("../../shaders/matmul_q4_1.wgsl"),
        "matmul_q8_0" => include_str!("../../shaders/matmul_q8_0.wgsl"),
        "attention" => include_str!("../../shaders/attention.wgsl"),
        "attention_reduce" => include_str!("../../shaders/attention_reduce.wgsl"),
        "attention_batch" => include_str!("../../shaders/attention_batch.wgsl"),
        "attention_batch_reduce" => include_str!("../../shaders/attention_batch_reduce.wgsl"),
        "quantize_act" => include_str!("../../shaders/quantize_act.wgsl"),
        _ => return None,
    })
}
