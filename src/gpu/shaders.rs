//! Every WGSL source of the crate, by file name (without `.wgsl`).
//!
//! A kernel family shares its common code through a prelude file prepended to each kernel's
//! body (WGSL has no includes): `attention_group` (in the `_subgroup` variants, for devices with
//! subgroups, `attention_group_subgroup`) + `attention_read` + `attention_common` before `attention`
//! and `attention_batch`, and in their `_fresh` variants (the decode attentions that rope and
//! write their step's heads) `rope_common` + `kv_codes` + `attention_fresh` in place of
//! `attention_read`,
//! `attention_reduce_common` before their reduce kernels, `rms_common` before `rms_norm` and
//! `head_norm` and `residual_norm`, `quantize_common` before `quantize_act` and after
//! `rms_common` before the norms that quantize (`rms_norm`, `residual_norm`), `rope_common`
//! before `rope`, `kv_codes` + `kv_common` before `kv_write`, all four (`rms_common` + `rope_common` +
//! `kv_codes` + `kv_common`) before `qkv_heads`, which fuses head_norm, rope and kv_write, `order_key` before
//! `argmax` and `sample`, `act_common` before `glu` and every matmul. The quantized matmuls are
//! `act_common` + `matmul_common` + activation preludes (`matmul_split` + `matmul_x`; in the
//! `_subgroup` variant of each, for CPU adapters with subgroups, `matmul_x_subgroup`; in the
//! `_subgroup_sum` variant, for GPUs with subgroups, `matmul_split_subgroup` + `matmul_x`) + the
//! slots prelude (`matmul_slots16`; `matmul_slots32`, tiles of up to 32 slots, in the `_wide`
//! variant of the first) + the body: `matmul_q4_1` and `matmul_q8_0` have bodies of their own;
//! every other type is one body per shape with the block format as a prelude, `matmul_<type>` being those preludes +
//! `quant_common` + `quant_<type>` + `matmul_blocks`, and `embed_<type>` is `quant_common` + `quant_<type>` + `embed`. The
//! concatenation happens at compile time, so every source stays a `&'static str`.

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

/// The `matmul_<type>`, `matmul_<type>_subgroup` and `embed_<type>` sources of the
/// quantized-weight family, for each type named by its `quant_<type>` prelude; `None` for any
/// other name.
macro_rules! quant_family {
    ($name:expr, matmul: [$($m:literal),*], embed: [$($e:literal),*]) => {
        match $name {
            $(concat!("matmul_", $m) => concat!(
                wgsl!("act_common"), "\n", wgsl!("matmul_common"), "\n", wgsl!("matmul_split"), "\n", wgsl!("matmul_x"), "\n", wgsl!("matmul_slots16"), "\n", wgsl!("quant_common"), "\n",
                include_str!(concat!("../../shaders/quant_", $m, ".wgsl")), "\n", wgsl!("matmul_blocks")
            ),)*
            $(concat!("matmul_", $m, "_wide") => concat!(
                wgsl!("act_common"), "\n", wgsl!("matmul_common"), "\n", wgsl!("matmul_split"), "\n", wgsl!("matmul_x"), "\n", wgsl!("matmul_slots32"), "\n", wgsl!("quant_common"), "\n",
                include_str!(concat!("../../shaders/quant_", $m, ".wgsl")), "\n", wgsl!("matmul_blocks")
            ),)*
            $(concat!("matmul_", $m, "_subgroup_sum") => concat!(
                wgsl!("act_common"), "\n", wgsl!("matmul_common"), "\n", wgsl!("matmul_split_subgroup"), "\n", wgsl!("matmul_x"), "\n", wgsl!("matmul_slots16"), "\n", wgsl!("quant_common"), "\n",
                include_str!(concat!("../../shaders/quant_", $m, ".wgsl")), "\n", wgsl!("matmul_blocks")
            ),)*
            $(concat!("matmul_", $m, "_subgroup") => concat!(
                wgsl!("act_common"), "\n", wgsl!("matmul_common"), "\n", wgsl!("matmul_x_subgroup"), "\n", wgsl!("matmul_slots16"), "\n", wgsl!("quant_common"), "\n",
                include_str!(concat!("../../shaders/quant_", $m, ".wgsl")), "\n", wgsl!("matmul_blocks")
            ),)*
            $(concat!("embed_", $e) => concat!(wgsl!("quant_common"), "\n", include_str!(concat!("../../shaders/quant_", $e, ".wgsl")), "\n", wgsl!("embed")),)*
            _ => return None,
        }
    };
}

/// The preludes of the attention that ropes and writes its step's heads (`attention_fresh`), after
/// its group prelude and before `attention_common`.
macro_rules! fresh {
    () => {
        concat!(wgsl!("rope_common"), "\n", wgsl!("kv_codes"), "\n", wgsl!("attention_fresh"))
    };
}

