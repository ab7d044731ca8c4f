#![cfg(not(target_arch = "wasm32"))]
//! The architectures' descriptions (`src/model/arch.rs`) against real files and against what the
//! backends are built from: a description's tensor table names exactly the tensors a real file
//! of its architecture holds (SmolLM2 for `llama`, Gemma 3 270M for `gemma3`), with their dims;
//! every op of a layer plan names tensors the table has; the synthetic writer writes the table.
mod common;

use std::collections::BTreeMap;

use pagedlm::gguf::Gguf;
use pagedlm::model::arch::{Shape, DESCRIPTIONS};
use pagedlm::model::{Architecture, ModelConfig, Op, Role};
use pagedlm::synth::{family_model, tiny_llama_gguf, GgufWriter, SynthConfig, SynthGemma, FAMILY_MODELS};

/// The file's tensors against `cfg`'s table: every table entry present with its dims (an optional
/// one may be absent), and no tensor in the file the table lacks.
fn table_matches_file(what: &str, gguf: &Gguf<'_>, cfg: &ModelConfig) {
    let table = cfg.tensors();
    let in_file: BTreeMap<&str, &[u64]> = gguf.tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice())).collect();
    for spec in &table.tensors {
        match in_file.get(spec.name.as_str()) {
            Some(dims) => assert_eq!(*dims, spec.shape.dims().as_slice(), "{what}: {} dims", spec.name),
            None => assert!(spec.optional, "{what}: the table's {} is not in the file", spec.name),
        }
    }
    let named: Vec<&str> = table.tensors.iter().map(|t| t.name.as_str()).collect();
    let unknown: Vec<&&str> = in_file.keys().filter(|name| !named.contains(name)).collect();
    assert!(unknown.is_empty(), "{what}: tensors the table does not know: {unknown:?}");
}

/// Every role the plan's ops name is in the table, for every layer.
fn plan_names_table_tensors(what: &str, cfg: &ModelConfig) {
    let (table, plan) = (cfg.tensors(), cfg.plan());
    assert_eq!(plan.layers.len(), cfg.n_layers as usize, "{what}: a plan per layer");
    for (l, ops) in (0u32..).zip(&plan.layers) {
        let mut roles: Vec<Role> = Vec::new();
        for op in ops {
            match op {
                Op::Norm(role) | Op::Residual { post_norm: Some(role) } => roles.push(*role),
                Op::HeadNorm { q, k } => roles.extend([*q, *k]),
                Op::Matmul { weights, .. } => roles.extend(weights.iter().copied()),
                Op::Rope(rope) => assert_eq!(rope.dims, cfg.rope_dims, "{what}: layer {l} rotates the model's RoPE dimensions"),
                Op::Bias { biases, .. } => roles.extend(biases.iter().copied()),
                Op::Attention(attend) => assert_eq!(attend.window, cfg.layer_window(l), "{what}: layer {l}'s window"),
                Op::Residual { post_norm: None } | Op::Glu(_) => {}
            }
        }
        for role in roles {
            assert!(table.get(Some(l), role).is_some(), "{what}: layer {l}'s plan names {role:?}, which the table lacks");
        }
    }
    assert!(table.get(None, plan.output_norm).is_some(), "{what}: the head's norm");
}

#[test]
fn every_architecture_has_one_description() {
    for d in DESCRIPTIONS {
        assert_eq!(Architecture::named(d.name), Some(d.architecture), "{}", d.name);
        assert_eq!(d.architecture.description().name, d.name);
        assert_eq!(DESCRIPTIONS.iter().filter(|o| o.name == d.name || o.architecture == d.architecture).count(), 1, "{} once", d.name);
    }
    assert_eq!(Architecture::names(), "llama, gemma3, qwen2, qwen3, phi3, gemma2 and smollm3");
}

#[test]
fn the_tables_name_exactly_the_tensors_of_the_synthetic_files() {
    let gemma = SynthConfig { n_layers: 7, gemma: Some(SynthGemma { window: 8, head_dim: 32 }), ..SynthConfig::tiny() };
    for (what, cfg) in [("llama", SynthConfig::tiny()), ("gemma3", gemma)] {
        let bytes = tiny_llama_gguf(&cfg);
        let gguf = Gguf::parse(&bytes).unwrap();
        let config = ModelConfig::from_gguf(&gguf).unwrap();
        table_matches_file(what, &gguf, &config);
        plan_names_table_tensors(what, &config);
        // The writer leaves the optional output projection out: tied to the embedding.
        assert!(config.tensors().tensors.iter().any(|t| t.role == Role::Output && t.optional));
    }
}

