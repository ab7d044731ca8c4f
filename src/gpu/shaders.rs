//! Every WGSL source of the crate, by file name (without `.wgsl`).
//!
//! A kernel family shares its common code through a prelude file prepended to each kernel's
//! body (WGSL has no includes): `attention_common` before `attention` and `attention_batch`,
//! `attention_reduce_common` before their reduce kernels, `matmul_common` before `matmul_q4_1`
//! and `matmul_q8_0`. The concatenation happens at compile time, so every source stays a
//! `&'static str`.

/// The text of `shaders/NAME.wgsl`.
macro_rules! wgsl {
    ($name:literal) => {
        include_str!(concat!("../../shaders/", $name, ".wgsl"))
    };
}

/// `shaders/PRELUDE.wgsl` followed by `shaders/BODY.wgsl`, as one module's source.
macro_rules! with_prelude {
    ($prelude:literal, $body:literal) => {
        concat!(wgsl!($prelude), "\n", wgsl!($body))
    };
}

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`), its family's
/// prelude included. Preludes are not shaders of their own.
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => wgsl!("add"),
        "argmax" => wgsl!("argmax"),
        "kv_write" => wgsl!("kv_write"),
        "rms_norm" => wgsl!("rms_norm"),
        "rope" => wgsl!("rope"),
        "silu_mul" => wgsl!("silu_mul"),
        "embed_q8_0" => wgsl!("embed_q8_0"),
        "matmul_q4_1" => with_prelude!("matmul_common", "matmul_q4_1"),
        "matmul_q8_0" => with_prelude!("matmul_common", "matmul_q8_0"),
        "attention" => with_prelude!("attention_common", "attention"),
        "attention_reduce" => with_prelude!("attention_reduce_common", "attention_reduce"),
        "attention_batch" => with_prelude!("attention_common", "attention_batch"),
        "attention_batch_reduce" => with_prelude!("attention_reduce_common", "attention_batch_reduce"),
        "quantize_act" => wgsl!("quantize_act"),
        _ => return None,
    })
}
