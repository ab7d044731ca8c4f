//! Writing GGUF files, and tiny synthetic llama models in the real model's format, so
//! end-to-end tests run in seconds without the 98 MB model.
//!
//! The synthetic model has, by default, the tensor types of SmolLM2-135M-Instruct.Q4_1 (Q8_0 tied
//! embedding/output, Q4_1 projections, F32 norms; [`SynthTypes`] chooses others), its metadata
//! keys and its chat template. [`requantize_gguf`] re-encodes any GGUF's matrices to one type.
//! Its vocabulary is byte-level GPT-2 BPE:
//! - ids 0, 1, 2: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (control tokens, the same ids
//!   as in the real model);
//! - ids 3..=258: the 256 single bytes, byte `b` as token `3 + b`, spelled with GPT-2's
//!   bytes-to-unicode alphabet (space is `Ġ`), so every byte string can be tokenized;
//! - ids 259..: one token per merge of [`SYNTH_MERGES`], in order, when `vocab` asks for more.
//!
//! [`vocab_from_tokenizer_json`] gives the `tokenizer.*` metadata of a real vocabulary instead
//! (a Hugging Face `tokenizer.json`, converted as llama.cpp's converter does).

use crate::gguf::{tensor_size_bytes, GgmlType, GgufError, MetaValue, DEFAULT_ALIGNMENT, MAX_STRING_LEN};
use crate::model::arch::{Description, Dims, Shape};
use crate::model::{Architecture, Role};
use crate::quant::{quantize, WeightType};
use crate::rng::Rng;

mod big;
mod requantize;
mod split;
mod vocab;

pub use big::{big_llama_config, write_big_llama};
pub use requantize::{requantize_gguf, row_type};
pub use split::{split_gguf, split_part_name, try_split_gguf};
pub use vocab::{vocab_from_tokenizer_json, AddedTokenFact, VocabFacts};

/// Builds a GGUF v3 file in memory.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    /// The data's length in bytes (unpadded).
    size: u64,
    /// `None`: declared by [`GgufWriter::add_tensor_info`], its data streamed by the caller.
    data: Option<Vec<u8>>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata entry. Arrays must hold values of one type (nested arrays may differ
    /// from each other); an empty array is written with element type string.
    /// A `general.alignment` that is not a power of two is written as given, so tests can make
    /// files a reader must refuse; the layout then uses 32.
    pub fn add_meta(&mut self, key: impl Into<String>, value: MetaValue) -> Result<(), GgufError> {
        let key = key.into();
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(GgufError::InvalidWrite(format!("metadata key {key:?} added twice")));
        }
        check_string(&key, "metadata key")?;
        check_writable(&key, &value)?;
        self.metadata.push((key, value));
        Ok(())
    }

    /// Adds a tensor. dims: GGUF order (`dims[0]` = ne0, innermost); `data` must have exactly
    /// the size the type and dims give (any size for `Other` types, which have no known size).
    pub fn add_tensor(&mut self, name: impl Into<String>, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> Result<(), GgufError> {
        let name = name.into();
        match self.check_tensor(&name, dims, ggml_type)? {
            Some(size) if size != data.len() as u64 => {
                Err(GgufError::InvalidWrite(format!("tensor {name}: {} {:?} needs {size} bytes, got {}", ggml_type.name(), dims, data.len())))
            }
            _ => {
                self.tensors.push(PendingTensor { name, dims: dims.to_vec(), ggml_type, size: data.len() as u64, data: Some(data) });
                Ok(())
            }
        }
    }

    /// Adds a tensor whose data the caller writes after [`GgufWriter::header`], in the order the
    /// tensors were added, each padded to [`GgufWriter::alignment`] (so a file of gigabytes
    /// never sits in memory). The type must have a known size; [`GgufWriter::to_bytes`] writes
    /// zeros for it.
    pub fn add_tensor_info(&mut self, name: impl Into<String>, dims: &[u64], ggml_type: GgmlType) -> Result<(), GgufError> {
        let name = name.into();
        let Some(size) = self.check_tensor(&name, dims, ggml_type)? else {
            return Err(GgufError::InvalidWrite(format!("tensor {name}: type {} has no known size", ggml_type.name())));
        };
        self.tensors.push(PendingTensor { name, dims: dims.to_vec(), ggml_type, size, data: None });
        Ok(())
    }

    /// A new tensor's name and dims checked: its data size, when the type has a known one.
    fn check_tensor(&self, name: &str, dims: &[u64], ggml_type: GgmlType) -> Result<Option<u64>, GgufError> {
        let invalid = |msg: String| Err(GgufError::InvalidWrite(format!("tensor {name}: {msg}")));
        if self.tensors.iter().any(|t| t.name == name) {
            return invalid("added twice".into());
        }
        check_string(name, "tensor name")?;
        if dims.len() > crate::gguf::MAX_DIMS as usize {
            return invalid(format!("{} dimensions", dims.len()));
        }
        tensor_size_bytes(dims, ggml_type).or_else(invalid)
    }

    /// The alignment the file is laid out with: `general.alignment` if it is a power of two.
    pub fn alignment(&self) -> u64 {
        self.metadata.iter().find(|(k, _)| k == "general.alignment").and_then(|(_, v)| v.as_u64()).filter(|a| a.is_power_of_two()).unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Everything before the first tensor's data: magic, version, counts, metadata, tensor
    /// infos (offsets from the sizes), zero padding to the alignment.
    pub fn header(&self) -> Vec<u8> {
        let alignment = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_u32().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += t.size.next_multiple_of(alignment);
        }
        out.resize(out.len().next_multiple_of(alignment as usize), 0);
        out
    }

    /// The file: [`GgufWriter::header`], then every tensor's data at an aligned offset, each
    /// padded to the alignment (zeros for a tensor added by [`GgufWriter::add_tensor_info`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self.alignment() as usize;
        let mut out = self.header();
        for t in &self.tensors {
            match &t.data {
                Some(data) => out.extend_from_slice(data),
                None => out.resize(out.len() + t.size as usize, 0),
            }
            out.resize(out.len().next_multiple_of(alignment), 0);
        }
        out
    }
}

