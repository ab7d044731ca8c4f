//! The model's hyper-parameters, read from GGUF metadata. Nothing here is specific to SmolLM2:
//! every width, head count and constant comes from the file.

use crate::gguf::Gguf;

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
}

impl ModelConfig {
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
        if let Some(_) = gguf.get(&key("rope.dimension_count")) {
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

    /// KV-cache bytes per token at `bytes_per_value`: layers × KV heads × head dim × 2 (K and V) × bytes.
    pub fn kv_bytes_per_token(&self, bytes_per_value: u32) -> u64 {
        self.n_layers as u64 * self.n_kv_heads as u64 * self.head_dim as u64 * 2 * bytes_per_value as u64
    }
}
