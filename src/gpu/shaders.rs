//! Every WGSL source of the crate, by file name (without `.wgsl`).

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`).
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => include_str!("../../shaders/add.wgsl"),
        _ => return None,
    })
}
