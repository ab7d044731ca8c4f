//! The GGUF reader against the real model, the writer, the synthetic llama, hand-made broken
//! files, and a fuzz run over mutated files (which must never panic).
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use pagedlm::gguf::{GgmlType, Gguf, GgufError, MetaValue, TensorInfo, MAX_ARRAY_LEN, MAX_STRING_LEN};
use pagedlm::quant::{dequantize_q4_1, dequantize_q8_0};
use pagedlm::rng::Rng;
use pagedlm::synth::{
    gpt2_byte_to_char, tiny_llama_gguf, try_tiny_llama_gguf, GgufWriter, SynthConfig, SMOLLM2_CHAT_TEMPLATE, SYNTH_BASE_VOCAB, SYNTH_MERGES, SYNTH_SPECIALS,
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// The real model: `$PAGEDLM_MODEL`, else `models/SmolLM2-135M-Instruct.Q4_1.gguf` in the crate.
fn real_model() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = std::env::var_os("PAGEDLM_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf"));
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("the real model is needed at {} ({e}): run `npm run fetch-model`, or set PAGEDLM_MODEL to the .gguf", path.display()))
    })
}

/// Bytes per tensor computed here, independently of the reader: (values, bytes) per block.
fn expected_size(dims: &[u64], t: GgmlType) -> u64 {
    let (values, bytes) = match t {
        GgmlType::F32 => (1, 4),
        GgmlType::F16 => (1, 2),
        GgmlType::Q4_0 => (32, 18),
        GgmlType::Q4_1 => (32, 20),
        GgmlType::Q8_0 => (32, 34),
        GgmlType::BF16 => (1, 2),
        GgmlType::Q5_0 => (32, 22),
        GgmlType::Q5_1 => (32, 24),
        GgmlType::Q2_K => (256, 84),
        GgmlType::Q3_K => (256, 110),
        GgmlType::Q4_K => (256, 144),
        GgmlType::Q5_K => (256, 176),
        GgmlType::Q6_K => (256, 210),
        // IQ4_XS: ggml sizes it, pagedlm does not compute with it.
        GgmlType::Other(23) => (256, 136),
        GgmlType::Other(id) => panic!("no size for type {id}"),
    };
    dims.iter().product::<u64>() / values * bytes
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap_or_else(|| panic!("{:?} not in file", String::from_utf8_lossy(needle)))
}

fn parse_err(bytes: &[u8]) -> GgufError {
    match Gguf::parse(bytes) {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => e,
    }
}

/// A file built field by field, for layouts the writer refuses to make.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn u8(mut self, v: u8) -> Raw {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    fn pad_to(mut self, alignment: usize) -> Raw {
        self.0.resize(self.0.len().next_multiple_of(alignment), 0);
        self
    }
}

fn nested(depth: usize) -> MetaValue {
    (0..depth).fold(MetaValue::U32(7), |inner, _| MetaValue::Array(vec![inner]))
}

/// Metadata with every value type, boundary values, Unicode, empty and nested arrays.
fn every_type_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let entries = vec![
        ("t.u8", U8(255)),
        ("t.i8", I8(-128)),
        ("t.u16", U16(u16::MAX)),
        ("t.i16", I16(i16::MIN)),
        ("t.u32", U32(u32::MAX)),
        ("t.i32", I32(i32::MIN)),
        ("t.f32", F32(-1.5e-7)),
        ("t.f32_inf", F32(f32::NEG_INFINITY)),
        ("t.nan", F32(f32::NAN)),
        ("t.bool_true", Bool(true)),
        ("t.bool_false", Bool(false)),
        ("t.string", String("héllo ✓ 🦀\n\"quoted\"\0nul".into())),
        ("t.empty_string", String(std::string::String::new())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(std::f64::consts::PI)),
        ("a.u8", Array(vec![U8(0), U8(1), U8(255)])),
        ("a.i8", Array(vec![I8(-1), I8(127)])),
        ("a.u16", Array(vec![U16(1), U16(65535)])),
        ("a.i16", Array(vec![I16(-2), I16(300)])),
        ("a.u32", Array(vec![U32(10), U32(20), U32(30)])),
        ("a.i32", Array(vec![I32(-5), I32(0), I32(5)])),
        ("a.f32", Array(vec![F32(0.5), F32(-0.0)])),
        ("a.bool", Array(vec![Bool(true), Bool(false), Bool(true)])),
        ("a.string", Array(vec![String("Ġ t".into()), String(std::string::String::new()), String("<|im_end|>".into())])),
        ("a.u64", Array(vec![U64(0), U64(1 << 40)])),
        ("a.i64", Array(vec![I64(-1), I64(i64::MAX)])),
        ("a.f64", Array(vec![F64(1e300), F64(-2.5)])),
        ("a.empty", Array(vec![])),
        (
            "a.nested_mixed",
            Array(vec![Array(vec![U8(1), U8(2)]), Array(vec![]), Array(vec![String("inner".into())]), Array(vec![Array(vec![F64(1.0)]), Array(vec![])])]),
        ),
        ("a.depth8", nested(8)),
        ("general.name", String("every type".into())),
        ("general.alignment", U32(32)),
    ];
    entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