fn check_string(s: &str, what: &str) -> Result<(), GgufError> {
    if s.len() as u64 > MAX_STRING_LEN {
        return Err(GgufError::InvalidWrite(format!("{what} of {} bytes is longer than {MAX_STRING_LEN}", s.len())));
    }
    Ok(())
}

/// Arrays must be homogeneous (GGUF stores one element type per array) and strings short
/// enough for the reader to accept.
fn check_writable(key: &str, value: &MetaValue) -> Result<(), GgufError> {
    match value {
        MetaValue::String(s) => check_string(s, &format!("value of {key}")),
        MetaValue::Array(items) => {
            if let Some(first) = items.first() {
                if let Some(odd) = items.iter().find(|v| v.type_id() != first.type_id()) {
                    return Err(GgufError::InvalidWrite(format!("array {key} mixes {} and {} elements", first.type_name(), odd.type_name())));
                }
            }
            items.iter().try_for_each(|v| check_writable(key, v))
        }
        _ => Ok(()),
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.push(*v as u8),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(*v as u8),
        MetaValue::String(s) => write_string(out, s),
        MetaValue::Array(items) => {
            let elem_type = items.first().map_or(MetaValue::String(String::new()).type_id(), |v| v.type_id());
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for v in items {
                write_value(out, v);
            }
        }
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// SmolLM2-135M-Instruct's chat template (ChatML, with a default system prompt when the
/// conversation has none), copied from the model's `tokenizer.chat_template`.
pub const SMOLLM2_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The special tokens, ids 0, 1, 2 as in the real model.
pub const SYNTH_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Id of the first byte token: byte `b` is token `SYNTH_FIRST_BYTE_TOKEN + b`.
pub const SYNTH_FIRST_BYTE_TOKEN: u32 = 3;
/// Vocabulary size without merges: the specials and the 256 bytes.
pub const SYNTH_BASE_VOCAB: usize = 259;
/// Merges (the real model's first ones) whose results become tokens 259.. when a config asks
/// for a vocabulary larger than [`SYNTH_BASE_VOCAB`]; each uses only earlier tokens.
pub const SYNTH_MERGES: [&str; 19] =
    ["Ġ t", "Ġ a", "i n", "h e", "Ġ Ġ", "r e", "o n", "e r", "Ġt he", "a t", "Ġ s", "Ġ o", "e n", "Ġ c", "e s", "Ġ w", "n d", "i t", "o r"];

/// GPT-2's byte-level alphabet: the printable character that stands for each byte in vocab
/// strings. Printable Latin-1 bytes stand for themselves; the rest map to U+0100 onwards in
/// byte order (so space, 0x20, is `Ġ` U+0120).
pub fn gpt2_byte_to_char() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut table = ['\0'; 256];
    let mut next_unprintable = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let code = if printable(b) {
            b
        } else {
            next_unprintable += 1;
            0x100 + next_unprintable - 1
        };
        *slot = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

/// Shape and seed of a synthetic llama.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Token count: at least [`SYNTH_BASE_VOCAB`], at most that plus [`SYNTH_MERGES`]`.len()`.
    pub vocab: usize,
    pub context: usize,
    pub rope_base: f32,
    pub eps: f32,
    pub seed: u64,
    pub types: SynthTypes,
    /// Some: a `gemma3` file (QK norm, post-norms, GELU, embedding scale, NEOX RoPE, local layers
    /// l % 6 != 5 with this window); None: a llama file.
    pub gemma: Option<SynthGemma>,
    /// Another architecture (`gemma` must then be `None`).
    pub family: Option<SynthFamily>,
    /// A real vocabulary: its `tokenizer.*` metadata (as `convert_hf_to_gguf` writes it) in place
    /// of the synthetic one; `vocab` must be its token count.
    pub tokenizer: Option<Vec<(String, MetaValue)>>,
    /// `tokenizer.chat_template`; None: SmolLM2's (or the one `tokenizer` holds).
    pub chat_template: Option<String>,
    /// A scripted model: each (t, s) makes s the clear greedy choice after token t, whatever came
    /// before ([`try_tiny_llama_gguf`] says how). Needs an output projection of its own.
    pub script: Vec<(u32, u32)>,
    /// `general.name`; None: "pagedlm synthetic {architecture}".
    pub name: Option<String>,
}

/// What a synthetic `gemma3` file adds to the shape.
/// A synthetic model of another architecture than llama and gemma3 (or a llama carrying Llama
/// 3.x's RoPE factors): what its file says beyond the common keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthFamily {
    pub arch: Architecture,
    /// `attention.key_length` (and `value_length`): may differ from hidden / n_heads.
    pub head_dim: usize,
    /// `rope.dimension_count`: fewer than `head_dim` for partial rotary.
    pub rope_dims: usize,
    /// `attention.sliding_window` where the architecture has the key (0: not written).
    pub window: usize,
    /// An output projection of its own (else tied to the embedding).
    pub untied: bool,
    /// The architecture's RoPE factor tensors (llama's `rope_freqs`, phi3's short and long).
    pub rope_factors: bool,
    /// phi3's `rope.scaling.original_context_length` and `rope.scaling.attn_factor`.
    pub original_context: usize,
    pub attn_factor: f32,
    /// gemma2's attention-logit and final-logit soft-caps.
    pub softcaps: (f32, f32),
}

