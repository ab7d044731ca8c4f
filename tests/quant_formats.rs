//! The CPU GGML weight formats (`pagedlm::quant`) against test vectors that llama.cpp's own
//! Python library wrote (`tests/data/quant/`, made by `scripts/quant_vectors.py` with
//! `gguf` 0.19.0): every dequantizer bit-exact, the F32/F16/BF16 and legacy quantizers byte-equal
//! to `gguf.quants.quantize`, the quantize → dequantize round trip of every type within a stated
//! bound, the nibble order of the 4- and 5-bit types, and bad lengths as errors; the re-encoding
//! of whole GGUF files (`synth::requantize_gguf`), the CPU reference forward pass over every
//! type, and the synthetic model's weight types. Pure CPU; natively and in the browser.

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use pagedlm::gguf::{GgmlType, Gguf};
use pagedlm::quant::{bytes_of, dequantize, quantize, QuantError};
use pagedlm::rng::Rng;
use pagedlm::synth::{requantize_gguf, row_type, tiny_llama_gguf, try_tiny_llama_gguf, SynthConfig, SynthTypes};

/// The committed vectors of one type: raw blocks, their dequantization by `gguf`, and (for the
/// types `gguf` quantizes) the values whose quantization starts the blocks.
struct Vectors {
    blocks: &'static [u8],
    dequantized: &'static [u8],
    input: Option<&'static [u8]>,
}

macro_rules! vectors {
    ($name:literal) => {
        Vectors {
            blocks: include_bytes!(concat!("data/quant/", $name, ".blocks")),
            dequantized: include_bytes!(concat!("data/quant/", $name, ".f32")),
            input: None,
        }
    };
    ($name:literal, input) => {
        Vectors { input: Some(include_bytes!(concat!("data/quant/", $name, ".input.f32"))), ..vectors!($name) }
    };
}