struct SampleTensor {
    name: &'static str,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

fn sample_tensors(rng: &mut Rng) -> Vec<SampleTensor> {
    let specs: Vec<(&str, Vec<u64>, GgmlType)> = vec![
        ("w.f32", vec![4, 3], GgmlType::F32),
        ("w.f16", vec![8], GgmlType::F16),
        ("w.q4_0", vec![32, 2], GgmlType::Q4_0),
        ("w.q4_1", vec![64], GgmlType::Q4_1),
        ("w.q8_0", vec![32, 1, 1, 2], GgmlType::Q8_0),
        ("w.q5_k", vec![256], GgmlType::Q5_K),
        ("w.iq4_xs", vec![256], GgmlType::Other(23)),
        ("w.scalar", vec![], GgmlType::F32),
        ("w.empty", vec![0, 5], GgmlType::F32),
        ("w.last", vec![32], GgmlType::Q8_0),
    ];
    specs
        .into_iter()
        .map(|(name, dims, ty)| {
            let len = expected_size(&dims, ty);
            let data = (0..len).map(|_| rng.next_u32() as u8).collect();
            SampleTensor { name, dims, ty, data }
        })
        .collect()
}

fn sample_writer(rng: &mut Rng) -> (GgufWriter, Vec<SampleTensor>) {
    let mut w = GgufWriter::new();
    for (k, v) in every_type_metadata() {
        w.add_meta(k, v).unwrap();
    }
    let tensors = sample_tensors(rng);
    for t in &tensors {
        w.add_tensor(t.name, &t.dims, t.ty, t.data.clone()).unwrap();
    }
    (w, tensors)
}

fn sample_file() -> (Vec<u8>, Vec<SampleTensor>) {
    let (w, tensors) = sample_writer(&mut Rng::new(42));
    (w.to_bytes(), tensors)
}

/// Position of a tensor info's offset field in a file (name found by search; the first
/// occurrence is the tensor info, since the header precedes the data).
fn offset_field(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    let name_at = find(bytes, &[&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat()) + 8;
    name_at + name.len() + 4 + 8 * n_dims + 4
}

// ---------------------------------------------------------------------------------------------
// The real model

#[test]
fn real_model_header_and_metadata_match_reference_facts() {
    let g = Gguf::parse(real_model()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.tensors.len(), 272);
    let count = |t: GgmlType| g.tensors.iter().filter(|i| i.ggml_type == t).count();
    assert_eq!((count(GgmlType::Q4_1), count(GgmlType::F32), count(GgmlType::Q8_0)), (210, 61, 1));

    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    let u32s = [
        ("llama.block_count", 30),
        ("llama.embedding_length", 576),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
        ("llama.context_length", 8192),
        ("llama.rope.dimension_count", 64),
        ("llama.vocab_size", 49152),
    ];
    for (key, want) in u32s {
        assert_eq!(g.get_u32(key).unwrap(), want, "{key}");
        assert_eq!(g.get_u64(key).unwrap(), want as u64, "{key}");
    }
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert!((g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() - 1e-5).abs() < 1e-9);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(g.get("tokenizer.ggml.add_bos_token"), Some(&MetaValue::Bool(false)));

    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(g.get_str_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    let types = g.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), tokens.len());
    assert_eq!(types.iter().filter(|&&t| t == 3).count(), 17, "17 special (control) tokens");
    assert_eq!(&tokens[..3], &["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    assert!(g.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));
}

#[test]
fn real_model_tensors_have_llama_shapes_and_are_in_bounds() {
    let bytes = real_model();
    let g = Gguf::parse(bytes).unwrap();
    let (hidden, ffn, q_dim, kv_dim, vocab) = (576u64, 1536u64, 9 * 64u64, 3 * 64u64, 49152u64);
    let mut want: BTreeMap<String, (Vec<u64>, GgmlType)> = BTreeMap::new();
    want.insert("token_embd.weight".into(), (vec![hidden, vocab], GgmlType::Q8_0));
    want.insert("output_norm.weight".into(), (vec![hidden], GgmlType::F32));
    for l in 0..30 {
        let q = GgmlType::Q4_1;
        for (t, dims, ty) in [
            ("attn_norm", vec![hidden], GgmlType::F32),
            ("ffn_norm", vec![hidden], GgmlType::F32),
            ("attn_q", vec![hidden, q_dim], q),
            ("attn_k", vec![hidden, kv_dim], q),
            ("attn_v", vec![hidden, kv_dim], q),
            ("attn_output", vec![q_dim, hidden], q),
            ("ffn_gate", vec![hidden, ffn], q),
            ("ffn_up", vec![hidden, ffn], q),
            ("ffn_down", vec![ffn, hidden], q),
        ] {
            want.insert(format!("blk.{l}.{t}.weight"), (dims, ty));
        }
    }
    assert_eq!(want.len(), g.tensors.len());
    assert!(g.tensor("output.weight").is_none(), "the output projection is tied to token_embd");

    let file = bytes.as_ptr_range();
    for t in &g.tensors {
        let (dims, ty) = want.get(&t.name).unwrap_or_else(|| panic!("unexpected tensor {}", t.name));
        assert_eq!((&t.dims, t.ggml_type), (dims, *ty), "{}", t.name);
        assert_eq!(t.size_bytes, expected_size(dims, *ty), "{}", t.name);
        let info = g.require_tensor(&t.name, &[GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]).unwrap();
        let data = g.tensor_data(info);
        assert_eq!(info, t);
        assert_eq!(data.len() as u64, t.size_bytes);
        let view = data.as_ptr_range();
        assert!(file.start <= view.start && view.end <= file.end, "{} is a view into the file", t.name);
        assert_eq!(view.start as usize - file.start as usize, (g.data_offset + t.offset) as usize);
    }

    // Data are packed: each tensor starts at the next aligned offset, the last ends the file.
    let mut by_offset: Vec<&TensorInfo> = g.tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let mut end = 0u64;
    for t in by_offset {
        assert_eq!(t.offset, end.next_multiple_of(g.alignment), "{}", t.name);
        end = t.offset + t.size_bytes;
    }
    assert_eq!(g.data_offset + end, bytes.len() as u64);

    // The views decode to plausible numbers: RMS-norm gains and embedding rows.
    let norm = g.tensor_data(g.require_tensor("blk.0.attn_norm.weight", &[GgmlType::F32]).unwrap());
    let norm: Vec<f32> = norm.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(norm.iter().all(|v| v.is_finite()) && norm.iter().sum::<f32>() > 0.0);
    let embd = g.tensor_data(g.require_tensor("token_embd.weight", &[GgmlType::Q8_0]).unwrap());
    let row_bytes = (hidden / 32 * 34) as usize;
    let mut row = vec![0f32; hidden as usize];
    dequantize_q8_0(&embd[row_bytes * 520..row_bytes * 521], &mut row);
    assert!(row.iter().all(|v| v.is_finite() && v.abs() < 10.0) && row.iter().any(|&v| v != 0.0));
}

#[test]
fn real_model_tokenizer_conventions_are_the_synthetic_ones() {
    let g = Gguf::parse(real_model()).unwrap();
    assert_eq!(g.get_str("tokenizer.chat_template").unwrap(), SMOLLM2_CHAT_TEMPLATE);
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(&tokens[..3], &SYNTH_SPECIALS);
    // The byte alphabet is GPT-2's: every byte of UTF-8 text up to plane 3, control characters
    // aside, is a single-character token of the real vocab. (The real vocab lacks 21 byte
    // tokens: 0xC0, 0xC1 and 0xF5..=0xFF, which UTF-8 never uses, 0xF1 and 0xF2, which only
    // lead code points in planes 4-11, and six C0 controls.)
    let singles: std::collections::HashSet<&str> = tokens.iter().copied().filter(|t| t.chars().count() == 1).collect();
    let alphabet = gpt2_byte_to_char();
    for b in (0x20..=0xF0usize).filter(|&b| b != 0xC0 && b != 0xC1) {
        let c = alphabet[b];
        assert!(singles.contains(c.to_string().as_str()), "byte {b:#04x} as {c:?} is not a real token");
    }
    let present = alphabet.iter().filter(|c| singles.contains(c.to_string().as_str())).count();
    assert_eq!(present, 256 - 21);
    let merges = g.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(&merges[..SYNTH_MERGES.len()], &SYNTH_MERGES);
    for (key, want) in
        [("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2), ("tokenizer.ggml.unknown_token_id", 0), ("tokenizer.ggml.padding_token_id", 2)]
    {
        assert_eq!(g.get_u32(key).unwrap(), want, "{key}");
    }
}

// ---------------------------------------------------------------------------------------------
// Writer round trip

#[test]
fn round_trip_preserves_every_value_type_nested_arrays_and_tensor_bytes() {
    let (bytes, tensors) = sample_file();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.version, g.alignment), (3, 32));
    assert_eq!(g.data_offset % 32, 0);
    let want = every_type_metadata();
    assert_eq!(g.metadata.len(), want.len());
    for ((gk, gv), (wk, wv)) in g.metadata.iter().zip(&want) {
        assert_eq!(gk, wk);
        match (gv, wv) {
            (MetaValue::F32(a), MetaValue::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{wk}"),
            _ => assert_eq!(gv, wv, "{wk}"),
        }
    }
    assert!(matches!(g.get("t.nan"), Some(MetaValue::F32(v)) if v.is_nan()));

    assert_eq!(g.tensors.len(), tensors.len());
    for (info, t) in g.tensors.iter().zip(&tensors) {
        assert_eq!((info.name.as_str(), &info.dims, info.ggml_type), (t.name, &t.dims, t.ty));
        assert_eq!(info.offset % 32, 0, "{}", t.name);
        match t.ty {
            // A type ggml sizes but pagedlm does not compute with: its bytes are there, unusable.
            GgmlType::Other(_) => {
                assert_eq!(g.tensor_data(info), &t.data[..], "{}", t.name);
                let e = g.require_tensor(t.name, &[t.ty]).unwrap_err();
                assert!(matches!(e, GgufError::UnsupportedTensorType { .. }), "{e}");
            }
            _ => {
                assert_eq!(g.tensor_data(info), &t.data[..], "{}", t.name);
                assert_eq!(g.tensor_data(g.require_tensor(t.name, &[t.ty]).unwrap()), &t.data[..]);
            }
        }
    }
    assert_eq!(g.tensor("w.scalar").unwrap().n_elements(), 1);
    assert_eq!(g.tensor("w.empty").unwrap().size_bytes, 0);

    // A TensorInfo that does not come from this file still gives an in-bounds view.
    let forged = TensorInfo { name: "x".into(), dims: vec![1], ggml_type: GgmlType::F32, offset: u64::MAX - 3, size_bytes: u64::MAX, file: 0 };
    assert!(g.tensor_data(&forged).is_empty());
    let past = TensorInfo { offset: bytes.len() as u64, size_bytes: 4, ..forged };
    assert!(g.tensor_data(&past).is_empty());
}

#[test]
fn round_trip_honours_general_alignment() {
    for alignment in [1u64, 8, 64, 4096] {
        let mut rng = Rng::new(alignment);
        let mut w = GgufWriter::new();
        w.add_meta("general.alignment", MetaValue::U32(alignment as u32)).unwrap();
        let tensors = sample_tensors(&mut rng);
        for t in &tensors {
            w.add_tensor(t.name, &t.dims, t.ty, t.data.clone()).unwrap();
        }
        let bytes = w.to_bytes();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.alignment, alignment);
        assert_eq!(g.data_offset % alignment, 0);
        for (info, t) in g.tensors.iter().zip(&tensors) {
            assert_eq!(info.offset % alignment, 0);
            if info.ggml_type.block_size().is_some() {
                assert_eq!(g.tensor_data(info), &t.data[..], "{} at alignment {alignment}", t.name);
            }
        }
    }
}

#[test]
fn writer_refuses_what_it_cannot_write() {
    let mut w = GgufWriter::new();
    w.add_meta("k", MetaValue::U8(1)).unwrap();
    assert!(matches!(w.add_meta("k", MetaValue::U8(2)), Err(GgufError::InvalidWrite(_))));
    let mixed = MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]);
    let e = w.add_meta("mixed", mixed).unwrap_err();
    assert!(e.to_string().contains("mixes u8 and i8"), "{e}");
    let deep_mixed = MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::String("a".into()), MetaValue::Bool(true)])]);
    assert!(w.add_meta("deep", deep_mixed).is_err());
    let e = w.add_tensor("t", &[32, 2], GgmlType::Q4_1, vec![0; 39]).unwrap_err();
    assert!(e.to_string().contains("needs 40 bytes, got 39"), "{e}");
    assert!(w.add_tensor("t", &[33], GgmlType::Q8_0, vec![0; 34]).is_err());
    w.add_tensor("t", &[32, 2], GgmlType::Q4_1, vec![0; 40]).unwrap();
    assert!(w.add_tensor("t", &[1], GgmlType::F32, vec![0; 4]).is_err());
}

