//! The test files for loading by streaming, checked small: the big synthetic llama
//! (`synth::write_big_llama`, written chunk by chunk) parses, is what its config says, loads on
//! the CPU backend, gives finite logits and answers a chat turn; `synth::split_gguf` gives parts
//! laid out as llama.cpp's `gguf-split` writes them, each a GGUF, holding every tensor once.
//! tests/e2e/bigmodel.test.mjs loads the gigabyte ones in the browser.

#![cfg(not(target_arch = "wasm32"))]

use pagedlm::engine::{BackendChoice, Engine, EngineOptions, GenerateRequest, Message, ScoreMode};
use pagedlm::gguf::{GgmlType, Gguf, MetaValue};
use pagedlm::synth::{big_llama_config, split_gguf, split_part_name, tiny_llama_gguf, try_split_gguf, write_big_llama, SynthConfig};

const TARGET: u64 = 8_000_000;

fn big_model(seed: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    let written = write_big_llama(TARGET, seed, &mut bytes).unwrap();
    assert_eq!(written, bytes.len() as u64);
    bytes
}

fn meta_u32(gguf: &Gguf<'_>, key: &str) -> u64 {
    gguf.metadata.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.as_u64()).unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn the_big_model_is_the_size_and_shape_its_config_gives() {
    let bytes = big_model(5);
    let within = (bytes.len() as f64 / TARGET as f64 - 1.0).abs();
    assert!(within < 0.02, "{} bytes for a target of {TARGET}", bytes.len());
    let cfg = big_llama_config(TARGET, 5).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    assert_eq!(meta_u32(&gguf, "llama.vocab_size"), cfg.vocab as u64);
    assert_eq!(meta_u32(&gguf, "llama.embedding_length"), cfg.hidden as u64);
    let tokens = gguf.metadata.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).unwrap();
    assert_eq!(tokens.len(), cfg.vocab);
    assert_eq!(tokens.last(), Some(&MetaValue::String(format!("<extra_{}>", cfg.vocab - 1))));
    // The embedding is the bulk: F32, first; the untied output Q4_0, last.
    let (first, last) = (&gguf.tensors[0], gguf.tensors.last().unwrap());
    assert_eq!((first.ggml_type, first.dims.as_slice()), (GgmlType::F32, &[cfg.hidden as u64, cfg.vocab as u64][..]));
    assert_eq!((last.ggml_type, last.dims.as_slice()), (GgmlType::Q4_0, &[cfg.hidden as u64, cfg.vocab as u64][..]));
    assert!(first.size_bytes * 10 > bytes.len() as u64 * 8, "the embedding is {} of {} bytes", first.size_bytes, bytes.len());
    let embedding: Vec<f32> = gguf.tensor_data(first).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(embedding.iter().all(|v| v.abs() <= 0.05), "embedding values within ±0.05");
    assert_eq!(bytes, big_model(5), "the same seed writes the same file");
    assert_ne!(bytes, big_model(6));
}

#[test]
fn the_big_model_loads_on_the_cpu_backend_and_answers_a_chat_turn() {
    let bytes = big_model(9);
    let vocab = big_llama_config(TARGET, 9).unwrap().vocab;
    let options = EngineOptions { backend: BackendChoice::Cpu, ..EngineOptions::default() };
    let mut engine = pollster::block_on(Engine::load(&bytes, options)).unwrap();
    let user = Message { role: "user".into(), content: Some("Hello!".into()), ..Default::default() };
    let mut request = GenerateRequest { max_tokens: 3, ..GenerateRequest::default() };
    let prompt = engine.prepare_chat(&[user], &mut request).unwrap();
    // The filler tokens are never produced by tokenization: the prompt is bytes, merges, specials.
    assert!(prompt.iter().all(|&id| id < 278), "{prompt:?}");
    let logits = pollster::block_on(engine.score_logits(&prompt, prompt.len(), ScoreMode::Prefill)).unwrap();
    let last = &logits[0];
    assert_eq!(last.len(), vocab);
    let mean = last.iter().sum::<f32>() / vocab as f32;
    let std = (last.iter().map(|l| (l - mean).powi(2)).sum::<f32>() / vocab as f32).sqrt();
    assert!(last.iter().all(|l| l.is_finite()) && (0.5..8.0).contains(&std), "logit std {std}");
    let reply = pollster::block_on(engine.generate(&prompt, &request, &mut |_| true)).unwrap();
    assert!(!reply.tokens.is_empty() && reply.tokens.len() <= 3, "{reply:?}");
}

#[test]
fn split_parts_are_ggufs_holding_every_tensor_once() {
    let whole = tiny_llama_gguf(&SynthConfig::tiny());
    let model = Gguf::parse(&whole).unwrap();
    for parts in [1, 2, 3, model.tensors.len()] {
        let files = split_gguf(&whole, parts);
        assert_eq!(files.len(), parts);
        let mut seen = Vec::new();
        for (i, file) in files.iter().enumerate() {
            let part = Gguf::parse(file).unwrap_or_else(|e| panic!("part {i} of {parts}: {e}"));
            let value = |key: &str| part.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
            assert_eq!(value("split.no"), Some(MetaValue::U16(i as u16)));
            assert_eq!(value("split.count"), Some(MetaValue::U16(parts as u16)));
            assert_eq!(value("split.tensors.count"), Some(MetaValue::I32(model.tensors.len() as i32)));
            // The first part carries the model's metadata, then the split keys; the others only those.
            let keys: Vec<&str> = part.metadata.iter().map(|(k, _)| k.as_str()).collect();
            let model_keys: Vec<&str> = model.metadata.iter().map(|(k, _)| k.as_str()).collect();
            let expected = if i == 0 { model_keys.len() + 3 } else { 3 };
            assert_eq!(keys.len(), expected, "part {i}: {keys:?}");
            if i == 0 {
                assert_eq!(&keys[..model_keys.len()], &model_keys[..]);
            }
            assert!(!part.tensors.is_empty(), "part {i} of {parts} is empty");
            for t in &part.tensors {
                seen.push((t.name.clone(), part.tensor_data(t).to_vec()));
            }
        }
        let expected: Vec<(String, Vec<u8>)> = model.tensors.iter().map(|t| (t.name.clone(), model.tensor_data(t).to_vec())).collect();
        assert_eq!(seen, expected, "{parts} parts: every tensor once, in file order, with its bytes");
    }
    assert!(try_split_gguf(&whole, 0).is_err());
    assert!(try_split_gguf(&whole, model.tensors.len() + 1).is_err());
    assert!(try_split_gguf(&split_gguf(&whole, 2)[0], 2).is_err(), "a part is not split again");
    assert_eq!(split_part_name("dir/model", 0, 3), "dir/model-00001-of-00003.gguf");
    assert_eq!(split_part_name("m", 11, 12), "m-00012-of-00012.gguf");
}

#[test]
fn a_split_big_model_has_its_embedding_in_a_part_of_its_own() {
    let whole = big_model(3);
    let files = split_gguf(&whole, 2);
    // The embedding is most of the file: it makes the first part alone.
    let first = Gguf::parse(&files[0]).unwrap();
    assert_eq!(first.tensors.len(), 1);
    let total: usize = files.iter().map(Vec::len).sum();
    assert!(total < whole.len() + 64 * 1024, "the parts hold no more than the whole and a header each");
}
