//! The model's hyper-parameters, read from GGUF metadata, and the features of its blocks, from
//! its architecture's description ([`super::arch`]). Nothing here is specific to one model:
//! every width, head count and constant comes from the file.

use crate::gguf::{Gguf, MetaValue};

use super::arch::{self, Activation, Architecture, Attend, Description, Dims, Op, Plan, Proj, Role, Rope, RopeFactors, RopePairing, TensorTable};
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
    /// `attn_logit_softcapping` and `final_logit_softcapping` where the architecture reads them.
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// LongRoPE: `rope.scaling.original_context_length` and `rope.scaling.attn_factor`.
    pub rope_original_context: Option<u32>,
    pub rope_attn_factor: Option<f32>,
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
    /// Dimensions of each head RoPE rotates (the head dim, or fewer: partial rotary).
    pub rope_dims: u32,
    /// Layer l has no RoPE iff (l + 1) % n == 0.
    pub nope_every: Option<u32>,
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// q|k|v and gate|up held fused in the file.
    pub fused: bool,
    /// The RoPE frequency factors in use (`[rope_dims / 2]`, each pair's frequency divided by its
    /// factor): Llama 3.x's `rope_freqs`, or LongRoPE's short or long set
    /// ([`ModelConfig::use_context`]).
    #[serde(skip)]
    pub rope_factors: Option<Vec<f32>>,
    /// LongRoPE's factors within and past `rope_original_context`.
    #[serde(skip)]
    pub rope_factor_sets: Option<(Vec<f32>, Vec<f32>)>,
    pub rope_original_context: Option<u32>,
    /// cos and sin of the rotated dimensions multiplied by this (LongRoPE's attention factor).
    pub rope_scale: f32,
    /// Attention scores soft-capped to `c · tanh(s / c)`.
    pub attn_softcap: Option<f32>,
    /// Logits soft-capped to `c · tanh(l / c)`.
    pub final_softcap: Option<f32>,
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

    /// Whether layer `l` applies RoPE (not a NoPE layer).
    pub fn layer_has_rope(&self, l: u32) -> bool {
        self.nope_every.is_none_or(|n| (l + 1) % n != 0)
    }

    /// Picks the LongRoPE factor set for a context of `n_ctx` positions a sequence: the short
    /// set within the original context, the long one past it (llama.cpp decides by the context
    /// it is configured with, as here).
    pub fn use_context(&mut self, n_ctx: u32) {
        if let Some((short, long)) = &self.rope_factor_sets {
            let past = self.rope_original_context.is_some_and(|orig| n_ctx > orig);
            self.rope_factors = Some(if past { long.clone() } else { short.clone() });
            // The long set computes other K/V: another model for the prefix cache and snapshots.
            if past {
                self.fingerprint = self.fingerprint.rotate_left(17) ^ 0x10e6_707e;
            }
        }
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
        let (description, params, name) = ModelConfig::header_parts(gguf)?;
        let mut config = ModelConfig::new(description, params, name, fingerprint(gguf)?)?;
        config.read_tensors(gguf)?;
        Ok(config)
    }

    /// The configuration as far as the file's header gives it (what a memory estimate needs):
    /// no tensor data is read, so the fingerprint is 0 and RoPE factors are absent.
    pub fn from_header(gguf: &Gguf<'_>) -> Result<ModelConfig, ModelError> {
        let (description, params, name) = ModelConfig::header_parts(gguf)?;
        let config = ModelConfig::new(description, params, name, 0)?;
        config.check_tensor_names(gguf)?;
        Ok(config)
    }

    /// The architecture's description, the hyper-parameters and the name the header gives.
    fn header_parts(gguf: &Gguf<'_>) -> Result<(&'static Description, HyperParams, String), ModelError> {
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
        Ok((description, params, name))
    }

    /// Refuses a file holding a tensor the description does not know (never ignored).
    fn check_tensor_names(&self, gguf: &Gguf<'_>) -> Result<(), ModelError> {
        let table = self.tensors();
        match gguf.tensors.iter().find(|t| !table.tensors.iter().any(|s| s.name == t.name)) {
            Some(t) => Err(ModelError::Unsupported(format!("tensor '{}': a {} feature pagedlm does not implement", t.name, self.arch))),
            None => Ok(()),
        }
    }

    /// Refuses a file holding a tensor the description does not know (never ignored), and reads
    /// the RoPE factors, the only tensors the configuration holds.
    fn read_tensors(&mut self, gguf: &Gguf<'_>) -> Result<(), ModelError> {
        self.check_tensor_names(gguf)?;
        let table = self.tensors();
        let factors = |role: Role| -> Result<Option<Vec<f32>>, ModelError> {
            let Some(spec) = table.get(None, role).filter(|s| s.present_in(gguf)) else { return Ok(None) };
            let (_, data) = spec.read(gguf)?;
            let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            match values.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                Some(f) => Err(ModelError::Format(format!("{} holds the frequency factor {f}", spec.name))),
                None => Ok(Some(values)),
            }
        };
        match self.architecture.description().rope_factors {
            RopeFactors::None => {}
            RopeFactors::Freqs => self.rope_factors = factors(Role::RopeFreqs)?,
            RopeFactors::LongShort => match (factors(Role::RopeFactorsShort)?, factors(Role::RopeFactorsLong)?) {
                (Some(short), Some(long)) => {
                    self.rope_factors = Some(short.clone());
                    self.rope_factor_sets = Some((short, long));
                }
                (None, None) => {}
                _ => {
                    let (short, long) = (Role::RopeFactorsShort.name(None), Role::RopeFactorsLong.name(None));
                    return Err(ModelError::Format(format!("a file with one of {short} and {long} needs both")));
                }
            },
        }
        Ok(())
    }

    // Long: every size checked, then every field of the configuration named once.
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
            attn_softcap,
            final_softcap,
            rope_original_context,
            rope_attn_factor,
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
        let rope_dims = rope_dims.unwrap_or(head_dim);
        check_features(description, (head_dim, rope_dims), (attn_softcap, final_softcap))?;
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
            rope_base_local: description.window.and_then(|w| w.local_rope_base).unwrap_or(rope_base),
            rope_pairing: description.rope_pairing,
            rms_eps,
            activation: description.activation,
            embedding_scale: if description.scaled_embedding { (hidden as f32).sqrt() } else { 1.0 },
            qk_norm: description.qk_norm,
            post_norms: description.post_norms,
            sliding_window,
            window_pattern: description.window.map_or(1, |w| w.pattern),
            rope_dims,
            nope_every: description.nope_every,
            qkv_bias: description.qkv_bias,
            fused: description.fused,
            rope_factors: None,
            rope_factor_sets: None,
            rope_original_context,
            rope_scale: rope_attn_factor.unwrap_or(1.0),
            attn_softcap,
            final_softcap,
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
            rope_dims: self.rope_dims,
        }
    }

    /// Every tensor of this model.
    pub fn tensors(&self) -> TensorTable {
        self.architecture.description().tensors(&self.dims())
    }

    /// The ops of this model, layer by layer.
    pub fn plan(&self) -> Plan {
        let (qkv, gate_up) = if self.fused { (arch::QKV_FUSED, arch::GATE_UP_FUSED) } else { (arch::QKV_SPLIT, arch::GATE_UP_SPLIT) };
        let layer = |l: u32| {
            let rope = Rope {
                base: self.layer_rope_base(l),
                pairing: self.rope_pairing,
                dims: self.rope_dims,
                factors: self.rope_factors.is_some(),
                scale: self.rope_scale,
            };
            let mut ops = vec![Op::Norm(Role::AttnNorm), Op::Matmul { proj: Proj::Qkv, weights: qkv }];
            if self.qkv_bias {
                ops.push(Op::Bias { proj: Proj::Qkv, biases: arch::QKV_BIAS });
            }
            if self.qk_norm {
                ops.push(Op::HeadNorm { q: Role::AttnQNorm, k: Role::AttnKNorm });
            }
            if self.layer_has_rope(l) {
                ops.push(Op::Rope(rope));
            }
            ops.extend([
                Op::Attention(Attend { window: self.layer_window(l), softcap: self.attn_softcap }),
                Op::Matmul { proj: Proj::Out, weights: &[Role::AttnOutput] },
                Op::Residual { post_norm: self.post_norms.then_some(Role::PostAttnNorm) },
                Op::Norm(Role::FfnNorm),
                Op::Matmul { proj: Proj::GateUp, weights: gate_up },
                Op::Glu(self.activation),
                Op::Matmul { proj: Proj::Down, weights: &[Role::FfnDown] },
                Op::Residual { post_norm: self.post_norms.then_some(Role::PostFfnNorm) },
            ]);
            ops
        };
        Plan {
            embedding_scale: self.embedding_scale,
            rms_eps: self.rms_eps,
            layers: (0..self.n_layers).map(layer).collect(),
            output_norm: Role::OutputNorm,
            final_softcap: self.final_softcap,
        }
    }
}