// ---------------------------------------------------------------------------------------------
// The synthetic llama

#[test]
fn tiny_llama_has_the_real_model_layout_and_metadata() {
    let cfg = SynthConfig::tiny();
    assert_eq!(cfg.vocab, SYNTH_BASE_VOCAB);
    let bytes = tiny_llama_gguf(&cfg);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    for (key, want) in [
        ("llama.block_count", cfg.n_layers),
        ("llama.embedding_length", cfg.hidden),
        ("llama.feed_forward_length", cfg.ffn),
        ("llama.attention.head_count", cfg.n_heads),
        ("llama.attention.head_count_kv", cfg.n_kv_heads),
        ("llama.context_length", cfg.context),
        ("llama.rope.dimension_count", cfg.hidden / cfg.n_heads),
        ("llama.vocab_size", cfg.vocab),
        ("general.alignment", 32),
    ] {
        assert_eq!(g.get_u32(key).unwrap() as usize, want, "{key}");
    }
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), cfg.rope_base);
    assert_eq!(g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(), cfg.eps);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(g.get_str("tokenizer.chat_template").unwrap(), SMOLLM2_CHAT_TEMPLATE);
    assert_eq!(g.get("tokenizer.ggml.add_bos_token"), Some(&MetaValue::Bool(false)));

    let (h, f, hd) = (cfg.hidden as u64, cfg.ffn as u64, (cfg.hidden / cfg.n_heads) as u64);
    let (q_dim, kv_dim) = (cfg.n_heads as u64 * hd, cfg.n_kv_heads as u64 * hd);
    assert_eq!(g.tensors.len(), 2 + 9 * cfg.n_layers);
    let embd = g.require_tensor("token_embd.weight", &[GgmlType::Q8_0]).unwrap();
    assert_eq!(embd.dims, vec![h, cfg.vocab as u64]);
    assert!(g.tensor("output.weight").is_none());
    assert_eq!(g.require_tensor("output_norm.weight", &[GgmlType::F32]).unwrap().dims, vec![h]);
    for l in 0..cfg.n_layers {
        for (t, dims, ty) in [
            ("attn_norm", vec![h], GgmlType::F32),
            ("ffn_norm", vec![h], GgmlType::F32),
            ("attn_q", vec![h, q_dim], GgmlType::Q4_1),
            ("attn_k", vec![h, kv_dim], GgmlType::Q4_1),
            ("attn_v", vec![h, kv_dim], GgmlType::Q4_1),
            ("attn_output", vec![q_dim, h], GgmlType::Q4_1),
            ("ffn_gate", vec![h, f], GgmlType::Q4_1),
            ("ffn_up", vec![h, f], GgmlType::Q4_1),
            ("ffn_down", vec![f, h], GgmlType::Q4_1),
        ] {
            let name = format!("blk.{l}.{t}.weight");
            let info = g.require_tensor(&name, &[ty]).unwrap();
            let data = g.tensor_data(info);
            assert_eq!(info.dims, dims, "{name}");
            assert_eq!(data.len() as u64, expected_size(&dims, ty), "{name}");
        }
    }
}

