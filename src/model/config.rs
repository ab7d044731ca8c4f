//! The model's hyper-parameters, read from GGUF metadata. Nothing here is specific to SmolLM2:
//! every width, head count and constant comes from the file.

use crate::gguf::{Gguf, MetaValue};

use super::ModelError;

/// A llama-architecture model's shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub arch: String,
    pub name: String,
    pub n_layers: u32,
    /// Embedding width (hidden size).
    pub hidden: u32,
    /// Feed-forward inner width.
    pub ffn: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub vocab: u32,
    /// The longest context the model was trained for.
    pub context_length: u32,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// A 64-bit hash of the file's metadata, tensor table and samples of every tensor's data:
    /// the identity of the model for anything derived from it (the prefix cache, KV snapshots).
    pub fingerprint: u64,
    /// Tokens a local (sliding-window) attention layer sees, or `None` when every layer is global.
    pub sliding_window: Option<u32>,
}

impl ModelConfig {
    /// What the KV cache needs of the model: its pool shape and identity.
    pub fn kv_shape(&self) -> crate::kv::KvShape {
        crate::kv::KvShape { n_layers: self.n_layers, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim, fingerprint: self.fingerprint }
    }

    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelConfig, ModelError> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        if arch != "llama" {
            return Err(ModelError::Unsupported(format!(
                "architecture '{arch}': pagedlm runs llama-architecture models only"
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let n_layers = gguf.get_u32(&key("block_count"))?;
        let hidden = gguf.get_u32(&key("embedding_length"))?;
        let ffn = gguf.get_u32(&key("feed_forward_length"))?;
        let n_heads = gguf.get_u32(&key("attention.head_count"))?;
        let n_kv_heads = match gguf.get(&key("attention.head_count_kv")) {
            Some(_) => gguf.get_u32(&key("attention.head_count_kv"))?,
            None => n_heads,
        };
        let context_length = gguf.get_u32(&key("context_length"))?;
        let rope_base = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let rms_eps = gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        if n_layers == 0 || hidden == 0 || ffn == 0 || n_heads == 0 || n_kv_heads == 0 {
            return Err(ModelError::Format("a layer count, width or head count is zero".into()));
        }
        if hidden % n_heads != 0 {
            return Err(ModelError::Format(format!("embedding length {hidden} is not a multiple of the {n_heads} heads")));
        }
        let head_dim = match gguf.get(&key("attention.key_length")) {
            Some(_) => gguf.get_u32(&key("attention.key_length"))?,
            None => hidden / n_heads,
        };
        if n_heads % n_kv_heads != 0 {
            return Err(ModelError::Format(format!(
                "{n_heads} query heads cannot be grouped over {n_kv_heads} KV heads"
            )));
        }
        if head_dim % 4 != 0 || head_dim > 256 {
            return Err(ModelError::Unsupported(format!("head dimension {head_dim} (pagedlm needs a multiple of 4 up to 256)")));
        }
        if gguf.get(&key("rope.dimension_count")).is_some() {
            let rot = gguf.get_u32(&key("rope.dimension_count"))?;
            if rot != head_dim {
                return Err(ModelError::Unsupported(format!("partial rotary embedding ({rot} of {head_dim} dimensions)")));
            }
        }
        let embd = gguf
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::Format("the file has no token_embd.weight tensor".into()))?;
        if embd.dims.len() != 2 || embd.dims[0] != hidden as u64 {
            return Err(ModelError::Format(format!(
                "token_embd.weight has dims {:?}, expected [{hidden}, vocab]",
                embd.dims
            )));
        }
        let vocab = u32::try_from(embd.dims[1]).map_err(|_| ModelError::Format("vocabulary too large".into()))?;
        let name = gguf.get_str("general.name").unwrap_or("unnamed").to_string();
        Ok(ModelConfig {
            arch,
            name,
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length,
            rope_base,
            rms_eps,
            fingerprint: fingerprint(gguf),
            sliding_window: None,
        })
    }

    /// Floats in one fused q|k|v row.
    pub fn qkv_width(&self) -> u32 {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    /// Floats in one attention output row.
    pub fn q_width(&self) -> u32 {
        self.n_heads * self.head_dim
    }
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn meta(&mut self, v: &MetaValue) {
        self.u64(v.type_id() as u64);
        match v {
            MetaValue::String(s) => {
                self.u64(s.len() as u64);
                self.bytes(s.as_bytes());
            }
            MetaValue::Array(items) => {
                self.u64(items.len() as u64);
                items.iter().for_each(|i| self.meta(i));
            }
            MetaValue::F32(f) => self.bytes(&f.to_le_bytes()),
            MetaValue::F64(f) => self.bytes(&f.to_le_bytes()),
            MetaValue::Bool(b) => self.u64(*b as u64),
            other => self.u64(other.as_u64().unwrap_or_else(|| other.as_i64().unwrap_or(0) as u64)),
        }
    }
}

/// Hashes everything that defines the model's outputs except the bulk of the weights, of which
/// it takes 1 KiB at the start, middle and end of every tensor: enough to tell apart two
/// fine-tunes or quantizations of one architecture, at a cost of milliseconds, not a pass over
/// the whole file.
fn fingerprint(gguf: &Gguf<'_>) -> u64 {
    let mut h = Fnv::new();
    h.u64(gguf.version as u64);
    for (key, value) in &gguf.metadata {
        h.bytes(key.as_bytes());
        h.meta(value);
    }
    for t in &gguf.tensors {
        h.bytes(t.name.as_bytes());
        t.dims.iter().for_each(|&d| h.u64(d));
        h.u64(t.ggml_type.to_u32() as u64);
        let data = gguf.tensor_data(t);
        const SAMPLE: usize = 1024;
        if data.len() <= 3 * SAMPLE {
            h.bytes(data);
        } else {
            let mid = data.len() / 2 - SAMPLE / 2;
            h.bytes(&data[..SAMPLE]);
            h.bytes(&data[mid..mid + SAMPLE]);
            h.bytes(&data[data.len() - SAMPLE..]);
        }
    }
    h.0
}