/// Refuses RoPE over more dimensions than a head has (or an odd count), partial rotary with
/// llama's pairing (no file has it), and soft-caps that are not positive.
fn check_features(description: &Description, (head_dim, rope_dims): (u32, u32), softcaps: (Option<f32>, Option<f32>)) -> Result<(), ModelError> {
    if rope_dims > head_dim || rope_dims % 2 != 0 {
        return Err(ModelError::Format(format!("RoPE over {rope_dims} dimensions of a head of {head_dim}")));
    }
    if rope_dims != head_dim && description.rope_pairing == RopePairing::Norm {
        return Err(ModelError::Unsupported(format!("partial rotary embedding ({rope_dims} of {head_dim} dimensions) with llama's pairing")));
    }
    for (what, cap) in [("attention", softcaps.0), ("final", softcaps.1)] {
        if let Some(c) = cap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(ModelError::Format(format!("{what} logit soft-capping of {c}")));
        }
    }
    Ok(())
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
        let optional_f32 = |k: &str| -> Result<Option<f32>, ModelError> {
            Ok(match gguf.get(&key(k)) {
                Some(_) if description.knows_key(k) => Some(gguf.get_f32(&key(k))?),
                _ => None,
            })
        };
        let (attn_softcap, final_softcap) = match description.softcap {
            true => (optional_f32("attn_logit_softcapping")?, optional_f32("final_logit_softcapping")?),
            false => (None, None),
        };
        let (rope_original_context, rope_attn_factor) = match description.rope_factors {
            RopeFactors::LongShort => (optional_u32("rope.scaling.original_context_length")?, optional_f32("rope.scaling.attn_factor")?),
            _ => (None, None),
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
            attn_softcap,
            final_softcap,
            rope_original_context,
            rope_attn_factor,
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
fn fingerprint(gguf: &Gguf<'_>) -> Result<u64, ModelError> {
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
        const SAMPLE: u64 = 1024;
        let size = t.size_bytes;
        let samples = match size <= 3 * SAMPLE {
            true => vec![(0, size)],
            false => vec![(0, SAMPLE), (size / 2 - SAMPLE / 2, SAMPLE), (size - SAMPLE, SAMPLE)],
        };
        for (start, len) in samples {
            h.bytes(&gguf.read_range(t, start, len)?);
        }
    }
    Ok(h.0)
}