#[test]
fn tiny_llama_vocab_is_specials_then_bytes_then_merges() {
    let g_bytes = tiny_llama_gguf(&SynthConfig::tiny());
    let g = Gguf::parse(&g_bytes).unwrap();
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 259);
    assert_eq!(&tokens[..3], &SYNTH_SPECIALS);
    // Known GPT-2 alphabet entries: printable ASCII is itself, space is Ġ, newline Ċ.
    assert_eq!(tokens[3 + b'a' as usize], "a");
    assert_eq!(tokens[3 + b' ' as usize], "Ġ");
    assert_eq!(tokens[3 + b'\n' as usize], "Ċ");
    assert_eq!(tokens[3 + 0xAD], "Ń");
    let distinct: std::collections::HashSet<&&str> = tokens.iter().collect();
    assert_eq!(distinct.len(), tokens.len());
    let types = g.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.iter().map(|&t| t as usize).collect::<Vec<_>>(), (0..259).map(|i| if i < 3 { 3 } else { 1 }).collect::<Vec<_>>());
    assert!(g.get_str_array("tokenizer.ggml.merges").unwrap().is_empty());
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);

    let cfg = SynthConfig { vocab: 262, ..SynthConfig::tiny() };
    let bytes = tiny_llama_gguf(&cfg);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get_str_array("tokenizer.ggml.merges").unwrap(), vec!["Ġ t", "Ġ a", "i n"]);
    assert_eq!(&g.get_str_array("tokenizer.ggml.tokens").unwrap()[259..], &["Ġt", "Ġa", "in"]);
    assert_eq!(g.tensor("token_embd.weight").unwrap().dims, vec![64, 262]);
}

fn std_dev(v: &[f32]) -> f32 {
    let mean = v.iter().sum::<f32>() / v.len() as f32;
    (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / v.len() as f32).sqrt()
}

#[test]
fn tiny_llama_weights_give_spread_logits_and_depend_on_the_seed() {
    let cfg = SynthConfig::tiny();
    let bytes = tiny_llama_gguf(&cfg);
    assert_eq!(bytes, tiny_llama_gguf(&cfg), "same seed, same file");
    let other = tiny_llama_gguf(&SynthConfig { seed: cfg.seed + 1, ..cfg.clone() });
    assert_eq!(other.len(), bytes.len());
    assert_ne!(other, bytes);

    let g = Gguf::parse(&bytes).unwrap();
    let (h, vocab) = (cfg.hidden, cfg.vocab);
    let __info = g.require_tensor("token_embd.weight", &[GgmlType::Q8_0]).unwrap();
    let embd_q = g.tensor_data(__info);
    let mut embd = vec![0f32; h * vocab];
    dequantize_q8_0(embd_q, &mut embd);
    let sd = std_dev(&embd);
    assert!((0.2..0.3).contains(&sd), "embedding std {sd}, designed 2/sqrt(64) = 0.25");
    let __info = g.require_tensor("blk.1.attn_q.weight", &[GgmlType::Q4_1]).unwrap();
    let q = g.tensor_data(__info);
    let mut wq = vec![0f32; h * h];
    dequantize_q4_1(q, &mut wq);
    let sd = std_dev(&wq);
    assert!((0.1..0.15).contains(&sd), "attn_q std {sd}, designed 1/sqrt(64) = 0.125");
    let __info = g.require_tensor("blk.0.ffn_norm.weight", &[GgmlType::F32]).unwrap();
    let norm = g.tensor_data(__info);
    let norm: Vec<f32> = norm.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(norm.iter().all(|v| (0.5..1.5).contains(v)), "norm gains near 1: {norm:?}");

    // Tied output on a unit-RMS hidden state: logits spread by a few units, not flat.
    let mut rng = Rng::new(3);
    let hidden: Vec<f32> = (0..h).map(|_| rng.normal()).collect();
    let rms = (hidden.iter().map(|x| x * x).sum::<f32>() / h as f32).sqrt();
    let logits: Vec<f32> = embd.chunks_exact(h).map(|row| row.iter().zip(&hidden).map(|(a, b)| a * b / rms).sum()).collect();
    let sd = std_dev(&logits);
    assert!((1.0..4.0).contains(&sd), "logit std {sd}");
}

