//! The model's hyper-parameters, read from GGUF metadata. Nothing here is specific to SmolLM2:
//! every width, head count and constant comes from the file.

use crate::gguf::{Gguf, MetaValue};

use super::ModelError;

/// The architectures pagedlm runs (`general.architecture`), and what each adds to the llama block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Pre-norm blocks, SwiGLU, NORM RoPE pairing (SmolLM2, Llama).
    Llama,
    /// Gemma 3: per-head q/k RMSNorm, norms after attention and after the FFN, GeGLU (tanh),
    /// the embedding scaled by √hidden, NEOX RoPE pairing, five local (sliding-window) layers of
    /// every six with their own RoPE base.
    Gemma3,
}

impl Architecture {
    fn from_name(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "gemma3" => Some(Architecture::Gemma3),
            _ => None,
        }
    }

    /// Whether pagedlm understands the `{arch}.` metadata key `key` (the part after the prefix)
    /// for this architecture. Any other key under the prefix names a feature it does not
    /// implement (RoPE scaling, soft-capping, experts...) and the file is refused with that key's
    /// name rather than run wrongly.
    fn knows_key(self, key: &str) -> bool {
        const COMMON: &[&str] = &[
            "block_count",
            "context_length",
            "embedding_length",
            "feed_forward_length",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.layer_norm_rms_epsilon",
            "attention.key_length",
            "attention.value_length",
            "rope.freq_base",
            "rope.dimension_count",
            "vocab_size",
        ];
        COMMON.contains(&key) || (self == Architecture::Gemma3 && key == "attention.sliding_window")
    }
}

/// Which two dimensions of a head rotate together: a property of how the file's q/k weights
/// were converted ([`ModelConfig::rope_pairing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RopePairing {
    /// (x[2i], x[2i+1]): llama's GGUF files.
    Norm,
    /// (x[i], x[i + head_dim/2]): Gemma's (and GPT-NeoX's).
    Neox,
}

impl RopePairing {
    /// The two dimensions of pair `i` in a head of `head_dim`.
    pub fn dims(self, i: usize, head_dim: usize) -> (usize, usize) {
        match self {
            RopePairing::Norm => (2 * i, 2 * i + 1),
            RopePairing::Neox => (i, i + head_dim / 2),
        }
    }
}

/// The activation of the FFN's gate (SwiGLU for llama, GeGLU with tanh GELU for Gemma).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// silu(g) = g / (1 + exp(-g)).
    Silu,
    /// gelu_tanh(g) = g/2 * (1 + tanh(√(2/π) (g + 0.044715 g³))).
    GeluTanh,
}

impl Activation {
    /// The activation of one value, in f64 (the CPU references).
    pub fn apply(self, g: f64) -> f64 {
        match self {
            Activation::Silu => g / (1.0 + (-g).exp()),
            Activation::GeluTanh => {
                0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
            }
        }
    }
}

/// Gemma 3's fixed conventions (llama.cpp's `gemma3` model): every sixth layer (l % 6 == 5) is
/// global, the others local; local layers use RoPE base 10,000 whatever `rope.freq_base` says.
const GEMMA3_WINDOW_PATTERN: u32 = 6;
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;

/// A decoder-only model's shape and the features of its blocks, all from GGUF metadata.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub arch: String,
    pub architecture: Architecture,
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
    /// RoPE base of the global layers (every layer without a window).
    pub rope_base: f32,
    /// RoPE base of the sliding-window layers.
    pub rope_base_local: f32,
    pub rope_pairing: RopePairing,
    pub rms_eps: f32,
    /// The gate's activation in the FFN.
    pub activation: Activation,
    /// The embedding rows are multiplied by this (√hidden for Gemma, else 1).
    pub embedding_scale: f32,
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before each residual add (`post_attention_norm`,
    /// `post_ffw_norm`).
    pub post_norms: bool,
    /// Local layers attend to the last `sliding_window` positions only; None: every layer is global.
    pub sliding_window: Option<u32>,
    /// With a window: layer l is global iff l % window_pattern == window_pattern - 1.
    pub window_pattern: u32,
    /// A 64-bit hash of the file's metadata, tensor table and samples of every tensor's data:
    /// the identity of the model for anything derived from it (the prefix cache, KV snapshots).
    pub fingerprint: u64,
}

impl ModelConfig {
    /// The window of layer `l`'s attention: Some(w) for a local layer, None for a global one.
    pub fn layer_window(&self, l: u32) -> Option<u32> {
        let p = self.window_pattern.max(1);
        self.sliding_window.filter(|_| l % p != p - 1)
    }

    /// The RoPE base of layer `l`.
    pub fn layer_rope_base(&self, l: u32) -> f32 {
        if self.layer_window(l).is_some() {
            self.rope_base_local
        } else {
            self.rope_base
        }
    }

    // Long: one read per metadata key, with its check next to it.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelConfig, ModelError> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        let architecture = Architecture::from_name(&arch).ok_or_else(|| {
            ModelError::Unsupported(format!("architecture '{arch}': pagedlm runs the llama and gemma3 architectures"))
        })?;
        let prefix = format!("{arch}.");
        if let Some((key, _)) = gguf.metadata.iter().find(|(k, _)| k.strip_prefix(&prefix).is_some_and(|rest| !architecture.knows_key(rest))) {
            return Err(ModelError::Unsupported(format!("metadata key '{key}': a {arch} feature pagedlm does not implement")));
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
        let head_dim = match gguf.get(&key("attention.key_length")) {
            Some(_) => gguf.get_u32(&key("attention.key_length"))?,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => return Err(ModelError::Format(format!("embedding length {hidden} is not a multiple of the {n_heads} heads"))),
        };
        if gguf.get(&key("attention.value_length")).is_some() {
            let v = gguf.get_u32(&key("attention.value_length"))?;
            if v != head_dim {
                return Err(ModelError::Unsupported(format!("value length {v} differs from key length {head_dim}")));
            }
        }
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
        let gemma = architecture == Architecture::Gemma3;
        let sliding_window = match (gemma, gguf.get(&key("attention.sliding_window"))) {
            (true, Some(_)) => Some(gguf.get_u32(&key("attention.sliding_window"))?).filter(|&w| w > 0),
            _ => None,
        };
        if sliding_window.is_some() && n_layers > 64 {
            return Err(ModelError::Unsupported(format!("{n_layers} layers with a sliding window (the KV cache marks local layers in 64 bits)")));
        }
        if gemma && n_layers == 62 {
            // llama.cpp scales Gemma 3 27B's queries by 1/√(hidden / n_heads), not 1/√head_dim.
            return Err(ModelError::Unsupported("Gemma 3 27B's attention scale".into()));
        }
        Ok(ModelConfig {
            arch,
            architecture,
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
            rope_base_local: if gemma { GEMMA3_LOCAL_ROPE_BASE } else { rope_base },
            rope_pairing: if gemma { RopePairing::Neox } else { RopePairing::Norm },
            rms_eps,
            activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
            embedding_scale: if gemma { (hidden as f32).sqrt() } else { 1.0 },
            qk_norm: gemma,
            post_norms: gemma,
            sliding_window,
            window_pattern: if gemma { GEMMA3_WINDOW_PATTERN } else { 1 },
            fingerprint: fingerprint(gguf),
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