impl SynthFamily {
    /// A model of `arch` with heads of `head_dim`, every dimension rotated, tied, no extras.
    pub fn new(arch: Architecture, head_dim: usize) -> SynthFamily {
        SynthFamily {
            arch,
            head_dim,
            rope_dims: head_dim,
            window: 0,
            untied: false,
            rope_factors: false,
            original_context: 0,
            attn_factor: 1.0,
            softcaps: (0.0, 0.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthGemma {
    /// `gemma3.attention.sliding_window`.
    pub window: usize,
    /// `gemma3.attention.key_length` (Gemma's heads are wider than hidden / n_heads).
    pub head_dim: usize,
}

/// The weight types of a synthetic llama (norms are always F32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthTypes {
    /// `token_embd.weight`, tied to the output.
    pub embedding: GgmlType,
    /// The attention and FFN projections.
    pub linear: GgmlType,
}

impl Default for SynthTypes {
    /// SmolLM2-135M-Instruct.Q4_1's: Q8_0 embedding, Q4_1 projections.
    fn default() -> SynthTypes {
        SynthTypes { embedding: GgmlType::Q8_0, linear: GgmlType::Q4_1 }
    }
}

impl SynthConfig {
    /// 2 layers, hidden 64, FFN 128, 4 heads and 2 KV heads of dim 16, vocab 259 (no merges),
    /// context 512: about 70 KB.
    pub fn tiny() -> SynthConfig {
        SynthConfig {
            n_layers: 2,
            hidden: 64,
            ffn: 128,
            n_heads: 4,
            n_kv_heads: 2,
            vocab: SYNTH_BASE_VOCAB,
            context: 512,
            rope_base: 10000.0,
            eps: 1e-5,
            seed: 0x5eed,
            types: SynthTypes::default(),
            gemma: None,
            family: None,
            tokenizer: None,
            chat_template: None,
            script: Vec::new(),
            name: None,
        }
    }

    pub fn head_dim(&self) -> usize {
        if let Some(g) = self.gemma {
            return g.head_dim;
        }
        if let Some(f) = self.family {
            return f.head_dim;
        }
        self.hidden.checked_div(self.n_heads).unwrap_or(0)
    }

    /// Checks what the GGUF layout and a llama forward pass need.
    pub fn validate(&self) -> Result<(), GgufError> {
        let bad = |msg: String| Err(GgufError::InvalidWrite(format!("synthetic config: {msg}")));
        if self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 || self.context == 0 {
            return bad("layers, heads, KV heads and context must be nonzero".into());
        }
        if self.hidden % 32 != 0 || self.ffn % 32 != 0 || self.hidden == 0 || self.ffn == 0 {
            return bad(format!("hidden {} and ffn {} must be nonzero multiples of 32 (blocks along ne0)", self.hidden, self.ffn));
        }
        // Every matrix has ne0 = hidden or ffn. A K-quant type is refused rather than replaced
        // (as `row_type` would) when they are not whole super-blocks, so that a config naming
        // Q4_K really makes Q4_K matrices.
        for (what, t) in [("embedding", self.types.embedding), ("linear", self.types.linear)] {
            let block = t.block_size().filter(|_| t.is_supported()).map(|(values, _)| values);
            match block {
                None => return bad(format!("{what} type {} is not one pagedlm computes with", t.name())),
                Some(b) if self.hidden as u64 % b != 0 || self.ffn as u64 % b != 0 => {
                    return bad(format!("hidden {} and ffn {} must be multiples of {b} for {what} type {}", self.hidden, self.ffn, t.name()))
                }
                Some(_) => {}
            }
        }
        if self.gemma.is_some() && self.family.is_some() {
            return bad("gemma and family are exclusive".into());
        }
        if (self.gemma.is_none() && self.family.is_none() && self.hidden % self.n_heads != 0) || self.head_dim() % 2 != 0 {
            return bad(format!("hidden {} must split into {} heads of even size (RoPE pairs)", self.hidden, self.n_heads));
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("{} heads cannot share {} KV heads evenly", self.n_heads, self.n_kv_heads));
        }
        let max_vocab = SYNTH_BASE_VOCAB + SYNTH_MERGES.len();
        if let Some(meta) = &self.tokenizer {
            let tokens = meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array().map(<[MetaValue]>::len));
            if tokens != Some(self.vocab) {
                return bad(format!("vocab {} is not the tokenizer's {tokens:?} tokens", self.vocab));
            }
        } else if !(SYNTH_BASE_VOCAB..=max_vocab).contains(&self.vocab) {
            return bad(format!("vocab {} must be in {SYNTH_BASE_VOCAB}..={max_vocab}", self.vocab));
        }
        Ok(())
    }
}

/// The synthetic vocabulary, merges and token types for `vocab` tokens (see the module doc).
pub fn synth_vocab(vocab: usize) -> (Vec<String>, Vec<String>, Vec<i32>) {
    let alphabet = gpt2_byte_to_char();
    let mut tokens: Vec<String> = SYNTH_SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(alphabet.iter().map(|c| c.to_string()));
    let n_merges = vocab.saturating_sub(SYNTH_BASE_VOCAB).min(SYNTH_MERGES.len());
    let merges: Vec<String> = SYNTH_MERGES[..n_merges].iter().map(|m| m.to_string()).collect();
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    let token_types = (0..tokens.len()).map(|i| if i < SYNTH_SPECIALS.len() { 3 } else { 1 }).collect();
    (tokens, merges, token_types)
}

/// A llama GGUF with random weights, laid out like SmolLM2-135M-Instruct.Q4_1: `token_embd.weight`
/// [hidden, vocab] tied to the output (no `output.weight`), projections, F32 norms, in the
/// types of `cfg.types` (by default the real file's: Q8_0 embedding, Q4_1 projections). Weights are normal with std `gain / sqrt(fan_in)` so activations
/// stay O(1) and logits spread over a few units; norms are 1 ± 0.1.
///
/// # Panics
/// If `cfg` fails [`SynthConfig::validate`] (use [`try_tiny_llama_gguf`] to get the error).
pub fn tiny_llama_gguf(cfg: &SynthConfig) -> Vec<u8> {
    try_tiny_llama_gguf(cfg).unwrap_or_else(|e| panic!("tiny_llama_gguf: {e}"))
}

/// [`tiny_llama_gguf`], returning a config error instead of panicking.
// Long: the tensors in the real file's order, each role's values.
pub fn try_tiny_llama_gguf(cfg: &SynthConfig) -> Result<Vec<u8>, GgufError> {
    let (mut w, description) = synth_metadata(cfg)?;
    let mut rng = Rng::new(cfg.seed);
    let linear = cfg.types.linear;
    let dims = synth_dims(cfg);
    let architecture = description.architecture;

    // Every tensor the architecture's table lists but an optional one (the output projection:
    // tied), in the table's order. Matrices [ne0 = fan_in, ne1 = fan_out] are random normal
    // scaled by gain / sqrt(fan_in); norms are 1 ± 0.1.
    let family = cfg.family.unwrap_or(SynthFamily::new(architecture, cfg.head_dim()));
    let written = |t: &crate::model::TensorSpec| match t.role {
        _ if !t.optional => true,
        Role::Output => family.untied || !cfg.script.is_empty(),
        _ => family.rope_factors,
    };
    // A scripted model: each token t that starts a pair gets a dimension of its own.
    let mut script_dims: Vec<u32> = Vec::new();
    for &(t, _) in &cfg.script {
        if !script_dims.contains(&t) {
            script_dims.push(t);
        }
    }
    if script_dims.len() > cfg.hidden || cfg.script.iter().any(|&(t, s)| t as usize >= cfg.vocab || s as usize >= cfg.vocab) {
        return Err(GgufError::InvalidWrite(format!("a script of {} tokens in a model of width {} and {} tokens", script_dims.len(), cfg.hidden, cfg.vocab)));
    }
    for t in description.tensors(&dims).tensors.into_iter().filter(written) {
        let (ggml_type, mut values) = match t.shape {
            Shape::Vector(len) => {
                // Factors grow from 1 at the fastest pair (Llama 3's go up to 8); biases are
                // centred; norms 1 ± 0.1.
                let ramp = |i: u32, top: f32| 1.0 + top * (i as f32 / len as f32).powi(2);
                let values = match t.role {
                    Role::RopeFreqs => (0..len).map(|i| ramp(i, 7.0)).collect(),
                    Role::RopeFactorsShort => (0..len).map(|i| ramp(i, 0.5)).collect(),
                    Role::RopeFactorsLong => (0..len).map(|i| ramp(i, 4.0)).collect(),
                    Role::AttnQBias | Role::AttnKBias | Role::AttnVBias => (0..len).map(|_| 0.5 * rng.normal()).collect(),
                    _ => (0..len).map(|_| 1.0 + 0.1 * rng.normal()).collect::<Vec<f32>>(),
                };
                (GgmlType::F32, values)
            }
            Shape::Matrix { cols, rows } => {
                // Tied output: logits = h·E with |h| ≈ sqrt(hidden), so gain 2 gives logits of
                // std ≈ 2; the projections into the residual stream are damped.
                let gain = match t.role {
                    Role::TokenEmbd | Role::Output => 2.0,
                    Role::FfnDown | Role::AttnOutput => 0.5,
                    _ => 1.0,
                };
                let std = gain / (cols as f32).sqrt();
                let ty = if matches!(t.role, Role::TokenEmbd | Role::Output) { cfg.types.embedding } else { linear };
                (ty, (0..cols as u64 * rows as u64).map(|_| rng.normal() * std).collect())
            }
        };
        if !cfg.script.is_empty() {
            script_weights(&cfg.script, &script_dims, (t.role, cfg.hidden), &mut values);
        }
        w.add_tensor(t.name, &t.shape.dims(), ggml_type, encode(ggml_type, &values)?)?;
    }
    Ok(w.to_bytes())
}

/// A writer holding the metadata of `cfg`'s file (architecture keys, general keys, tokenizer,
/// chat template), and the architecture's description, whose tensor table names the tensors.
// Long: every key of the file, in the real file's order.
fn synth_metadata(cfg: &SynthConfig) -> Result<(GgufWriter, &'static Description), GgufError> {
    cfg.validate()?;
    let hd = cfg.head_dim();
    let u32_meta = |v: usize| MetaValue::U32(v as u32);
    let mut w = GgufWriter::new();
    let architecture = match (cfg.gemma, cfg.family) {
        (Some(_), _) => Architecture::Gemma3,
        (None, Some(f)) => f.arch,
        (None, None) => Architecture::Llama,
    };
    let description = architecture.description();
    let arch = description.name;
    let a = |k: &str| format!("{arch}.{k}");
    let arch_meta = [
        (a("block_count"), u32_meta(cfg.n_layers)),
        (a("context_length"), u32_meta(cfg.context)),
        (a("embedding_length"), u32_meta(cfg.hidden)),
        (a("feed_forward_length"), u32_meta(cfg.ffn)),
        (a("attention.head_count"), u32_meta(cfg.n_heads)),
        (a("attention.head_count_kv"), u32_meta(cfg.n_kv_heads)),
        (a("rope.freq_base"), MetaValue::F32(cfg.rope_base)),
        (a("attention.layer_norm_rms_epsilon"), MetaValue::F32(cfg.eps)),
        (a("vocab_size"), u32_meta(cfg.vocab)),
        (a("rope.dimension_count"), u32_meta(cfg.family.map_or(hd, |f| f.rope_dims))),
    ];
    for (key, value) in arch_meta {
        w.add_meta(key, value)?;
    }
    if let Some(g) = cfg.gemma {
        w.add_meta(a("attention.key_length"), u32_meta(g.head_dim))?;
        w.add_meta(a("attention.value_length"), u32_meta(g.head_dim))?;
        w.add_meta(a("attention.sliding_window"), u32_meta(g.window))?;
    }
    if let Some(f) = cfg.family {
        w.add_meta(a("attention.key_length"), u32_meta(f.head_dim))?;
        w.add_meta(a("attention.value_length"), u32_meta(f.head_dim))?;
        let knows = |k: &str| description.keys.contains(&k);
        if f.window > 0 && knows("attention.sliding_window") {
            w.add_meta(a("attention.sliding_window"), u32_meta(f.window))?;
        }
        if knows("rope.scaling.original_context_length") {
            w.add_meta(a("rope.scaling.original_context_length"), u32_meta(f.original_context))?;
            w.add_meta(a("rope.scaling.attn_factor"), MetaValue::F32(f.attn_factor))?;
        }
        if knows("attn_logit_softcapping") {
            w.add_meta(a("attn_logit_softcapping"), MetaValue::F32(f.softcaps.0))?;
            w.add_meta(a("final_logit_softcapping"), MetaValue::F32(f.softcaps.1))?;
        }
    }
    let meta = [
        ("general.architecture", MetaValue::String(arch.into())),
        ("general.type", MetaValue::String("model".into())),
        ("general.name", MetaValue::String(cfg.name.clone().unwrap_or_else(|| format!("pagedlm synthetic {arch}")))),
        ("general.alignment", MetaValue::U32(DEFAULT_ALIGNMENT as u32)),
        // By default 3 = mostly Q4_1, as in the real file.
        ("general.file_type", MetaValue::U32(llama_file_type(cfg.types.linear))),
    ];
    for (key, value) in meta {
        w.add_meta(key, value)?;
    }
    let tokenizer = match &cfg.tokenizer {
        Some(meta) => meta.clone(),
        None => synth_tokenizer(cfg.vocab),
    };
    let has_template = tokenizer.iter().any(|(k, _)| k == "tokenizer.chat_template");
    for (key, value) in tokenizer.into_iter().filter(|(k, _)| !(cfg.chat_template.is_some() && k == "tokenizer.chat_template")) {
        w.add_meta(key, value)?;
    }
    if cfg.chat_template.is_some() || !has_template {
        w.add_meta("tokenizer.chat_template", MetaValue::String(cfg.chat_template.clone().unwrap_or_else(|| SMOLLM2_CHAT_TEMPLATE.into())))?;
    }
    w.add_meta("general.quantization_version", MetaValue::U32(2))?;
    Ok((w, description))
}

/// The `tokenizer.*` metadata of [`synth_vocab`]`(vocab)`: byte-level BPE as SmolLM2's, with its
/// special ids.
fn synth_tokenizer(vocab: usize) -> Vec<(String, MetaValue)> {
    let (tokens, merges, token_types) = synth_vocab(vocab);
    vec![
        ("tokenizer.ggml.add_space_prefix".into(), MetaValue::Bool(false)),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(false)),
        ("tokenizer.ggml.model".into(), MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), MetaValue::String("smollm".into())),
        ("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect())),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(token_types.into_iter().map(MetaValue::I32).collect())),
        ("tokenizer.ggml.merges".into(), MetaValue::Array(merges.into_iter().map(MetaValue::String).collect())),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0)),
        ("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(2)),
    ]
}