#[test]
fn synth_config_validation_rejects_unusable_shapes() {
    let tiny = SynthConfig::tiny();
    assert!(tiny.validate().is_ok());
    let bad = [
        SynthConfig { hidden: 48, ..tiny.clone() },
        SynthConfig { ffn: 100, ..tiny.clone() },
        SynthConfig { n_heads: 3, ..tiny.clone() },
        SynthConfig { n_kv_heads: 3, ..tiny.clone() },
        SynthConfig { vocab: 258, ..tiny.clone() },
        SynthConfig { vocab: SYNTH_BASE_VOCAB + SYNTH_MERGES.len() + 1, ..tiny.clone() },
        SynthConfig { n_layers: 0, ..tiny.clone() },
    ];
    for cfg in bad {
        let e = try_tiny_llama_gguf(&cfg).unwrap_err();
        assert!(e.to_string().contains("synthetic config"), "{cfg:?}: {e}");
    }
    let max = SynthConfig { vocab: SYNTH_BASE_VOCAB + SYNTH_MERGES.len(), n_layers: 1, ..tiny };
    assert!(try_tiny_llama_gguf(&max).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Broken files: precise, typed errors

#[test]
fn bad_magic_is_refused() {
    let (mut bytes, _) = sample_file();
    bytes[3] = b'X';
    assert!(matches!(parse_err(&bytes), GgufError::BadMagic { found } if found == b"GGUX"));
    assert!(matches!(parse_err(b""), GgufError::BadMagic { .. }));
    assert!(matches!(parse_err(b"GG"), GgufError::BadMagic { .. }));
}

#[test]
fn version_1_and_big_endian_files_are_refused() {
    let e = parse_err(&Raw::header(1, 0, 0).0);
    assert!(matches!(e, GgufError::UnsupportedVersion(1)));
    assert!(e.to_string().contains("version 1"), "{e}");
    assert!(matches!(parse_err(&Raw::header(4, 0, 0).0), GgufError::UnsupportedVersion(4)));
    assert!(matches!(parse_err(&Raw::header(3u32.swap_bytes(), 0, 0).0), GgufError::BigEndian(_)));
    // Version 2 has the same layout and is read.
    let v2 = Raw::header(2, 0, 1).str("a").u32(4).u32(9).0;
    assert_eq!(Gguf::parse(&v2).unwrap().get_u32("a").unwrap(), 9);
}

#[track_caller]
fn assert_truncated(bytes: &[u8], cut: usize, want_at: usize, want_context: &str) {
    match parse_err(&bytes[..cut]) {
        GgufError::Truncated { at, context, available, .. } => {
            assert_eq!((at, context.as_str()), (want_at as u64, want_context), "cut at {cut}");
            assert_eq!(available, (cut - want_at) as u64);
            let msg = parse_err(&bytes[..cut]).to_string();
            assert!(msg.starts_with(&format!("truncated at byte {want_at} while reading {want_context}")), "{msg}");
        }
        other => panic!("cut at {cut}: expected Truncated, got {other}"),
    }
}

#[test]
fn truncation_errors_name_the_place() {
    let (bytes, _) = sample_file();
    let g = Gguf::parse(&bytes).unwrap();
    assert_truncated(&bytes, 6, 4, "the version");
    assert_truncated(&bytes, 12, 8, "the tensor count");
    assert_truncated(&bytes, 23, 16, "the metadata count");
    // Entry 0's key: its length at 24, its text at 32.
    assert_truncated(&bytes, 27, 24, "metadata entry 0 key");
    assert_truncated(&bytes, 34, 32, "metadata entry 0 key");

    let index = |key: &str| g.metadata.iter().position(|(k, _)| k == key).unwrap();
    // "t.string": key text, then u32 type, u64 length, the text.
    let key_at = find(&bytes, b"t.string");
    let (len_at, text_at) = (key_at + 8 + 4, key_at + 8 + 4 + 8);
    let ctx = format!("metadata entry {} (t.string)", index("t.string"));
    assert_truncated(&bytes, key_at + 10, key_at + 8, &ctx);
    assert_truncated(&bytes, len_at + 5, len_at, &ctx);
    assert_truncated(&bytes, text_at + 3, text_at, &ctx);
    // Inside an array of u32: elements at 4-byte steps after type, element type and count.
    let arr_at = find(&bytes, b"a.u32") + 5 + 4 + 4 + 8;
    let ctx = format!("metadata entry {} (a.u32)", index("a.u32"));
    assert_truncated(&bytes, arr_at + 4 + 2, arr_at + 4, &ctx);

    // Tensor info 2 ("w.q4_0"): name length, name, n_dims, dims...
    let name_len_at = find(&bytes, b"w.q4_0") - 8;
    assert_truncated(&bytes, name_len_at + 9, name_len_at + 8, "tensor info 2 (name)");
    let n_dims_at = name_len_at + 8 + 6;
    assert_truncated(&bytes, n_dims_at + 4 + 3, n_dims_at + 4, "tensor info 2 (w.q4_0)");

    // Inside a tensor's data: that tensor is out of bounds.
    let t = g.tensor("w.q8_0").unwrap();
    let cut = (g.data_offset + t.offset + 10) as usize;
    match parse_err(&bytes[..cut]) {
        GgufError::TensorOutOfBounds { name, file_len, .. } => assert_eq!((name.as_str(), file_len), ("w.q8_0", cut as u64)),
        other => panic!("expected TensorOutOfBounds, got {other}"),
    }
    // Every cut before the end of the last tensor fails; no cut panics.
    let last = g.tensors.iter().map(|t| g.data_offset + t.offset + t.size_bytes).max().unwrap();
    for cut in 0..last as usize {
        assert!(Gguf::parse(&bytes[..cut]).is_err(), "cut at {cut} parsed");
    }
}

#[test]
fn huge_string_lengths_are_refused_before_allocating() {
    let e = parse_err(&Raw::header(3, 0, 1).u64(1 << 40).0);
    match &e {
        GgufError::TooLarge { what, at, value, limit } => {
            assert_eq!((*at, *value, *limit), (24, 1 << 40, MAX_STRING_LEN));
            assert!(what.contains("metadata entry 0 key"), "{what}");
        }
        other => panic!("{other}"),
    }
    let e = parse_err(&Raw::header(3, 0, 1).str("k").u32(8).u64(MAX_STRING_LEN + 1).0);
    assert!(matches!(e, GgufError::TooLarge { at: 37, .. }), "{e}");
    assert!(e.to_string().contains("metadata entry 0 (k)"), "{e}");
    // Within the cap but past the end of the file.
    let e = parse_err(&Raw::header(3, 0, 1).str("k").u32(8).u64(1000).bytes(b"abc").0);
    assert!(matches!(e, GgufError::Truncated { at: 45, needed: 1000, available: 3, .. }), "{e}");
    let e = parse_err(&Raw::header(3, 1, 0).u64(u64::MAX).0);
    assert!(e.to_string().contains("tensor info 0 (name)"), "{e}");
}

#[test]
fn huge_array_counts_are_refused_before_allocating() {
    let arr = |elem_type: u32, count: u64| Raw::header(3, 0, 1).str("big").u32(9).u32(elem_type).u64(count);
    for count in [u64::MAX, 1 << 62, MAX_ARRAY_LEN + 1] {
        let e = parse_err(&arr(0, count).0);
        match &e {
            GgufError::TooLarge { what, at, value, .. } => {
                assert_eq!((*at, *value), (24 + 11 + 4 + 4, count));
                assert!(what.contains("array length in metadata entry 0 (big)"), "{what}");
            }
            other => panic!("{other}"),
        }
    }
    // Allowed by the cap, but the file ends: truncated at the first missing element.
    let e = parse_err(&arr(4, 1_000_000).bytes(&[0; 10]).0);
    assert!(matches!(e, GgufError::Truncated { at: 59, .. }), "{e}");
    let e = parse_err(&arr(8, MAX_ARRAY_LEN).0);
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    let e = parse_err(&arr(77, 1).0);
    assert!(matches!(e, GgufError::UnknownValueType { type_id: 77, at: 39, .. }), "{e}");
}

#[test]
fn array_nesting_deeper_than_8_is_refused() {
    let file = |depth: usize| {
        let mut w = GgufWriter::new();
        w.add_meta("deep", nested(depth)).unwrap();
        w.to_bytes()
    };
    let ok = file(8);
    assert_eq!(Gguf::parse(&ok).unwrap().get("deep"), Some(&nested(8)));
    let e = parse_err(&file(9));
    assert!(matches!(e, GgufError::NestingTooDeep { limit: 8, .. }), "{e}");
    assert!(e.to_string().contains("metadata entry 0 (deep)"), "{e}");
    // A deeply nested bomb of empty arrays stops at the same depth.
    let mut raw = Raw::header(3, 0, 1).str("bomb").u32(9);
    for _ in 0..10_000 {
        raw = raw.u32(9).u64(1);
    }
    assert!(matches!(parse_err(&raw.0), GgufError::NestingTooDeep { .. }));
}

fn one_tensor_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("llama".into())).unwrap();
    w.add_tensor("a.weight", &[32, 2], GgmlType::Q8_0, vec![1; 68]).unwrap();
    w.add_tensor("b.weight", &[32], GgmlType::F32, vec![2; 128]).unwrap();
    w.to_bytes()
}

