//! A synthetic llama of gigabytes, written to any [`Write`] as it is generated (header first,
//! then each tensor's data in chunks from a seeded SplitMix64 stream), so a 3.5 GB file never
//! sits in memory: the test file for loading by streaming.
//!
//! Almost all of its bytes are where a forward pass reads little: an untied F32 `token_embd`
//! (one row read per token) over a large vocabulary. The Q4_0 output projection, read whole for
//! every logit row, is about an eighth of it; the two layers are a few percent. At 2.4 GB the
//! shape is Llama 3 8B's head (hidden 4096, 125k tokens); an embedding never passes 2.1 GB (one
//! wasm32 allocation holds at most 2 GiB), so at 3.5 GB it has 128k tokens and FFNs ~80k wide. The vocabulary
//! is the synthetic one ([`super::synth_vocab`] with every merge) followed by unused filler tokens
//! `<extra_N>`, which tokenization never produces but sampling may (their text is their name).
//!
//! Values are small and finite: embedding entries uniform in ±0.05, norms 1 ± 0.05, each Q4_0
//! matrix one f16 scale `gain / (4.6 √fan_in)` over random nibbles (uniform nibbles have a std
//! of 4.6), so projections keep activations O(1) and logits spread over a few units.

use std::io::Write;

use super::{synth_dims, synth_metadata, synth_tokenizer, SynthConfig, SynthFamily, SynthTypes, SYNTH_BASE_VOCAB, SYNTH_MERGES};
use crate::gguf::{GgmlType, GgufError, MetaValue, DEFAULT_ALIGNMENT};
use crate::model::arch::Shape;
use crate::model::{Architecture, Role};
use crate::rng::Rng;
use crate::tokenizer::token_type;

/// Bytes generated and written at a time.
const CHUNK_BYTES: usize = 8 << 20;
/// Q4_0: 32 weights in an f16 scale and 16 bytes of nibbles.
const Q4_0_BLOCK: (usize, usize) = (32, 18);
/// Header bytes a filler token costs (length, `<extra_NNNNNN>`, its type).
const HEADER_BYTES_PER_TOKEN: u64 = 28;
/// The largest embedding: one allocation of the CPU backend in wasm32 holds at most 2 GiB, as
/// real files' tensors do (a 3.5 GB file's bytes past it go to wider FFNs).
const MAX_EMBEDDING_BYTES: u64 = 2_100_000_000;
/// Head size: SmolLM2's.
const HEAD_DIM: usize = 64;

/// The shape [`write_big_llama`] writes for a file of about `target_bytes`: hidden the largest
/// power of two in 64..=4096 whose square is at most 1/64 of the target (so the layers stay a
/// few percent), 64-wide heads (4 per KV head), FFN hidden / 4, 2 layers, F32 embedding, Q4_0
/// projections and output, and the vocabulary (a multiple of 32) that fills the rest.
pub fn big_llama_config(target_bytes: u64, seed: u64) -> Result<SynthConfig, GgufError> {
    let hidden = (6..=12).map(|p| 1usize << p).filter(|&h| (h * h * 64) as u64 <= target_bytes).max().unwrap_or(64);
    let n_heads = hidden / HEAD_DIM;
    let base = SynthConfig {
        n_layers: 2,
        hidden,
        ffn: (hidden / 4).max(32),
        n_heads,
        n_kv_heads: (n_heads / 4).max(1),
        vocab: SYNTH_BASE_VOCAB + SYNTH_MERGES.len(),
        seed,
        types: SynthTypes { embedding: GgmlType::F32, linear: GgmlType::Q4_0 },
        family: Some(SynthFamily { untied: true, ..SynthFamily::new(Architecture::Llama, HEAD_DIM) }),
        name: Some(format!("pagedlm synthetic llama of {target_bytes} bytes")),
        ..SynthConfig::tiny()
    };
    // The bytes every token adds: an F32 embedding row, a Q4_0 output row, its header entry.
    let per_token = hidden as u64 * 4 + (hidden / Q4_0_BLOCK.0 * Q4_0_BLOCK.1) as u64 + HEADER_BYTES_PER_TOKEN;
    let fixed = file_bytes(&base)? - base.vocab as u64 * per_token;
    let vocab = (target_bytes.saturating_sub(fixed) / per_token) as usize / 32 * 32;
    if vocab < base.vocab {
        return Err(GgufError::InvalidWrite(format!(
            "a synthetic model of {target_bytes} bytes is too small: at least {} bytes",
            fixed + base.vocab as u64 * per_token
        )));
    }
    if vocab as u64 * hidden as u64 * 4 <= MAX_EMBEDDING_BYTES {
        return Ok(SynthConfig { vocab, tokenizer: Some(filler_vocab(vocab)), ..base });
    }
    // The embedding at its cap; the FFNs grow to fill the rest (3 Q4_0 matrices of hidden × ffn
    // per layer).
    let vocab = (MAX_EMBEDDING_BYTES / (hidden as u64 * 4)) as usize / 32 * 32;
    let capped = SynthConfig { vocab, ..base };
    let per_ffn_unit = capped.n_layers as u64 * 3 * (hidden / Q4_0_BLOCK.0 * Q4_0_BLOCK.1) as u64;
    let grow = target_bytes.saturating_sub(file_bytes(&capped)?) / per_ffn_unit / 32 * 32;
    Ok(SynthConfig { ffn: capped.ffn + grow as usize, tokenizer: Some(filler_vocab(vocab)), ..capped })
}

