//! Every WGSL source of the crate, by file name (without `.wgsl`).

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`).
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => include_str!("../../shaders/add.wgsl"),
        "attention" => include_str!("../../shaders/attention.wgsl"),
        "attention_reduce" => include_str!("../../shaders/attention_reduce.wgsl"),
        _ => return None,
    })
}