#[test]
fn tensor_offsets_past_the_end_are_refused() {
    let base = one_tensor_file();
    let field = offset_field(&base, "b.weight", 1);
    let g = Gguf::parse(&base).unwrap();
    let data_len = base.len() as u64 - g.data_offset;
    for offset in [data_len, data_len.next_multiple_of(32) + 32, !31u64, 1 << 63] {
        let mut bytes = base.clone();
        bytes[field..field + 8].copy_from_slice(&offset.to_le_bytes());
        match parse_err(&bytes) {
            GgufError::TensorOutOfBounds { name, offset: o, size, .. } => assert_eq!((name.as_str(), o, size), ("b.weight", offset, 128)),
            other => panic!("offset {offset}: {other}"),
        }
    }
    // Dimensions that claim more data than the file has, or overflow.
    let dims_at = field - 4 - 8;
    let mut bytes = base.clone();
    bytes[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(parse_err(&bytes), GgufError::TensorOutOfBounds { .. }));
    let raw = Raw::header(3, 1, 0).tensor("big", &[1 << 40, 1 << 40], 0, 0).pad_to(32);
    let e = parse_err(&raw.0);
    assert!(matches!(&e, GgufError::BadShape { name, .. } if name == "big"), "{e}");
    let raw = Raw::header(3, 1, 0).tensor("odd", &[33], 8, 0).pad_to(32);
    let e = parse_err(&raw.0);
    assert!(e.to_string().contains("ne0 = 33 is not a multiple of 32"), "{e}");
    let raw = Raw::header(3, 1, 0).tensor("many", &[1; 9], 0, 0);
    assert!(matches!(parse_err(&raw.0), GgufError::TooLarge { value: 9, .. }));
}

