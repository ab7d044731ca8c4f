//! SmolLM2 in every weight type, teacher-forced: the GPU engine on a re-encoded file against the
//! float64 CPU recompute of the same file ([`forward_cpu_from`]), over a few public prompts plus
//! llama.cpp's greedy completions (tests/data/llamacpp_public.json).
//!
//! The files: F16, BF16, Q8_0, Q4_0, Q5_0 and Q5_1 are the Q4_1 model's matrices re-encoded by
//! llama.cpp's own Python library (`bash scripts/reencode-all.sh`, which scripts/test.sh runs);
//! the K-quants are written by this test with pagedlm's own quantizer ([`kquant_model`]), with
//! llama.cpp's fallbacks for rows that are not whole super-blocks.
//!
//! Both sides compute with the same dequantized weights, so where the reference's top-1 is clear
//! (margin ≥ 0.5) the GPU must pick it: a miss there is a decoding bug (nibble order, scale
//! layout), not rounding. Each type runs as its own test, over 96 positions: some through the
//! decode path (matvec kernels), most through prefill (matmul kernels).
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::path::PathBuf;
use std::time::Instant;

use common::{llamacpp_items, real_model_bytes, report};
use pagedlm::engine::{Engine, EngineOptions, ScoreMode};
use pagedlm::gguf::{GgmlType, Gguf};
use pagedlm::model::reference::forward_cpu_from;
use pagedlm::model::ModelConfig;
use pagedlm::sampler::{argmax, top_k};
use pagedlm::synth::requantize_gguf;

const LLAMACPP: &str = include_str!("data/llamacpp_public.json");

/// A reference step at least this clear must be matched.
const CLEAR_MARGIN: f32 = 0.5;
/// Share of the clear steps on which the GPU's top-1 must equal the reference's.
const MIN_AGREEMENT: f64 = 0.99;
/// Fewer clear steps than this would make the agreement meaningless (Q2_K, the coarsest type,
/// has 37 of 62).
const MIN_CLEAR_STEPS: usize = 30;

/// (prompt id, completion tokens kept, path): 96 positions, 62 of them scored. On lavapipe a
/// decode step (its full logits read back) costs about three prefill positions, so most run
/// through prefill. Measured on 2 shared cores: about 15 s of GPU scoring and 6 s of float64
/// reference per type alone; the 11 types in one run, two at a time, in about 4 minutes.
const PROMPTS: &[(&str, usize, ScoreMode)] =
    &[("pub_raw_capital", 8, ScoreMode::Decode), ("pub_raw_numbers", 27, ScoreMode::Prefill), ("pub_raw_story", 24, ScoreMode::Prefill)];

/// Where a type's model comes from.
enum Source {
    /// Re-encoded by scripts/reencode.py (PyPI's gguf).
    Reencoded,
    /// Written by pagedlm's own quantizer from the Q4_1 model.
    Requantized,
}

fn source(ty: GgmlType) -> Source {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Source::Requantized,
        _ => Source::Reencoded,
    }
}

fn reencoded_path(ty: GgmlType) -> PathBuf {
    let dir = std::env::var("PAGEDLM_REENCODED_DIR").unwrap_or_else(|_| format!("{}/models/reencoded", env!("CARGO_MANIFEST_DIR")));
    PathBuf::from(dir).join(format!("SmolLM2-135M-Instruct.{}.gguf", ty.name()))
}

/// The K-quant files: the Q4_1 model's matrices re-encoded by pagedlm's own quantizer
/// ([`requantize_gguf`]); rows that are not whole 256-value super-blocks (SmolLM2's 576-wide
/// matrices) fall back as llama.cpp's do, so only `ffn_down` (1536 wide) is of the K-quant type.
fn kquant_model(q4_1: &[u8], ty: GgmlType) -> Vec<u8> {
    requantize_gguf(q4_1, ty).unwrap_or_else(|e| panic!("re-encoding the model to {}: {e}", ty.name()))
}

async fn model_bytes(ty: GgmlType) -> Vec<u8> {
    match source(ty) {
        Source::Reencoded => {
            let path = reencoded_path(ty);
            std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "the re-encoded model is needed at {} ({e}): run `bash scripts/reencode-all.sh` (re-encodes \
                     models/SmolLM2-135M-Instruct.Q4_1.gguf with PyPI's gguf into models/reencoded/)",
                    path.display()
                )
            })
        }
        Source::Requantized => kquant_model(&real_model_bytes().await, ty),
    }
}

/// The public prompts this test runs: token ids (prompt + kept completion) and where scoring starts.
fn items() -> Vec<(String, Vec<u32>, usize, ScoreMode)> {
    let all = llamacpp_items(LLAMACPP);
    PROMPTS
        .iter()
        .map(|&(id, keep, mode)| {
            let r = all.iter().find(|r| r.id == id).unwrap_or_else(|| panic!("prompt {id} in llamacpp_public.json"));
            let end = (r.from + keep).min(r.ids.len());
            (id.to_string(), r.ids[..end].to_vec(), r.from, mode)
        })
        .collect()
}

/// The reference's choice and its margin over the runner-up.
fn top1_and_margin(row: &[f32]) -> (u32, f32) {
    let top = top_k(row, 2);
    (top[0].0, top[0].1 - top[1].1)
}