/// The shape a tensor table is built from for `cfg`.
fn synth_dims(cfg: &SynthConfig) -> Dims {
    let hd = cfg.head_dim();
    Dims {
        n_layers: cfg.n_layers as u32,
        hidden: cfg.hidden as u32,
        ffn: cfg.ffn as u32,
        n_heads: cfg.n_heads as u32,
        n_kv_heads: cfg.n_kv_heads as u32,
        head_dim: hd as u32,
        vocab: cfg.vocab as u32,
        rope_dims: cfg.family.map_or(hd, |f| f.rope_dims) as u32,
    }
}

/// A scripted model's weights (see [`SynthConfig::script`]): the embedding of each token t that
/// starts a pair is the unit vector of its own dimension; the blocks add nothing to the residual
/// stream (their output projections are zero), so the last row's normed state is that unit vector
/// times √hidden; the output projection's row s holds 1 at t's dimension for each pair (t, s) and
/// 0 elsewhere: after t, s's logit is about √hidden (8 at width 64), every other token's 0.
fn script_weights(script: &[(u32, u32)], dims: &[u32], (role, hidden): (Role, usize), values: &mut [f32]) {
    let dim = |t: u32| dims.iter().position(|&d| d == t).unwrap_or(0);
    match role {
        Role::TokenEmbd => {
            for &t in dims {
                let row = &mut values[t as usize * hidden..(t as usize + 1) * hidden];
                row.fill(0.0);
                row[dim(t)] = 1.0;
            }
        }
        Role::AttnOutput | Role::FfnDown => values.fill(0.0),
        Role::Output => {
            values.fill(0.0);
            for &(t, s) in script {
                values[s as usize * hidden + dim(t)] = 1.0;
            }
        }
        _ => {}
    }
}