fn vectors(t: GgmlType) -> Vectors {
    match t {
        GgmlType::F32 => vectors!("F32", input),
        GgmlType::F16 => vectors!("F16", input),
        GgmlType::BF16 => vectors!("BF16", input),
        GgmlType::Q4_0 => vectors!("Q4_0", input),
        GgmlType::Q4_1 => vectors!("Q4_1", input),
        GgmlType::Q5_0 => vectors!("Q5_0", input),
        GgmlType::Q5_1 => vectors!("Q5_1", input),
        GgmlType::Q8_0 => vectors!("Q8_0", input),
        GgmlType::Q2_K => vectors!("Q2_K"),
        GgmlType::Q3_K => vectors!("Q3_K"),
        GgmlType::Q4_K => vectors!("Q4_K"),
        GgmlType::Q5_K => vectors!("Q5_K"),
        GgmlType::Q6_K => vectors!("Q6_K"),
        other => panic!("no vectors for {}", other.name()),
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn values_per_block(t: GgmlType) -> usize {
    t.block_size().expect("a supported type has a block size").0 as usize
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn every_dequantizer_is_bit_exact_to_gguf() {
    for t in GgmlType::SUPPORTED {
        let v = vectors(t);
        let want = f32s(v.dequantized);
        assert!(want.len() >= 1024, "{}: only {} reference values", t.name(), want.len());
        let mut got = vec![f32::NAN; want.len()];
        dequantize(t, v.blocks, &mut got).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        let wrong: Vec<String> = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .take(5)
            .map(|i| format!("value {i} (block {}): {} instead of {}", i / values_per_block(t), got[i], want[i]))
            .collect();
        assert!(wrong.is_empty(), "{} differs from gguf's dequantize: {wrong:?}", t.name());
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn float_and_legacy_quantizers_give_ggufs_bytes() {
    let mut checked = 0;
    for t in GgmlType::SUPPORTED {
        let v = vectors(t);
        let Some(input) = v.input else { continue };
        let input = f32s(input);
        let got = quantize(t, &input).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        let want = &v.blocks[..got.len()];
        let block_bytes = t.block_size().unwrap().1 as usize;
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let b = i / block_bytes;
            panic!(
                "{}: byte {i} (block {b}) is {:#04x}, gguf wrote {:#04x}; the block's values: {:?}",
                t.name(),
                got[i],
                want[i],
                &input[b * values_per_block(t)..][..values_per_block(t)]
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 8, "F32, F16, BF16 and the five legacy types have inputs");
}

/// What a round trip may lose on one block: the largest error allowed for each value.
fn round_trip_bound(t: GgmlType, x: &[f32]) -> Vec<f32> {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let lo = x.iter().copied().fold(f32::MAX, f32::min);
    let hi = x.iter().copied().fold(f32::MIN, f32::max);
    // f16 scales carry a relative error of 2^-11; a few of those over the block's magnitude.
    let slack = (amax + (hi - lo)) * 2f32.powi(-10);
    let uniform = |b: f32| vec![b; x.len()];
    match t {
        GgmlType::F32 => uniform(0.0),
        // Half an ulp; below 2^-14 f16 is subnormal, with a fixed ulp of 2^-24.
        GgmlType::F16 => x.iter().map(|v| (v.abs() * 2f32.powi(-11)).max(2f32.powi(-25))).collect(),
        GgmlType::BF16 => x.iter().map(|v| v.abs() * 2f32.powi(-8)).collect(),
        // The value of largest magnitude goes to −8 (−16), so the other sign may clip by a step.
        GgmlType::Q4_0 => uniform(amax / 8.0 + slack),
        GgmlType::Q5_0 => uniform(amax / 16.0 + slack),
        // Half a step: [min, max] is spread over every level.
        GgmlType::Q4_1 => uniform((hi - lo) / 15.0 / 2.0 + slack),
        GgmlType::Q5_1 => uniform((hi - lo) / 31.0 / 2.0 + slack),
        GgmlType::Q8_0 => uniform(amax / 127.0 / 2.0 + slack),
        _ => k_quant_bound(t, x),
    }
}

/// K-quants: one step of the value's sub-block, plus one step of the super-block's scale codes
/// (`d`, and `dmin` in the types with a minimum), which round each sub-block's scale up.
fn k_quant_bound(t: GgmlType, x: &[f32]) -> Vec<f32> {
    // (sub-block length, highest quant of an affine type or |lowest| of a symmetric one, largest
    // scale code, whether values subtract a minimum)
    let (sub, levels, code_max, has_min) = match t {
        GgmlType::Q2_K => (16, 3.0, 15.0, true),
        GgmlType::Q3_K => (16, 4.0, 31.0, false),
        GgmlType::Q4_K => (32, 15.0, 63.0, true),
        GgmlType::Q5_K => (32, 31.0, 63.0, true),
        _ => (16, 32.0, 127.0, false),
    };
    let step_and_min = |s: &[f32]| {
        let lo = s.iter().copied().fold(0f32, f32::min);
        let hi = s.iter().copied().fold(0f32, f32::max);
        if has_min {
            ((hi - lo) / levels, -lo)
        } else {
            (hi.max(-lo) / levels, 0.0)
        }
    };
    let subs: Vec<(f32, f32)> = x.chunks(sub).map(step_and_min).collect();
    let d = subs.iter().fold(0f32, |a, s| a.max(s.0)) / code_max;
    let dmin = subs.iter().fold(0f32, |a, s| a.max(s.1)) / code_max;
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    subs.iter().flat_map(|&(step, _)| vec![step + 1.01 * (d + dmin) + amax * 1e-6; sub]).collect()
}

/// Blocks of 256 values (every type's block divides it): each with its own magnitude and
/// offset, and the edge cases (all zero, one outlier, a constant, all negative).
fn round_trip_values(rng: &mut Rng) -> Vec<f32> {
    let mut blocks: Vec<Vec<f32>> = (0..48)
        .map(|_| {
            let scale = 10f32.powf(rng.uniform(-3.0, 2.0));
            let offset = if rng.below(2) == 0 { rng.uniform(-1.0, 1.0) } else { 0.0 };
            (0..256).map(|_| (rng.normal() + offset) * scale).collect()
        })
        .collect();
    blocks.push(vec![0.0; 256]);
    blocks.push((0..256).map(|i| if i == 77 { 30.0 } else { 0.01 * rng.normal() }).collect());
    blocks.push(vec![-0.75; 256]);
    blocks.push((0..256).map(|_| -rng.uniform(0.5, 2.0)).collect());
    blocks.concat()
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn every_type_round_trips_within_its_bound() {
    let mut rng = Rng::new(14);
    let values = round_trip_values(&mut rng);
    for t in GgmlType::SUPPORTED {
        let raw = quantize(t, &values).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        assert_eq!(Some(raw.len() as u64), bytes_of(t, values.len() as u64), "{}: size", t.name());
        let mut back = vec![f32::NAN; values.len()];
        dequantize(t, &raw, &mut back).unwrap();
        // The bound is per 256-value block for the legacy types' 32-value blocks too.
        let bound_block = values_per_block(t).max(32);
        let mut worst = (0usize, 0f32, 0f32);
        for (b, (x, y)) in values.chunks(bound_block).zip(back.chunks(bound_block)).enumerate() {
            for (i, ((x, y), bound)) in x.iter().zip(y).zip(round_trip_bound(t, x)).enumerate() {
                let err = (x - y).abs();
                assert!(err <= bound, "{}: value {} = {x} came back as {y}: error {err} > bound {bound}", t.name(), b * bound_block + i);
                if bound > 0.0 && err / bound > worst.2 {
                    worst = (b * bound_block + i, err, err / bound);
                }
            }
        }
        eprintln!("{}: worst error {:.3e} at value {}, {:.0}% of its bound", t.name(), worst.1, worst.0, worst.2 * 100.0);
    }
}

/// Q4_0/Q4_1/Q5_*: the low nibble of byte j is element j, the high nibble element j + 16, and
/// bit j of Q5's little-endian `qh` is bit 4 of element j (a block built by hand, and the
/// quantizer's bytes for a ramp).
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn nibble_order_is_ggmls() {
    let one = half::f16::from_f32(1.0).to_le_bytes();
    let qh: u32 = 0b1010_0000_0000_0011_0000_0000_0000_0101;
    for (t, has_min, bits, offset) in
        [(GgmlType::Q4_0, false, 4, 8), (GgmlType::Q4_1, true, 4, 0), (GgmlType::Q5_0, false, 5, 16), (GgmlType::Q5_1, true, 5, 0)]
    {
        let mut block = one.to_vec();
        if has_min {
            block.extend_from_slice(&[0, 0]);
        }
        if bits == 5 {
            block.extend_from_slice(&qh.to_le_bytes());
        }
        // Element j (< 16) gets j, element j + 16 gets 15 − j: every pair differs.
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut got = [0f32; 32];
        dequantize(t, &block, &mut got).unwrap();
        for (e, &got) in got.iter().enumerate() {
            let nibble = if e < 16 { e as u32 } else { 31 - e as u32 };
            let high = if bits == 5 { (qh >> e) & 1 } else { 0 };
            let want = (nibble | high << 4) as f32 - offset as f32;
            assert_eq!(got, want, "{}: element {e}", t.name());
        }

        let ramp: Vec<f32> = (0..32).map(|e| e as f32 * 0.25).collect();
        let raw = quantize(t, &ramp).unwrap();
        let mut back = [0f32; 32];
        dequantize(t, &raw, &mut back).unwrap();
        // Elements j and j + 16 are 4 apart in the ramp, so a quantizer that put them in the
        // other nibbles would be off by 4.
        for (e, (x, y)) in ramp.iter().zip(&back).enumerate() {
            assert!((x - y).abs() <= 0.5, "{}: element {e} = {x} came back as {y}", t.name());
        }
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn bad_lengths_and_types_are_errors_not_panics() {
    for t in GgmlType::SUPPORTED {
        let (values, bytes) = t.block_size().unwrap();
        let (values, bytes) = (values as usize * 2, bytes as usize * 2);
        let mut out = vec![0f32; values];
        assert!(matches!(dequantize(t, &vec![0; bytes - 1], &mut out), Err(QuantError::ByteLength { .. })), "{}: short", t.name());
        assert!(matches!(dequantize(t, &vec![0; bytes + 1], &mut out), Err(QuantError::ByteLength { .. })), "{}: long", t.name());
        dequantize(t, &vec![0; bytes], &mut out).unwrap();
        assert_eq!(bytes_of(t, values as u64), Some(bytes as u64));
        if values > 2 {
            let e = quantize(t, &vec![0.0; values - 1]).unwrap_err();
            assert!(matches!(e, QuantError::PartialBlock { .. }) && e.to_string().contains(&t.name()), "{}: {e}", t.name());
            assert!(dequantize(t, &vec![0; bytes], &mut out[1..]).is_err());
            assert_eq!(bytes_of(t, values as u64 - 1), None);
        }
    }
    let iq4_xs = GgmlType::Other(23);
    let e = dequantize(iq4_xs, &[0; 136], &mut [0f32; 256]).unwrap_err();
    assert!(matches!(e, QuantError::Unsupported(_)) && e.to_string().contains("IQ4_XS"), "{e}");
    assert!(matches!(quantize(iq4_xs, &[0.0; 256]), Err(QuantError::Unsupported(_))));
}

/// llama.cpp's fallbacks for rows that are not whole 256-value super-blocks, restated.
fn k_fallback(t: GgmlType) -> Option<GgmlType> {
    match t {
        GgmlType::Q2_K | GgmlType::Q3_K => Some(GgmlType::Q4_0),
        GgmlType::Q4_K => Some(GgmlType::Q5_0),
        GgmlType::Q5_K => Some(GgmlType::Q5_1),
        GgmlType::Q6_K => Some(GgmlType::Q8_0),
        _ => None,
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn row_types_fall_back_as_llama_cpp_does() {
    for t in GgmlType::SUPPORTED {
        assert_eq!(row_type(t, 512), t, "{}: whole super-blocks keep the type", t.name());
        assert_eq!(row_type(t, 576), k_fallback(t).unwrap_or(t), "{}: 576-wide rows", t.name());
        let odd = if matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) { t } else { GgmlType::F16 };
        assert_eq!(row_type(t, 48), odd, "{}: rows of 48 fit no 32-value block", t.name());
    }
}

/// A synthetic llama whose FFN width (the down projection's ne0) is not whole super-blocks, so
/// K-quant targets give a mixed file, as llama.cpp's do for small models.
fn mixed_width_config() -> SynthConfig {
    SynthConfig { hidden: 256, ffn: 320, n_heads: 4, n_kv_heads: 2, seed: 21, ..SynthConfig::tiny() }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn requantize_gguf_re_encodes_every_matrix_and_keeps_the_rest() {
    let original = tiny_llama_gguf(&mixed_width_config());
    let src = Gguf::parse(&original).unwrap();
    for target in GgmlType::SUPPORTED {
        let bytes = requantize_gguf(&original, target).unwrap_or_else(|e| panic!("{}: {e}", target.name()));
        let out = Gguf::parse(&bytes).unwrap();
        assert_eq!(out.metadata, src.metadata, "{}: metadata kept", target.name());
        assert_eq!(out.tensors.len(), src.tensors.len());
        for (a, b) in src.tensors.iter().zip(&out.tensors) {
            let what = format!("{} → {}: {}", a.ggml_type.name(), target.name(), a.name);
            assert_eq!((&a.name, &a.dims), (&b.name, &b.dims), "{what}");
            if a.dims.len() != 2 {
                assert_eq!(a.ggml_type, b.ggml_type, "{what}");
                assert_eq!(src.tensor_data(a), out.tensor_data(b), "{what}: 1-D tensors are copied");
                continue;
            }
            let want_type = if a.dims[0] % 256 == 0 { target } else { k_fallback(target).unwrap_or(target) };
            assert_eq!(b.ggml_type, want_type, "{what}");
            let n = a.n_elements() as usize;
            let (mut before, mut after) = (vec![0f32; n], vec![0f32; n]);
            dequantize(a.ggml_type, src.tensor_data(a), &mut before).unwrap();
            dequantize(b.ggml_type, out.tensor_data(b), &mut after).unwrap();
            let block = values_per_block(b.ggml_type).max(32);
            for (x, y) in before.chunks(block).zip(after.chunks(block)) {
                for ((x, y), bound) in x.iter().zip(y).zip(round_trip_bound(b.ggml_type, x)) {
                    assert!((x - y).abs() <= bound, "{what}: {x} came back as {y} (bound {bound})");
                }
            }
        }
    }
    assert!(requantize_gguf(&original, GgmlType::Other(23)).is_err(), "IQ4_XS is no target");
}

/// The CPU reference runs every re-encoded file; an F32 re-encoding holds the very values the
/// original's blocks decode to, so its logits are the original's to the bit.
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn the_reference_forward_pass_reads_every_type() {
    use pagedlm::model::{reference::forward_cpu, ModelConfig};
    let original = tiny_llama_gguf(&mixed_width_config());
    let logits = |bytes: &[u8]| {
        let gguf = Gguf::parse(bytes).unwrap();
        forward_cpu(&gguf, &ModelConfig::from_gguf(&gguf).unwrap(), &[1, 40, 77, 200]).unwrap()
    };
    let want = logits(&original);
    for target in GgmlType::SUPPORTED {
        let got = logits(&requantize_gguf(&original, target).unwrap());
        let max_diff = got.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(got.iter().flatten().all(|v| v.is_finite()), "{}: logits not finite", target.name());
        if target == GgmlType::F32 {
            assert_eq!(got, want, "F32 re-encoding changed the logits");
        }
        eprintln!("{}: max |logit − original's| = {max_diff:.3e}", target.name());
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
#[cfg_attr(not(target_arch = "wasm32"), test)]
fn synthetic_models_take_their_weight_types_from_the_config() {
    assert_eq!(SynthConfig::tiny().types, SynthTypes { embedding: GgmlType::Q8_0, linear: GgmlType::Q4_1 });
    let base = SynthConfig { hidden: 256, ffn: 512, ..SynthConfig::tiny() };
    for (embedding, linear) in [(GgmlType::Q6_K, GgmlType::Q4_K), (GgmlType::F16, GgmlType::Q2_K), (GgmlType::BF16, GgmlType::Q5_0)] {
        let cfg = SynthConfig { types: SynthTypes { embedding, linear }, ..base.clone() };
        let bytes = try_tiny_llama_gguf(&cfg).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        for t in &gguf.tensors {
            let want = match (t.name.as_str(), t.dims.len()) {
                ("token_embd.weight", _) => embedding,
                (_, 2) => linear,
                _ => GgmlType::F32,
            };
            assert_eq!(t.ggml_type, want, "{}", t.name);
        }
    }
    // K-quants need whole super-blocks along every matrix's ne0 (hidden 64 is not).
    let small_k = SynthConfig { types: SynthTypes { linear: GgmlType::Q4_K, ..SynthTypes::default() }, ..SynthConfig::tiny() };
    let e = small_k.validate().unwrap_err().to_string();
    assert!(e.contains("Q4_K") && e.contains("256"), "{e}");
    let unsupported = SynthConfig { types: SynthTypes { embedding: GgmlType::Other(23), ..SynthTypes::default() }, ..SynthConfig::tiny() };
    assert!(unsupported.validate().is_err());
}