#[derive(Default)]
struct Stats {
    steps: usize,
    agree: usize,
    clear: usize,
    clear_agree: usize,
    max_diff: f32,
    misses: Vec<String>,
}

/// Checks that every 2-D tensor of the file is of type `ty` (or, for K-quants, that `ty` is there
/// at all): the test must be running the type it names.
fn check_file_types(gguf: &Gguf<'_>, ty: GgmlType) {
    let counts = gguf.tensor_type_counts();
    match source(ty) {
        Source::Reencoded => {
            for t in gguf.tensors.iter().filter(|t| t.dims.len() == 2) {
                assert_eq!(
                    t.ggml_type,
                    ty,
                    "{}: {} is {}, not {} (a stale file? rerun scripts/reencode-all.sh)",
                    ty.name(),
                    t.name,
                    t.ggml_type.name(),
                    ty.name()
                );
            }
        }
        Source::Requantized => assert!(counts.contains_key(&ty.name()), "{}: the requantized file holds {counts:?}", ty.name()),
    }
}

async fn teacher_forced(ty: GgmlType) {
    let t0 = Instant::now();
    let bytes = model_bytes(ty).await;
    let file_s = t0.elapsed().as_secs_f64();
    let gguf = Gguf::parse(&bytes).unwrap();
    check_file_types(&gguf, ty);
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let t0 = Instant::now();
    let mut engine = Engine::load(&bytes, EngineOptions { max_context: 256, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{}: the engine refused the file: {e}", ty.name()));
    let load_s = t0.elapsed().as_secs_f64();
    let (mut gpu_s, mut cpu_s) = (0.0, 0.0);
    let mut stats = Stats::default();
    for (id, ids, from, mode) in items() {
        let t = Instant::now();
        let rows = engine.score_logits(&ids, from, mode).await.unwrap_or_else(|e| panic!("{} {id}: scoring on the GPU failed: {e}", ty.name()));
        gpu_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let reference = forward_cpu_from(&gguf, &cfg, &ids, from - 1).unwrap_or_else(|e| panic!("{}: the CPU reference failed: {e}", ty.name()));
        cpu_s += t.elapsed().as_secs_f64();
        assert_eq!(rows.len(), reference.len(), "{id}: one row per scored position");
        for (i, (row, want)) in rows.iter().zip(&reference).enumerate() {
            let ((theirs, m), ours) = (top1_and_margin(want), argmax(row));
            stats.steps += 1;
            stats.agree += usize::from(ours == theirs);
            if m >= CLEAR_MARGIN {
                stats.clear += 1;
                if ours == theirs {
                    stats.clear_agree += 1;
                } else {
                    stats.misses.push(format!("{id} ({mode:?}) step {i}: GPU {ours}, reference {theirs} by {m:.2}"));
                }
            }
            let d = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            stats.max_diff = stats.max_diff.max(d);
        }
    }
    let rate = stats.clear_agree as f64 / stats.clear.max(1) as f64;
    report(&format!(
        "reencoded {}: {} steps, top-1 equal on {}/{} clear steps (margin ≥ {CLEAR_MARGIN}) and {:.1}% of all, max |Δlogit| {:.1e}; \
         file {file_s:.1} s, load {load_s:.1} s, GPU scoring {gpu_s:.1} s, CPU f64 reference {cpu_s:.1} s",
        ty.name(),
        stats.steps,
        stats.clear_agree,
        stats.clear,
        100.0 * stats.agree as f64 / stats.steps as f64,
        stats.max_diff
    ));
    assert!(stats.clear >= MIN_CLEAR_STEPS, "{}: only {} clear steps", ty.name(), stats.clear);
    assert!(rate >= MIN_AGREEMENT, "{}: top-1 agreement {rate:.3} on clear steps is under {MIN_AGREEMENT}: {:?}", ty.name(), stats.misses);
}

/// One test per type.
macro_rules! reencoded_tests {
    ($($(#[$attr:meta])* $name:ident: $ty:expr;)*) => {$(
        #[test]
        $(#[$attr])*
        fn $name() {
            pollster::block_on(teacher_forced($ty));
        }
    )*};
}

reencoded_tests! {
    q8_0_matches_the_f64_reference: GgmlType::Q8_0;
    f16_matches_the_f64_reference: GgmlType::F16;
    bf16_matches_the_f64_reference: GgmlType::BF16;
    q4_0_matches_the_f64_reference: GgmlType::Q4_0;
    q5_0_matches_the_f64_reference: GgmlType::Q5_0;
    q5_1_matches_the_f64_reference: GgmlType::Q5_1;
    q2_k_matches_the_f64_reference: GgmlType::Q2_K;
    q3_k_matches_the_f64_reference: GgmlType::Q3_K;
    q4_k_matches_the_f64_reference: GgmlType::Q4_K;
    q5_k_matches_the_f64_reference: GgmlType::Q5_K;
    q6_k_matches_the_f64_reference: GgmlType::Q6_K;
}

/// Writes the K-quant files next to the re-encoded ones, for `bench/weight_types.sh` (not a
/// test: `cargo test --release --test reencoded -- --ignored write_kquant_files`).
#[test]
#[ignore]
fn write_kquant_files() {
    let q4_1 = pollster::block_on(real_model_bytes());
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let path = reencoded_path(ty);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, kquant_model(&q4_1, ty)).unwrap();
        println!("{}", path.display());
    }
}