/// A matmul body of its own after the activation preludes `$x`.
macro_rules! matmul_body {
    ([$($x:literal),*], $body:literal) => {
        concat!(wgsl!("act_common"), "\n", wgsl!("matmul_common"), "\n", $(wgsl!($x), "\n",)* wgsl!($body))
    };
}

/// The source of shader `name` (its file name under `shaders/` without `.wgsl`), its family's
/// prelude included. Preludes are not shaders of their own.
pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "add" => wgsl!("add"),
        "softcap" => wgsl!("softcap"),
        "argmax" => with_prelude!("order_key", "argmax"),
        "sample" => with_prelude!("order_key", "sample"),
        "kv_write" => concat!(wgsl!("kv_codes"), "\n", with_prelude!("kv_common", "kv_write")),
        "rms_norm" => concat!(wgsl!("rms_common"), "\n", wgsl!("quantize_common"), "\n", with_prelude!("norm_out", "rms_norm")),
        "head_norm" => with_prelude!("rms_common", "head_norm"),
        "rope" => with_prelude!("rope_common", "rope"),
        "qkv_heads" => concat!(wgsl!("rms_common"), "\n", wgsl!("rope_common"), "\n", wgsl!("kv_codes"), "\n", with_prelude!("kv_common", "qkv_heads")),
        "glu" => with_prelude!("act_common", "glu"),
        "residual_norm" => concat!(wgsl!("rms_common"), "\n", wgsl!("quantize_common"), "\n", with_prelude!("norm_out", "residual_norm")),
        "matmul_q4_1" => matmul_body!(["matmul_split", "matmul_x", "matmul_slots16"], "matmul_q4_1"),
        "matmul_q4_1_wide" => matmul_body!(["matmul_split", "matmul_x", "matmul_slots32"], "matmul_q4_1"),
        "matmul_q4_1_subgroup" => matmul_body!(["matmul_x_subgroup", "matmul_slots16"], "matmul_q4_1"),
        "matmul_q4_1_subgroup_sum" => matmul_body!(["matmul_split_subgroup", "matmul_x", "matmul_slots16"], "matmul_q4_1"),
        "matmul_q8_0" => matmul_body!(["matmul_split", "matmul_x", "matmul_slots16"], "matmul_q8_0"),
        "matmul_q8_0_wide" => matmul_body!(["matmul_split", "matmul_x", "matmul_slots32"], "matmul_q8_0"),
        "matmul_q8_0_subgroup" => matmul_body!(["matmul_x_subgroup", "matmul_slots16"], "matmul_q8_0"),
        "matmul_q8_0_subgroup_sum" => matmul_body!(["matmul_split_subgroup", "matmul_x", "matmul_slots16"], "matmul_q8_0"),
        "attention" => concat!(wgsl!("attention_group"), "\n", wgsl!("attention_read"), "\n", with_prelude!("attention_common", "attention")),
        "attention_subgroup" => concat!(wgsl!("attention_group_subgroup"), "\n", wgsl!("attention_read"), "\n", with_prelude!("attention_common", "attention")),
        "attention_fresh" => concat!(wgsl!("attention_group"), "\n", fresh!(), "\n", with_prelude!("attention_common", "attention")),
        "attention_fresh_subgroup" => concat!(wgsl!("attention_group_subgroup"), "\n", fresh!(), "\n", with_prelude!("attention_common", "attention")),
        "attention_reduce" => with_prelude!("attention_reduce_common", "attention_reduce"),
        "attention_batch" => concat!(wgsl!("attention_group"), "\n", wgsl!("attention_read"), "\n", with_prelude!("attention_common", "attention_batch")),
        "attention_batch_subgroup" => {
            concat!(wgsl!("attention_group_subgroup"), "\n", wgsl!("attention_read"), "\n", with_prelude!("attention_common", "attention_batch"))
        }
        "attention_batch_fresh" => concat!(wgsl!("attention_group"), "\n", fresh!(), "\n", with_prelude!("attention_common", "attention_batch")),
        "attention_batch_fresh_subgroup" => {
            concat!(wgsl!("attention_group_subgroup"), "\n", fresh!(), "\n", with_prelude!("attention_common", "attention_batch"))
        }
        "attention_batch_reduce" => with_prelude!("attention_reduce_common", "attention_batch_reduce"),
        "quantize_act" => with_prelude!("quantize_common", "quantize_act"),
        other => return quant_source(other),
    })
}

fn quant_source(name: &str) -> Option<&'static str> {
    Some(quant_family!(name,
        matmul: ["f32", "f16", "bf16", "q4_0", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"],
        embed: ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]))
}