#[test]
fn misaligned_tensor_offsets_are_refused() {
    let mut bytes = one_tensor_file();
    let field = offset_field(&bytes, "b.weight", 1);
    let offset = u64::from_le_bytes(bytes[field..field + 8].try_into().unwrap());
    bytes[field..field + 8].copy_from_slice(&(offset - 4).to_le_bytes());
    match parse_err(&bytes) {
        GgufError::MisalignedTensor { name, offset: o, alignment } => {
            assert_eq!((name.as_str(), o, alignment), ("b.weight", offset - 4, 32))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn unsupported_tensor_types_are_refused_by_require_tensor() {
    let mut w = GgufWriter::new();
    w.add_tensor("blk.3.attn_q.weight", &[256, 2], GgmlType::Other(23), vec![0; 272]).unwrap();
    w.add_tensor("blk.3.attn_norm.weight", &[64], GgmlType::F32, vec![0; 256]).unwrap();
    w.add_tensor("odd", &[4], GgmlType::Other(1234), vec![0; 4]).unwrap();
    let bytes = w.to_bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensor("blk.3.attn_q.weight").unwrap().ggml_type, GgmlType::Other(23));
    let e = g.require_tensor("blk.3.attn_q.weight", &[GgmlType::Q4_1, GgmlType::Q8_0]).unwrap_err();
    assert!(matches!(&e, GgufError::UnsupportedTensorType { name, type_name } if name == "blk.3.attn_q.weight" && type_name == "IQ4_XS"));
    assert_eq!(e.to_string(), "tensor blk.3.attn_q.weight has type IQ4_XS, which pagedlm does not support");
    // A known type that the caller does not accept here.
    let e = g.require_tensor("blk.3.attn_norm.weight", &[GgmlType::Q4_1]).unwrap_err();
    assert_eq!(e.to_string(), "tensor blk.3.attn_norm.weight has type F32, which pagedlm does not support");
    let e = g.require_tensor("odd", &[GgmlType::Other(1234)]).unwrap_err();
    assert!(e.to_string().contains("type 1234"), "{e}");
    assert!(matches!(g.require_tensor("nope", &[GgmlType::F32]), Err(GgufError::MissingTensor(n)) if n == "nope"));
    assert_eq!(GgmlType::from_u32(12), GgmlType::Q4_K);
    assert_eq!(GgmlType::from_u32(30), GgmlType::BF16);
    assert_eq!(GgmlType::from_u32(23).name(), "IQ4_XS");
    for t in GgmlType::SUPPORTED {
        assert_eq!(GgmlType::from_u32(t.to_u32()), t);
        assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
    }
    assert_eq!(GgmlType::from_u32(3), GgmlType::Q4_1);
}

#[test]
fn malformed_metadata_is_refused_with_its_position() {
    let kv = |key: &str, ty: u32| Raw::header(3, 0, 1).str(key).u32(ty);
    let e = parse_err(&kv("k", 13).0);
    assert!(matches!(e, GgufError::UnknownValueType { type_id: 13, at: 33, .. }), "{e}");
    let e = parse_err(&kv("k", 7).u8(2).0);
    assert!(matches!(e, GgufError::InvalidBool { value: 2, at: 37, .. }), "{e}");
    let e = parse_err(&kv("k", 8).u64(4).bytes(b"ab\xffc").0);
    assert!(matches!(&e, GgufError::InvalidUtf8 { at: 47, context } if context.contains("(k)")), "{e}");
    let e = parse_err(&Raw::header(3, 0, 1).u64(2).bytes(b"\xc3\x28").0);
    assert!(matches!(&e, GgufError::InvalidUtf8 { at: 32, context } if context == "metadata entry 0 key"), "{e}");
    let dup = Raw::header(3, 0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2);
    assert!(matches!(parse_err(&dup.0), GgufError::DuplicateKey(k) if k == "k"));
    let dup = Raw::header(3, 2, 0).tensor("t", &[1], 0, 0).tensor("t", &[1], 0, 32).pad_to(32).bytes(&[0; 64]);
    assert!(matches!(parse_err(&dup.0), GgufError::DuplicateTensor(t) if t == "t"));
    for bad in [MetaValue::U32(3), MetaValue::U32(0), MetaValue::I32(-32), MetaValue::String("32".into())] {
        let mut w = GgufWriter::new();
        w.add_meta("general.alignment", bad.clone()).unwrap();
        assert!(matches!(parse_err(&w.to_bytes()), GgufError::BadAlignment { .. }), "{bad:?}");
    }
    let e = parse_err(&Raw::header(3, 1 << 40, 0).0);
    assert!(matches!(e, GgufError::TooLarge { at: 8, .. }), "{e}");
    let e = parse_err(&Raw::header(3, 0, u64::MAX).0);
    assert!(matches!(e, GgufError::TooLarge { at: 16, .. }), "{e}");
}

#[test]
fn typed_getters_report_missing_keys_and_wrong_types() {
    let (bytes, _) = sample_file();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get_u64("t.u8").unwrap(), 255);
    assert_eq!(g.get_u32("t.u32").unwrap(), u32::MAX);
    assert_eq!(g.get_f32("t.u16").unwrap(), 65535.0);
    assert_eq!(g.get_str("general.name").unwrap(), "every type");
    assert_eq!(g.get_i32_array("a.u8").unwrap(), vec![0, 1, 255]);
    assert_eq!(g.get_i32_array("a.i64").map_err(|e| e.to_string()).unwrap_err(), "metadata key a.i64 is 9223372036854775807, which does not fit in i32");
    assert_eq!(g.get_str_array("a.string").unwrap(), vec!["Ġ t", "", "<|im_end|>"]);
    assert!(g.get_str_array("a.empty").unwrap().is_empty());

    assert!(matches!(g.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert_eq!(g.get_u32("nope").unwrap_err().to_string(), "metadata key nope is missing");
    assert!(matches!(g.get_u64("t.i64"), Err(GgufError::WrongType { .. })), "negative is not a u64");
    assert!(matches!(g.get_u32("t.u64"), Err(GgufError::OutOfRange { .. })));
    assert_eq!(g.get_u32("t.string").unwrap_err().to_string(), "metadata key t.string has type string, expected a non-negative integer");
    assert!(matches!(g.get_str("t.u8"), Err(GgufError::WrongType { key, found, .. }) if key == "t.u8" && found == "u8"));
    assert!(matches!(g.get_f32("t.bool_true"), Err(GgufError::WrongType { .. })));
    assert_eq!(g.get_str_array("a.u32").unwrap_err().to_string(), "metadata key a.u32 has type an array of u32, expected an array of strings");
    assert!(matches!(g.get_i32_array("a.f32"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.get_i32_array("t.u8"), Err(GgufError::WrongType { .. })));
}

// ---------------------------------------------------------------------------------------------
// Fuzz: mutated and truncated files never panic, and whatever parses is in bounds

/// Parses `bytes` and, when that succeeds, uses every accessor and checks every view is
/// inside the buffer. Returns the error variant's name, or "Ok". Panics on a broken invariant.
fn exercise(bytes: &[u8]) -> String {
    let g = match Gguf::parse(bytes) {
        Err(e) => {
            let _ = e.to_string();
            let debug = format!("{e:?}");
            return debug.split([' ', '(', '{']).next().unwrap_or_default().to_string();
        }
        Ok(g) => g,
    };
    let _ = format!("{g:?}");
    assert!(g.alignment.is_power_of_two());
    assert_eq!(g.data_offset % g.alignment, 0);
    for (key, value) in &g.metadata {
        let _ = (g.get_u64(key), g.get_u32(key), g.get_f32(key), g.get_str(key), g.get_str_array(key), g.get_i32_array(key));
        let _ = (value.as_u64(), value.as_f64(), value.as_str(), value.as_array(), value.type_name());
        assert!(g.get(key).is_some_and(|v| std::ptr::eq(v, value)));
    }
    let all = GgmlType::SUPPORTED;
    let file = bytes.as_ptr_range();
    for t in &g.tensors {
        let data = g.tensor_data(t);
        let view = data.as_ptr_range();
        assert!(data.is_empty() || (file.start <= view.start && view.end <= file.end), "{} escapes the buffer", t.name);
        let _ = t.ggml_type.name();
        match t.ggml_type.block_size() {
            Some(_) => {
                assert_eq!(data.len() as u64, t.size_bytes, "{}", t.name);
                assert_eq!(t.offset % g.alignment, 0);
                assert!(g.data_offset + t.offset + t.size_bytes <= bytes.len() as u64);
                if t.ggml_type.is_supported() {
                    let info = g.require_tensor(&t.name, &all).expect("a supported type is accepted");
                    let required = g.tensor_data(info);
                    assert!(std::ptr::eq(info, t) && std::ptr::eq(required, data));
                } else {
                    assert!(g.require_tensor(&t.name, &all).is_err());
                }
            }
            None => assert!(g.require_tensor(&t.name, &all).is_err()),
        }
    }
    "Ok".into()
}

const INTERESTING: [u64; 28] = [
    0,
    1,
    2,
    3,
    7,
    8,
    9,
    12,
    13,
    31,
    32,
    33,
    255,
    256,
    0xFFFF,
    1 << 20,
    (1 << 20) + 1,
    1 << 24,
    (1 << 24) + 1,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    1 << 32,
    1 << 40,
    1 << 62,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 31,
    u64::MAX,
];

fn interesting(rng: &mut Rng, len: usize, header_end: usize) -> u64 {
    match rng.below(8) {
        0 => rng.next_u64(),
        1 => [len as u64, len as u64 + 1, len as u64 - 1, header_end as u64][rng.below(4) as usize],
        _ => INTERESTING[rng.below(INTERESTING.len() as u64) as usize],
    }
}

/// Applies 1 to 3 random mutations, mostly in the header/metadata/tensor-info region.
fn mutate(base: &[u8], header_end: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.len() < 16 {
            break;
        }
        let len = b.len();
        let region = if rng.below(10) < 8 { header_end.min(len) } else { len };
        let pos = rng.below(region as u64) as usize;
        match rng.below(8) {
            0 => b[pos] ^= 1 << rng.below(8),
            1 => b[pos] = rng.next_u32() as u8,
            2 | 3 => {
                let v = interesting(rng, len, header_end).to_le_bytes();
                let n = (len - pos).min(8);
                b[pos..pos + n].copy_from_slice(&v[..n]);
            }
            4 => {
                let v = (interesting(rng, len, header_end) as u32).to_le_bytes();
                let n = (len - pos).min(4);
                b[pos..pos + n].copy_from_slice(&v[..n]);
            }
            5 => b.truncate(pos),
            6 => {
                let src = rng.below(len as u64) as usize;
                let n = (rng.below(64) as usize).min(len - src).min(len - pos);
                b.copy_within(src..src + n, pos);
            }
            _ => {
                let n = 1 + rng.below(16) as usize;
                if rng.below(2) == 0 {
                    b.drain(pos..(pos + n).min(len));
                } else {
                    let chunk: Vec<u8> = (0..n).map(|_| rng.next_u32() as u8).collect();
                    b.splice(pos..pos, chunk);
                }
            }
        }
    }
    b
}

#[test]
fn fuzz_mutated_files_never_panic_and_stay_in_bounds() {
    // Silence the default panic report on this test's threads only; panics are counted below.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !std::thread::current().name().unwrap_or("").contains("fuzz") {
            default_hook(info);
        }
    }));

    let start = Instant::now();
    let (small, _) = sample_file();
    let tiny = tiny_llama_gguf(&SynthConfig::tiny());
    let header_end = |bytes: &[u8]| Gguf::parse(bytes).unwrap().data_offset as usize;
    let (small_header, tiny_header) = (header_end(&small), header_end(&tiny));
    assert!(small.len() < 8192, "the fuzz base is {} bytes", small.len());

    let mut cases: u64 = 0;
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut panics: Vec<String> = Vec::new();
    let mut run = |bytes: &[u8], what: &dyn Fn() -> String| {
        cases += 1;
        match std::panic::catch_unwind(|| exercise(bytes)) {
            Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
            Err(payload) => {
                let msg = payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                if panics.len() < 10 {
                    panics.push(format!("{}: {msg}", what()));
                }
                *outcomes.entry("PANIC".into()).or_default() += 1;
            }
        }
    };

    // Systematic: every truncation, and every header position overwritten with extremes.
    for cut in 0..=small.len() {
        run(&small[..cut], &|| format!("small cut at {cut}"));
    }
    for pos in 0..small_header {
        for v in [0u64, u64::MAX, 1 << 40, 33] {
            let mut b = small.clone();
            let n = (b.len() - pos).min(8);
            b[pos..pos + n].copy_from_slice(&v.to_le_bytes()[..n]);
            run(&b, &|| format!("small u64 {v} at {pos}"));
        }
    }
    // Random: the small every-type file, then the tiny llama.
    let mut rng = Rng::new(0xF022);
    for i in 0..100_000u64 {
        let b = mutate(&small, small_header, &mut rng);
        run(&b, &|| format!("small mutation {i}"));
    }
    for i in 0..10_000u64 {
        let b = mutate(&tiny, tiny_header, &mut rng);
        run(&b, &|| format!("tiny llama mutation {i}"));
    }
    let elapsed = start.elapsed();
    println!("fuzz: {cases} cases in {:.1} s: {outcomes:?}", elapsed.as_secs_f64());

    assert!(panics.is_empty(), "{} panics, first: {panics:#?}", outcomes.get("PANIC").copied().unwrap_or(0));
    assert!(cases >= 100_000);
    // The mutations must reach deep: many files still parse, and most error kinds occur.
    let ok = outcomes.get("Ok").copied().unwrap_or(0);
    assert!(ok > cases / 50, "only {ok} of {cases} mutated files parsed");
    let kinds = outcomes.keys().filter(|k| *k != "Ok").count();
    assert!(kinds >= 12, "only {kinds} error kinds reached: {outcomes:?}");
}