/// `values` in type `t` (a validated config makes every matrix whole blocks of its type).
fn encode(t: GgmlType, values: &[f32]) -> Result<Vec<u8>, GgufError> {
    quantize(t, values).map_err(|e| GgufError::InvalidWrite(format!("synthetic weights: {e}")))
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a file whose matrices are mostly `t`
/// (its [`WeightType`] row; a validated config names a supported type).
fn llama_file_type(t: GgmlType) -> u32 {
    WeightType::of(t).map_or(0, |row| row.llama_file_type)
}

/// The names of [`family_model`]'s models.
pub const FAMILY_MODELS: [&str; 6] = ["qwen2", "qwen3", "llama3", "phi3", "gemma2", "smollm3"];

/// The synthetic model of each architecture beyond SmolLM2's llama and Gemma 3 that the tests
/// hold against llama.cpp (`tests/data/families/`): 4 layers, F32 weights (llama.cpp then
/// multiplies the activations themselves, so agreement is tight), each with its features at
/// work: qwen2's biases and untied output, qwen3's q/k norms over heads wider than hidden /
/// n_heads, Llama 3's RoPE factors, phi3's fused tensors, partial rotary and long factors
/// (context 512 past an original 256) with its attention factor and an ignored window, gemma2's
/// soft-caps and alternating window of 5, smollm3's NoPE layer 3.
pub fn family_model(name: &str) -> Option<SynthConfig> {
    let base = SynthConfig {
        n_layers: 4,
        vocab: SYNTH_BASE_VOCAB + SYNTH_MERGES.len(),
        types: SynthTypes { embedding: GgmlType::F32, linear: GgmlType::F32 },
        // Not "phi3": llama.cpp gives models so named Phi-3's token attributes, which this
        // vocabulary lacks.
        name: Some(format!("pagedlm synthetic {}", if name == "phi3" { "phi" } else { name })),
        ..SynthConfig::tiny()
    };
    let family = match name {
        "qwen2" => SynthFamily { untied: true, ..SynthFamily::new(Architecture::Qwen2, 16) },
        "qwen3" => SynthFamily::new(Architecture::Qwen3, 32),
        "llama3" => SynthFamily { rope_factors: true, ..SynthFamily::new(Architecture::Llama, 16) },
        "phi3" => SynthFamily {
            rope_dims: 12,
            window: 2047,
            rope_factors: true,
            original_context: 256,
            attn_factor: 1.19,
            ..SynthFamily::new(Architecture::Phi3, 16)
        },
        "gemma2" => SynthFamily { window: 5, softcaps: (3.0, 8.0), ..SynthFamily::new(Architecture::Gemma2, 32) },
        "smollm3" => SynthFamily::new(Architecture::Smollm3, 16),
        _ => return None,
    };
    Some(SynthConfig { family: Some(family), rope_base: 10_000.0, eps: 1e-6, ..base })
}

/// A copy of the GGUF `bytes` with `tokenizer.chat_template` set to `chat_template` (a family's
/// real template on a synthetic model: tests/data/templates/).
pub fn with_chat_template(bytes: &[u8], chat_template: &str) -> Result<Vec<u8>, GgufError> {
    let gguf = crate::gguf::Gguf::parse(bytes)?;
    let mut w = GgufWriter::new();
    for (key, value) in &gguf.metadata {
        match key.as_str() {
            "general.alignment" | "tokenizer.chat_template" => {}
            _ => w.add_meta(key.clone(), value.clone())?,
        }
    }
    w.add_meta("tokenizer.chat_template", MetaValue::String(chat_template.to_string()))?;
    for t in &gguf.tensors {
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type, gguf.tensor_data(t).to_vec())?;
    }
    Ok(w.to_bytes())
}