#[test]
fn the_tables_name_exactly_the_tensors_of_the_real_files() {
    let smollm2 =
        std::fs::read(format!("{}/models/SmolLM2-135M-Instruct.Q4_1.gguf", env!("CARGO_MANIFEST_DIR"))).expect("SmolLM2 is needed: run `npm run fetch-model`");
    let gemma3 = common::gemma_model_bytes();
    for (what, bytes) in [("SmolLM2 (llama)", &smollm2), ("Gemma 3 270M", &gemma3)] {
        let gguf = Gguf::parse(bytes).unwrap();
        let config = ModelConfig::from_gguf(&gguf).unwrap();
        table_matches_file(what, &gguf, &config);
        plan_names_table_tensors(what, &config);
        let vectors = config.tensors().tensors.iter().filter(|t| matches!(t.shape, Shape::Vector(_))).count();
        assert!(vectors > 2 * config.n_layers as usize, "{what}: the norms are in the table");
    }
}

#[test]
fn the_tables_name_exactly_the_tensors_of_the_synthetic_family_files() {
    for name in FAMILY_MODELS {
        let bytes = tiny_llama_gguf(&family_model(name).unwrap());
        let gguf = Gguf::parse(&bytes).unwrap();
        let config = ModelConfig::from_gguf(&gguf).unwrap();
        table_matches_file(name, &gguf, &config);
        plan_names_table_tensors(name, &config);
    }
    // What each plan holds beyond llama's.
    let plan = |name: &str| ModelConfig::from_gguf(&Gguf::parse(&tiny_llama_gguf(&family_model(name).unwrap())).unwrap()).unwrap();
    assert!(plan("qwen2").plan().layers[0].iter().any(|op| matches!(op, Op::Bias { .. })));
    let smollm3 = plan("smollm3").plan();
    let ropes: Vec<bool> = smollm3.layers.iter().map(|ops| ops.iter().any(|op| matches!(op, Op::Rope(_)))).collect();
    assert_eq!(ropes, [true, true, true, false], "smollm3: layer 3 has no RoPE");
    let phi3 = plan("phi3");
    assert_eq!((phi3.rope_dims, phi3.head_dim, phi3.rope_scale, phi3.sliding_window), (12, 16, 1.19, None));
    let gemma2 = plan("gemma2");
    assert_eq!((gemma2.attn_softcap, gemma2.final_softcap), (Some(3.0), Some(8.0)));
    let windows: Vec<Option<u32>> = (0..4).map(|l| gemma2.layer_window(l)).collect();
    assert_eq!(windows, [Some(5), None, Some(5), None], "gemma2: even layers local");
    assert!(plan("llama3").rope_factors.is_some(), "llama3: rope_freqs read");
}

/// `bytes` with the tensor `name` ([len] F32) added.
fn with_extra_tensor(bytes: &[u8], name: &str, len: u64) -> Vec<u8> {
    let gguf = Gguf::parse(bytes).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &gguf.metadata {
        w.add_meta(k.clone(), v.clone()).unwrap();
    }
    for t in &gguf.tensors {
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type, gguf.tensor_data(t).to_vec()).unwrap();
    }
    w.add_tensor(name, &[len], pagedlm::gguf::GgmlType::F32, vec![0; len as usize * 4]).unwrap();
    w.to_bytes()
}

#[test]
fn a_tensor_the_description_does_not_know_is_refused_by_name() {
    // q biases in a llama file, rope factors in a qwen3 file: never ignored.
    let llama = with_extra_tensor(&tiny_llama_gguf(&SynthConfig::tiny()), "blk.0.attn_q.bias", 64);
    let qwen3 = with_extra_tensor(&tiny_llama_gguf(&family_model("qwen3").unwrap()), "rope_freqs.weight", 16);
    for (bytes, name) in [(llama, "blk.0.attn_q.bias"), (qwen3, "rope_freqs.weight")] {
        let err = ModelConfig::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap_err();
        assert!(matches!(err, pagedlm::model::ModelError::Unsupported(_)) && err.to_string().contains(name), "{err}");
    }
}

#[test]
fn a_table_refuses_a_tensor_of_the_wrong_shape_by_name() {
    let bytes = tiny_llama_gguf(&SynthConfig::tiny());
    let gguf = Gguf::parse(&bytes).unwrap();
    let mut config = ModelConfig::from_gguf(&gguf).unwrap();
    // A table built for a wider FFN than the file's.
    config.ffn *= 2;
    let table = config.tensors();
    let spec = table.get(Some(0), Role::FfnGate).unwrap();
    let err = spec.read(&gguf).unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_gate.weight") && err.contains("dims"), "{err}");
}
