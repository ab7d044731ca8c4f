//! The model's hyper-parameters, read from GGUF metadata, and the features of its blocks, from
//! its architecture's description ([`super::arch`]). Nothing here is specific to one model:
//! every width, head count and constant comes from the file.

use crate::gguf::{Gguf, MetaValue};

use super::arch::{self, Activation, Architecture, Attend, Description, Dims, Op, Plan, Proj, Role, Rope, RopePairing, TensorTable};
use super::ModelError;

/// The sizes and constants of a model, as its file's metadata gives them; the architecture's
/// [`Description`] adds the features of its blocks ([`ModelConfig::new`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HyperParams {
    pub n_layers: u32,
    pub hidden: u32,
    pub ffn: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    /// `attention.key_length`; `None`: hidden / n_heads.
    pub head_dim: Option<u32>,
    /// `attention.value_length`, if given.
    pub value_dim: Option<u32>,
    /// `rope.dimension_count`, if given: the dimensions of a head RoPE rotates.
    pub rope_dims: Option<u32>,
    pub vocab: u32,
    pub context_length: u32,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// `attention.sliding_window` where the architecture reads one (0: none).
    pub sliding_window: Option<u32>,
}

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

    /// Reads the file's architecture and hyper-parameters (refusing metadata its description
    /// does not know, by name) and makes the model's configuration ([`ModelConfig::new`]).
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelConfig, ModelError> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        let architecture = Architecture::named(&arch)
            .ok_or_else(|| ModelError::Unsupported(format!("architecture '{arch}': pagedlm runs the {} architectures", Architecture::names())))?;
        let description = architecture.description();
        let prefix = format!("{arch}.");
        if let Some((key, _)) = gguf.metadata.iter().find(|(k, _)| k.strip_prefix(&prefix).is_some_and(|rest| !description.knows_key(rest))) {
            return Err(ModelError::Unsupported(format!("metadata key '{key}': a {arch} feature pagedlm does not implement")));
        }
        let params = HyperParams::from_gguf(gguf, description)?;
        let name = gguf.get_str("general.name").unwrap_or("unnamed").to_string();
        ModelConfig::new(description, params, name, fingerprint(gguf))
    }

    /// The configuration of a model of the architecture `description` with `params`: the
    /// features of its blocks from the description, every size checked against what pagedlm
    /// computes.
    pub fn new(description: &Description, params: HyperParams, name: String, fingerprint: u64) -> Result<ModelConfig, ModelError> {
        let HyperParams {
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            value_dim,
            rope_dims,
            vocab,
            context_length,
            rope_base,
            rms_eps,
            sliding_window,
        } = params;
        if n_layers == 0 || hidden == 0 || ffn == 0 || n_heads == 0 || n_kv_heads == 0 {
            return Err(ModelError::Format("a layer count, width or head count is zero".into()));
        }
        let head_dim = match head_dim {
            Some(d) => d,
            None if hidden % n_heads == 0 => hidden / n_heads,
            None => return Err(ModelError::Format(format!("embedding length {hidden} is not a multiple of the {n_heads} heads"))),
        };
        if let Some(v) = value_dim.filter(|&v| v != head_dim) {
            return Err(ModelError::Unsupported(format!("value length {v} differs from key length {head_dim}")));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(ModelError::Format(format!("{n_heads} query heads cannot be grouped over {n_kv_heads} KV heads")));
        }
        if head_dim % 4 != 0 || head_dim > 256 {
            return Err(ModelError::Unsupported(format!("head dimension {head_dim} (pagedlm needs a multiple of 4 up to 256)")));
        }
        if let Some(rot) = rope_dims.filter(|&rot| rot != head_dim) {
            return Err(ModelError::Unsupported(format!("partial rotary embedding ({rot} of {head_dim} dimensions)")));
        }
        let sliding_window = sliding_window.filter(|&w| w > 0 && description.window.is_some());
        if sliding_window.is_some() && n_layers > 64 {
            return Err(ModelError::Unsupported(format!("{n_layers} layers with a sliding window (the KV cache marks local layers in 64 bits)")));
        }
        let config = ModelConfig {
            arch: description.name.to_string(),
            architecture: description.architecture,
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
            rope_base_local: description.window.map_or(rope_base, |w| w.local_rope_base),
            rope_pairing: description.rope_pairing,
            rms_eps,
            activation: description.activation,
            embedding_scale: if description.scaled_embedding { (hidden as f32).sqrt() } else { 1.0 },
            qk_norm: description.qk_norm,
            post_norms: description.post_norms,
            sliding_window,
            window_pattern: description.window.map_or(1, |w| w.pattern),
            fingerprint,
        };
        match (description.refuse)(&config.dims()) {
            Some(reason) => Err(ModelError::Unsupported(reason)),
            None => Ok(config),
        }
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

impl ModelConfig {
    /// The sizes of this model's tensors.
    pub fn dims(&self) -> Dims {
        Dims {
            n_layers: self.n_layers,
            hidden: self.hidden,
            ffn: self.ffn,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            vocab: self.vocab,
        }
    }

    /// Every tensor of this model.
    pub fn tensors(&self) -> TensorTable {
        self.architecture.description().tensors(&self.dims())
    }

    /// The ops of this model, layer by layer.
    pub fn plan(&self) -> Plan {
        let layer = |l: u32| {
            let rope = Rope { base: self.layer_rope_base(l), pairing: self.rope_pairing, dims: self.head_dim };
            let mut ops = vec![Op::Norm(Role::AttnNorm), Op::Matmul { proj: Proj::Qkv, weights: arch::QKV_SPLIT }];
            if self.qk_norm {
                ops.push(Op::HeadNorm { q: Role::AttnQNorm, k: Role::AttnKNorm });
            }
            ops.extend([
                Op::Rope(rope),
                Op::Attention(Attend { window: self.layer_window(l) }),
                Op::Matmul { proj: Proj::Out, weights: &[Role::AttnOutput] },
                Op::Residual { post_norm: self.post_norms.then_some(Role::PostAttnNorm) },
                Op::Norm(Role::FfnNorm),
                Op::Matmul { proj: Proj::GateUp, weights: arch::GATE_UP_SPLIT },
                Op::Glu(self.activation),
                Op::Matmul { proj: Proj::Down, weights: &[Role::FfnDown] },
                Op::Residual { post_norm: self.post_norms.then_some(Role::PostFfnNorm) },
            ]);
            ops
        };
        Plan { embedding_scale: self.embedding_scale, rms_eps: self.rms_eps, layers: (0..self.n_layers).map(layer).collect(), output_norm: Role::OutputNorm }
    }
}

impl HyperParams {
    /// The hyper-parameters in `gguf`'s metadata (under the architecture's prefix) and the
    /// vocabulary from its embedding's dims.
    fn from_gguf(gguf: &Gguf<'_>, description: &Description) -> Result<HyperParams, ModelError> {
        let key = |k: &str| format!("{}.{k}", description.name);
        let optional_u32 = |k: &str| -> Result<Option<u32>, ModelError> {
            Ok(match gguf.get(&key(k)) {
                Some(_) => Some(gguf.get_u32(&key(k))?),
                None => None,
            })
        };
        let n_layers = gguf.get_u32(&key("block_count"))?;
        let hidden = gguf.get_u32(&key("embedding_length"))?;
        let ffn = gguf.get_u32(&key("feed_forward_length"))?;
        let n_heads = gguf.get_u32(&key("attention.head_count"))?;
        let n_kv_heads = optional_u32("attention.head_count_kv")?.unwrap_or(n_heads);
        let context_length = gguf.get_u32(&key("context_length"))?;
        let rope_base = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let rms_eps = gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let (head_dim, value_dim, rope_dims) =
            (optional_u32("attention.key_length")?, optional_u32("attention.value_length")?, optional_u32("rope.dimension_count")?);
        let embd_name = Role::TokenEmbd.name(None);
        let embd = gguf.tensor(&embd_name).ok_or_else(|| ModelError::Format(format!("the file has no {embd_name} tensor")))?;
        if embd.dims.len() != 2 || embd.dims[0] != hidden as u64 {
            return Err(ModelError::Format(format!("{embd_name} has dims {:?}, expected [{hidden}, vocab]", embd.dims)));
        }
        let vocab = u32::try_from(embd.dims[1]).map_err(|_| ModelError::Format("vocabulary too large".into()))?;
        let sliding_window = match description.window {
            Some(_) => optional_u32("attention.sliding_window")?,
            None => None,
        };
        Ok(HyperParams {
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            value_dim,
            rope_dims,
            vocab,
            context_length,
            rope_base,
            rms_eps,
            sliding_window,
        })
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
