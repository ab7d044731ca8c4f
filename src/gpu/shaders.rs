//! Every WGSL source of the crate, by file name (without `.wgsl`).

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`).
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => include_str!("../../shaders/add.wgsl"),
        "embed_q8_0" => include_str!("../../shaders/embed_q8_0.wgsl"),
        "matmul_q4_1" => include_str!("../../shaders/matmul_q4_1.wgsl"),
        "matmul_q8_0" => include_str!("../../shaders/matmul_q8_0.wgsl"),
        "quantize_act" => include_str!("../../shaders/quantize_act.wgsl"),
        _ => return None,
    })
}