/// The synthetic vocabulary with every merge, then unused `<extra_N>` tokens up to `vocab`.
fn filler_vocab(vocab: usize) -> Vec<(String, MetaValue)> {
    let base = SYNTH_BASE_VOCAB + SYNTH_MERGES.len();
    let mut meta = synth_tokenizer(base);
    for (key, value) in &mut meta {
        match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", MetaValue::Array(tokens)) => tokens.extend((base..vocab).map(|i| MetaValue::String(format!("<extra_{i}>")))),
            ("tokenizer.ggml.token_type", MetaValue::Array(types)) => types.extend((base..vocab).map(|_| MetaValue::I32(token_type::UNUSED))),
            _ => {}
        }
    }
    meta
}

/// The size of `cfg`'s file (its tokenizer as [`big_llama_config`] makes it).
fn file_bytes(cfg: &SynthConfig) -> Result<u64, GgufError> {
    let cfg = SynthConfig { tokenizer: Some(filler_vocab(cfg.vocab)), ..cfg.clone() };
    let (header, tensors) = layout(&cfg)?;
    Ok(header.len() as u64 + tensors.iter().map(|t| t.bytes.next_multiple_of(DEFAULT_ALIGNMENT)).sum::<u64>())
}

/// One tensor's data to generate.
struct Pending {
    role: Role,
    ggml_type: GgmlType,
    /// Columns (fan-in) of a matrix; 0 for a vector.
    cols: u32,
    bytes: u64,
}

/// The header of `cfg`'s file and its tensors in file order: the llama table's (the untied
/// output included), F32 embedding and norms, every other matrix Q4_0.
fn layout(cfg: &SynthConfig) -> Result<(Vec<u8>, Vec<Pending>), GgufError> {
    let (mut writer, description) = synth_metadata(cfg)?;
    let mut tensors = Vec::new();
    for t in description.tensors(&synth_dims(cfg)).tensors.into_iter().filter(|t| !t.optional || t.role == Role::Output) {
        let (ggml_type, cols, bytes) = match t.shape {
            Shape::Vector(len) => (GgmlType::F32, 0, len as u64 * 4),
            Shape::Matrix { cols, rows } if t.role == Role::TokenEmbd => (GgmlType::F32, cols, cols as u64 * rows as u64 * 4),
            Shape::Matrix { cols, rows } => (GgmlType::Q4_0, cols, (cols as usize / Q4_0_BLOCK.0 * Q4_0_BLOCK.1) as u64 * rows as u64),
        };
        writer.add_tensor_info(t.name, &t.shape.dims(), ggml_type)?;
        tensors.push(Pending { role: t.role, ggml_type, cols, bytes });
    }
    if writer.alignment() != DEFAULT_ALIGNMENT {
        return Err(GgufError::InvalidWrite(format!("synthetic files are aligned to {DEFAULT_ALIGNMENT}")));
    }
    Ok((writer.header(), tensors))
}

/// Writes a synthetic llama of about `target_bytes` ([`big_llama_config`]) from `seed` to `out`,
/// chunk by chunk; returns the bytes written. The same seed and size give the same file.
pub fn write_big_llama(target_bytes: u64, seed: u64, out: &mut impl Write) -> Result<u64, GgufError> {
    let cfg = big_llama_config(target_bytes, seed)?;
    let (header, tensors) = layout(&cfg)?;
    let io = |e: std::io::Error| GgufError::InvalidWrite(format!("writing the synthetic model: {e}"));
    out.write_all(&header).map_err(io)?;
    let mut written = header.len() as u64;
    let mut rng = Rng::new(seed);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    for t in &tensors {
        // Whole values or blocks per chunk, so a chunk boundary never splits one.
        let unit = if t.ggml_type == GgmlType::Q4_0 { Q4_0_BLOCK.1 } else { 4 };
        let per_chunk = (CHUNK_BYTES / unit * unit) as u64;
        let mut left = t.bytes;
        while left > 0 {
            let n = left.min(per_chunk) as usize;
            fill(t, &mut rng, &mut chunk[..n]);
            out.write_all(&chunk[..n]).map_err(io)?;
            left -= n as u64;
        }
        let pad = t.bytes.next_multiple_of(DEFAULT_ALIGNMENT) - t.bytes;
        out.write_all(&[0u8; DEFAULT_ALIGNMENT as usize][..pad as usize]).map_err(io)?;
        written += t.bytes + pad;
    }
    out.flush().map_err(io)?;
    Ok(written)
}

/// Fills `buf` (whole values or blocks) with the next random data of tensor `t`.
fn fill(t: &Pending, rng: &mut Rng, buf: &mut [u8]) {
    match t.ggml_type {
        GgmlType::Q4_0 => {
            // logits = h·W with h of RMS 1: gain 2 spreads them over a few units; the projections
            // into the residual stream are damped.
            let gain = match t.role {
                Role::Output => 2.0,
                Role::FfnDown | Role::AttnOutput => 0.5,
                _ => 1.0,
            };
            let scale = half::f16::from_f32(gain / (4.6 * (t.cols as f32).sqrt())).to_le_bytes();
            for block in buf.chunks_exact_mut(Q4_0_BLOCK.1) {
                block[..2].copy_from_slice(&scale);
                block[2..10].copy_from_slice(&rng.next_u64().to_le_bytes());
                block[10..].copy_from_slice(&rng.next_u64().to_le_bytes());
            }
        }
        _ => {
            // Two uniforms per draw: 23 random mantissa bits give 1 + u in [1, 2).
            let centre = if t.cols == 0 { 1.0 } else { 0.0 };
            let unit = |bits: u64| f32::from_bits(0x3F80_0000 | (bits as u32 >> 9)) - 1.5;
            for pair in buf.chunks_mut(8) {
                let bits = rng.next_u64();
                let values = [centre + 0.1 * unit(bits), centre + 0.1 * unit(bits >> 32)];
                for (bytes, v) in pair.chunks_exact_mut(4).zip(values) {
                    bytes.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}
