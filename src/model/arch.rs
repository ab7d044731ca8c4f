//! The architectures pagedlm runs, each one description: the metadata keys it reads beyond the
//! common ones, the features of its blocks ([`Description`]), and from those, for a model's
//! shape, its **tensor table** ([`TensorTable`]: every GGUF tensor by name, dims, optional or
//! not) and its **layer plan** ([`Plan`]: the ordered ops of each block and of the head).
//!
//! Everything else reads these: the loaders (the WebGPU backend's weights, the CPU backend's,
//! the synthetic writer and the float64 oracle's names) find tensors in the table and nowhere
//! else (no GGUF tensor name is written anywhere else in `src/`); the GPU graph and the CPU
//! forward pass interpret the plan op by op (the GPU fusing consecutive ops where its kernels
//! can). A new architecture is a [`Description`] here plus its tests; a new kind of op is the
//! only thing that touches the backends.
//!
//! Fused or split: a projection names the tensors whose rows it stacks (q, k and v, or gate and
//! up, as separate tensors); an architecture whose file holds them fused in one tensor names
//! that tensor's role instead, with the fused dims.

use std::borrow::Cow;

use crate::gguf::{GgmlType, Gguf, TensorInfo};

use super::ModelError;

/// The architectures pagedlm runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Pre-norm blocks, SwiGLU, NORM RoPE pairing (SmolLM2, Llama).
    Llama,
    /// Gemma 3: per-head q/k RMSNorm, norms after attention and after the FFN, GeGLU (tanh),
    /// the embedding scaled by √hidden, NEOX RoPE pairing, five local (sliding-window) layers of
    /// every six with their own RoPE base.
    Gemma3,
    /// Qwen2 / Qwen2.5 (and DeepSeek-R1-Distill-Qwen): llama's blocks with q/k/v biases, NEOX RoPE.
    Qwen2,
    /// Qwen3: llama's blocks with per-head q/k RMSNorm, NEOX RoPE, no biases.
    Qwen3,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: fused q|k|v and gate|up tensors, partial rotary (NEOX),
    /// LongRoPE frequency factors with an attention factor on cos/sin.
    Phi3,
    /// Gemma 2: Gemma's blocks without q/k norms, attention-logit and final-logit soft-capping,
    /// every other layer local (sliding window) at the same RoPE base.
    Gemma2,
    /// SmolLM3: llama's blocks with every fourth layer without RoPE (NoPE).
    Smollm3,
}

/// Which two dimensions of a head rotate together: a property of how the file's q/k weights
/// were converted (`ModelConfig::rope_pairing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RopePairing {
    /// `(x[2i], x[2i+1])`: llama's GGUF files.
    Norm,
    /// `(x[i], x[i + head_dim/2])`: Gemma's (and GPT-NeoX's).
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
            Activation::GeluTanh => 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh()),
        }
    }
}

/// What an architecture is: its name in the file, the metadata keys it reads beyond
/// [`COMMON_KEYS`], and the features of its blocks. llama.cpp's `src/llama-arch.cpp` and
/// `src/llama-model.cpp` are the reference for each.
#[derive(Clone, Copy, Debug)]
pub struct Description {
    pub architecture: Architecture,
    /// `general.architecture`, and the prefix of its metadata keys.
    pub name: &'static str,
    /// Keys under the prefix it reads beyond [`COMMON_KEYS`]; any other key names a feature
    /// pagedlm does not implement and the file is refused with that key's name.
    pub keys: &'static [&'static str],
    pub rope_pairing: RopePairing,
    /// The FFN gate's activation.
    pub activation: Activation,
    /// The embedding rows are multiplied by √hidden.
    pub scaled_embedding: bool,
    /// Per-head RMSNorm of q and k before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before each residual add.
    pub post_norms: bool,
    /// Sliding-window attention in some layers (the window from `attention.sliding_window`).
    pub window: Option<WindowLayers>,
    /// Biases on q, k and v (`attn_q.bias` ...).
    pub qkv_bias: bool,
    /// q|k|v in one `attn_qkv` tensor and gate|up in one `ffn_up` tensor, as the file holds them.
    pub fused: bool,
    /// The RoPE frequency-factor tensors the file may hold.
    pub rope_factors: RopeFactors,
    /// Layer l has no RoPE (NoPE) iff (l + 1) % n == 0 (llama.cpp hard-codes SmolLM3's 4; no key
    /// says it).
    pub nope_every: Option<u32>,
    /// Soft-capping of the attention logits and of the final logits
    /// (`attn_logit_softcapping`, `final_logit_softcapping`).
    pub softcap: bool,
    /// The file's sliding window is read and ignored, as llama.cpp does (phi3's).
    pub ignores_window: bool,
    /// A model of this architecture pagedlm cannot run as it computes it: the reason.
    pub refuse: fn(&Dims) -> Option<String>,
}

/// Which layers attend through the sliding window, and their RoPE base.
#[derive(Clone, Copy, Debug)]
pub struct WindowLayers {
    /// Layer l is global iff l % pattern == pattern - 1; the others are local.
    pub pattern: u32,
    /// The RoPE base of the local layers, whatever `rope.freq_base` says; `None`: that base.
    pub local_rope_base: Option<f32>,
}

/// The RoPE frequency factors an architecture's files may carry: each pair's frequency is divided
/// by its factor (llama.cpp's `ggml_rope_ext` with `freq_factors`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    None,
    /// `rope_freqs.weight` (Llama 3.x), optional.
    Freqs,
    /// LongRoPE: `rope_factors_short.weight` while the context is within
    /// `rope.scaling.original_context_length`, `rope_factors_long.weight` past it (Phi-3.5,
    /// Phi-4-mini), and `rope.scaling.attn_factor` on cos/sin.
    LongShort,
}

/// The `{arch}.` metadata keys every architecture reads.
pub const COMMON_KEYS: &[&str] = &[
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

/// A llama block: the base every description below changes.
const LLAMA: Description = Description {
    architecture: Architecture::Llama,
    name: "llama",
    keys: &[],
    rope_pairing: RopePairing::Norm,
    activation: Activation::Silu,
    scaled_embedding: false,
    qk_norm: false,
    post_norms: false,
    window: None,
    qkv_bias: false,
    fused: false,
    rope_factors: RopeFactors::None,
    nope_every: None,
    softcap: false,
    ignores_window: false,
    refuse: |_| None,
};

/// Every architecture pagedlm runs (llama.cpp's `src/models/*.cpp` of each name).
pub const DESCRIPTIONS: &[Description] = &[
    // Llama 3.x files may carry `rope_freqs.weight`.
    Description { rope_factors: RopeFactors::Freqs, ..LLAMA },
    // llama.cpp's `gemma3`: every sixth layer global, local layers at RoPE base 10,000.
    Description {
        architecture: Architecture::Gemma3,
        name: "gemma3",
        keys: &["attention.sliding_window"],
        rope_pairing: RopePairing::Neox,
        activation: Activation::GeluTanh,
        scaled_embedding: true,
        qk_norm: true,
        post_norms: true,
        window: Some(WindowLayers { pattern: 6, local_rope_base: Some(10_000.0) }),
        // llama.cpp scales Gemma 3 27B's queries by 1/√(hidden / n_heads), not 1/√head_dim.
        refuse: |d| (d.n_layers == 62).then(|| "Gemma 3 27B's attention scale".into()),
        ..LLAMA
    },
    Description { architecture: Architecture::Qwen2, name: "qwen2", rope_pairing: RopePairing::Neox, qkv_bias: true, ..LLAMA },
    Description { architecture: Architecture::Qwen3, name: "qwen3", rope_pairing: RopePairing::Neox, qk_norm: true, ..LLAMA },
    // llama.cpp disables phi3's sliding window (the key is read and ignored).
    Description {
        architecture: Architecture::Phi3,
        name: "phi3",
        keys: &["attention.sliding_window", "rope.scaling.original_context_length", "rope.scaling.attn_factor"],
        rope_pairing: RopePairing::Neox,
        fused: true,
        rope_factors: RopeFactors::LongShort,
        ignores_window: true,
        ..LLAMA
    },
    // Every other layer local (even layers), at the global RoPE base.
    Description {
        architecture: Architecture::Gemma2,
        name: "gemma2",
        keys: &["attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"],
        rope_pairing: RopePairing::Neox,
        activation: Activation::GeluTanh,
        scaled_embedding: true,
        post_norms: true,
        window: Some(WindowLayers { pattern: 2, local_rope_base: None }),
        softcap: true,
        // llama.cpp scales Gemma 2 27B's queries by 1/√(hidden / n_heads), not 1/√key_length.
        refuse: |d| (d.n_layers == 46).then(|| "Gemma 2 27B's attention scale".into()),
        ..LLAMA
    },
    Description { architecture: Architecture::Smollm3, name: "smollm3", nope_every: Some(4), ..LLAMA },
];

impl Architecture {
    /// The architecture whose file name (`general.architecture`) is `name`.
    pub fn named(name: &str) -> Option<Architecture> {
        DESCRIPTIONS.iter().find(|d| d.name == name).map(|d| d.architecture)
    }

    pub fn description(self) -> &'static Description {
        DESCRIPTIONS.iter().find(|d| d.architecture == self).expect("every architecture has a description")
    }

    /// The names of every architecture pagedlm runs, for a message: "llama and gemma3".
    pub fn names() -> String {
        let names: Vec<&str> = DESCRIPTIONS.iter().map(|d| d.name).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

impl Description {
    /// Whether it reads the `{arch}.` metadata key `key` (the part after the prefix).
    pub fn knows_key(&self, key: &str) -> bool {
        COMMON_KEYS.contains(&key) || self.keys.contains(&key)
    }
}

/// What a tensor is for: the key the loaders and the backends find it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `[hidden, vocab]`: the embedding table, and the output projection when the file has none.
    TokenEmbd,
    /// `[hidden, vocab]`, absent when tied to the embedding.
    Output,
    OutputNorm,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    /// `[head_dim]`: the per-head norm of q.
    AttnQNorm,
    AttnKNorm,
    AttnOutput,
    /// The norm of the attention output before its residual add.
    PostAttnNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    /// The norm of the FFN output before its residual add.
    PostFfnNorm,
    /// q|k|v in one tensor (phi3).
    AttnQkv,
    /// `[q_width]`, `[kv_width]`, `[kv_width]`: the biases of q, k and v (qwen2).
    AttnQBias,
    AttnKBias,
    AttnVBias,
    /// `[rope_dims / 2]`: RoPE frequency factors (Llama 3.x), the model's own.
    RopeFreqs,
    /// `[rope_dims / 2]`: LongRoPE's factors within and past the original context (phi3).
    RopeFactorsShort,
    RopeFactorsLong,
}

impl Role {
    /// The tensor's GGUF name: `blk.{layer}.{stem}.weight` (`.bias`) for a layer's,
    /// `{stem}.weight` for the model's own (llama.cpp's `LLM_TENSOR_NAMES`).
    pub fn name(self, layer: Option<u32>) -> String {
        let stem = match self {
            Role::TokenEmbd => "token_embd",
            Role::Output => "output",
            Role::OutputNorm => "output_norm",
            Role::AttnNorm => "attn_norm",
            Role::AttnQ => "attn_q",
            Role::AttnK => "attn_k",
            Role::AttnV => "attn_v",
            Role::AttnQNorm => "attn_q_norm",
            Role::AttnKNorm => "attn_k_norm",
            Role::AttnOutput => "attn_output",
            Role::PostAttnNorm => "post_attention_norm",
            Role::FfnNorm => "ffn_norm",
            Role::FfnGate => "ffn_gate",
            Role::FfnUp => "ffn_up",
            Role::FfnDown => "ffn_down",
            Role::PostFfnNorm => "post_ffw_norm",
            Role::AttnQkv => "attn_qkv",
            Role::AttnQBias => "attn_q",
            Role::AttnKBias => "attn_k",
            Role::AttnVBias => "attn_v",
            Role::RopeFreqs => "rope_freqs",
            Role::RopeFactorsShort => "rope_factors_short",
            Role::RopeFactorsLong => "rope_factors_long",
        };
        let kind = match self {
            Role::AttnQBias | Role::AttnKBias | Role::AttnVBias => "bias",
            _ => "weight",
        };
        match layer {
            Some(l) => format!("blk.{l}.{stem}.{kind}"),
            None => format!("{stem}.{kind}"),
        }
    }
}

/// The sizes a tensor table is built from: a model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    pub n_layers: u32,
    pub hidden: u32,
    pub ffn: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub vocab: u32,
    /// Dimensions of a head RoPE rotates (`rope.dimension_count`; the head dim without it).
    pub rope_dims: u32,
}

/// A tensor's shape in GGUF order (`ne0` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `[cols, rows]`: a weight matrix, in any supported type.
    Matrix { cols: u32, rows: u32 },
    /// `[len]`: a norm's weights, F32.
    Vector(u32),
}

impl Shape {
    /// A matrix's (cols, rows); a vector is refused (a plan naming a vector as a matrix: a bug).
    pub fn matrix(self) -> Result<(u32, u32), ModelError> {
        match self {
            Shape::Matrix { cols, rows } => Ok((cols, rows)),
            Shape::Vector(len) => Err(ModelError::Format(format!("a vector of {len} where a matrix belongs"))),
        }
    }

    /// The dims as the file lists them.
    pub fn dims(self) -> Vec<u64> {
        match self {
            Shape::Matrix { cols, rows } => vec![cols as u64, rows as u64],
            Shape::Vector(len) => vec![len as u64],
        }
    }
}

/// One tensor of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub role: Role,
    /// The layer it belongs to; `None` for the model's own (embedding, head).
    pub layer: Option<u32>,
    /// Its GGUF name.
    pub name: String,
    pub shape: Shape,
    /// Files may leave it out (a tied output projection).
    pub optional: bool,
}

/// Every tensor of a model, in the order llama.cpp's converter writes them (the order the
/// synthetic writer uses).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorTable {
    pub tensors: Vec<TensorSpec>,
}

impl TensorTable {
    /// The tensor `role` of `layer` (`None`: the model's own), if the architecture has one.
    pub fn get(&self, layer: Option<u32>, role: Role) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.layer == layer && t.role == role)
    }

    /// The tensor `role` of `layer`, which the plan asks for: a table without it is a bug in a
    /// description, refused as such.
    pub fn spec(&self, layer: Option<u32>, role: Role) -> Result<&TensorSpec, ModelError> {
        self.get(layer, role).ok_or_else(|| ModelError::Format(format!("the description has no {} tensor", role.name(layer))))
    }
}

impl TensorSpec {
    /// Whether the file holds this tensor (an optional one may be left out).
    pub fn present_in(&self, gguf: &Gguf<'_>) -> bool {
        gguf.tensor(&self.name).is_some()
    }

    /// This tensor's header entry in `gguf`, checked against the table: present, of a type
    /// pagedlm computes with (F32 for a vector), with the table's dims.
    pub fn check<'g>(&self, gguf: &'g Gguf<'_>) -> Result<&'g TensorInfo, ModelError> {
        let allowed: &[GgmlType] = match self.shape {
            Shape::Vector(_) => &[GgmlType::F32],
            Shape::Matrix { .. } => &GgmlType::SUPPORTED,
        };
        let info = gguf.require_tensor(&self.name, allowed)?;
        let dims = self.shape.dims();
        if info.dims != dims {
            return Err(ModelError::Format(format!("{} has dims {:?}, expected {dims:?}", self.name, info.dims)));
        }
        Ok(info)
    }

    /// This tensor's type and bytes in `gguf` ([`TensorSpec::check`]ed; read from the file, or
    /// borrowed where it is in memory).
    pub fn read<'a>(&self, gguf: &Gguf<'a>) -> Result<(GgmlType, Cow<'a, [u8]>), ModelError> {
        let info = self.check(gguf)?;
        Ok((info.ggml_type, gguf.read_tensor(info)?))
    }
}

/// q, k and v as separate tensors, stacked q|k|v.
pub const QKV_SPLIT: &[Role] = &[Role::AttnQ, Role::AttnK, Role::AttnV];
/// Gate and up as separate tensors, stacked gate|up.
pub const GATE_UP_SPLIT: &[Role] = &[Role::FfnGate, Role::FfnUp];
/// q|k|v as the file holds them fused.
pub const QKV_FUSED: &[Role] = &[Role::AttnQkv];
/// gate|up as the file holds them fused (in `ffn_up`, gate rows first).
pub const GATE_UP_FUSED: &[Role] = &[Role::FfnUp];
/// The biases of q, k and v, stacked q|k|v.
pub const QKV_BIAS: &[Role] = &[Role::AttnQBias, Role::AttnKBias, Role::AttnVBias];

/// The projections of a block, by what they read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    /// h → the q, k and v heads of each row.
    Qkv,
    /// The attention output → the residual's delta.
    Out,
    /// h → the gate and up values of each row.
    GateUp,
    /// The gated activation → the residual's delta.
    Down,
}

/// One op of a block, in order. Each works on the rows of a step: `x` the residual stream, `h`
/// a normed copy, the q/k/v heads, the attention output, the FFN's gate/up values and its
/// activation, and the delta a residual adds.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `h = rms_norm(x) · weight`.
    Norm(Role),
    /// The projection `proj` of its input by the matrices `weights`, their rows stacked in order.
    Matmul { proj: Proj, weights: &'static [Role] },
    /// Per-head RMSNorm of q and of k, with the `[head_dim]` weights `q` and `k`.
    HeadNorm { q: Role, k: Role },
    /// Rotary embedding of the q and k heads at each row's absolute position.
    Rope(Rope),
    /// The step's K/V written into the layer's cache, then each row's q attending over the
    /// layer's keys up to its position.
    Attention(Attend),
    /// `x += delta`, through the norm `post_norm` first when there is one.
    Residual { post_norm: Option<Role> },
    /// The FFN's activation: `act(gate) ⊙ up`.
    Glu(Activation),
    /// The projection `proj`'s output plus the `[len]` vectors `biases`, stacked in order, on
    /// every row.
    Bias { proj: Proj, biases: &'static [Role] },
}

/// A layer's rotary embedding: pair i of the first `dims` dimensions of each head (paired within
/// them) turns by pos · base^(-2i/dims) / factor_i; the other dimensions stay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The frequency base.
    pub base: f32,
    pub pairing: RopePairing,
    /// Dimensions rotated at the start of each head (the head dim: every dimension).
    pub dims: u32,
    /// Each pair's frequency is divided by `ModelConfig::rope_factors`' entry.
    pub factors: bool,
    /// cos and sin multiplied by this (LongRoPE's attention factor; 1 otherwise).
    pub scale: f32,
}

/// A layer's attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attend {
    /// Attend to the last `window` positions only (a local layer); `None`: every position.
    pub window: Option<u32>,
    /// Scores (q·k/√head_dim) soft-capped to `c · tanh(s / c)` before the softmax.
    pub softcap: Option<f32>,
}

/// How a model computes: the embedding's scale, each block's ops, the head.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// `x = embed(ids) · embedding_scale`.
    pub embedding_scale: f32,
    /// The ε of every RMSNorm.
    pub rms_eps: f32,
    /// Each layer's ops, in order.
    pub layers: Vec<Vec<Op>>,
    /// The head: `logits = rms_norm(x) · output_norm · Woutᵀ` (the embedding when the file has no
    /// output projection).
    pub output_norm: Role,
    /// The logits soft-capped to `c · tanh(l / c)`.
    pub final_softcap: Option<f32>,
}

impl Description {
    /// The tensors of a model of this architecture with `dims`.
    pub fn tensors(&self, d: &Dims) -> TensorTable {
        let (q_width, kv_width) = (d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim);
        let matrix = |cols, rows| Shape::Matrix { cols, rows };
        let spec = |layer, role, shape| TensorSpec { role, layer, name: role.name(layer), shape, optional: false };
        let mut tensors = vec![spec(None, Role::TokenEmbd, matrix(d.hidden, d.vocab))];
        let factors = match self.rope_factors {
            RopeFactors::None => &[][..],
            RopeFactors::Freqs => &[Role::RopeFreqs][..],
            RopeFactors::LongShort => &[Role::RopeFactorsLong, Role::RopeFactorsShort][..],
        };
        // llama.cpp's converters write the factors after the embedding.
        tensors.extend(factors.iter().map(|&role| TensorSpec { optional: true, ..spec(None, role, Shape::Vector(d.rope_dims / 2)) }));
        for l in (0..d.n_layers).map(Some) {
            tensors.push(spec(l, Role::AttnNorm, Shape::Vector(d.hidden)));
            if self.fused {
                tensors.extend([
                    spec(l, Role::FfnDown, matrix(d.ffn, d.hidden)),
                    spec(l, Role::FfnUp, matrix(d.hidden, 2 * d.ffn)),
                    spec(l, Role::FfnNorm, Shape::Vector(d.hidden)),
                    spec(l, Role::AttnOutput, matrix(q_width, d.hidden)),
                    spec(l, Role::AttnQkv, matrix(d.hidden, q_width + 2 * kv_width)),
                ]);
            } else {
                tensors.extend([
                    spec(l, Role::FfnDown, matrix(d.ffn, d.hidden)),
                    spec(l, Role::FfnGate, matrix(d.hidden, d.ffn)),
                    spec(l, Role::FfnUp, matrix(d.hidden, d.ffn)),
                    spec(l, Role::FfnNorm, Shape::Vector(d.hidden)),
                    spec(l, Role::AttnK, matrix(d.hidden, kv_width)),
                    spec(l, Role::AttnOutput, matrix(q_width, d.hidden)),
                    spec(l, Role::AttnQ, matrix(d.hidden, q_width)),
                    spec(l, Role::AttnV, matrix(d.hidden, kv_width)),
                ]);
            }
            if self.qkv_bias {
                tensors.extend([
                    spec(l, Role::AttnQBias, Shape::Vector(q_width)),
                    spec(l, Role::AttnKBias, Shape::Vector(kv_width)),
                    spec(l, Role::AttnVBias, Shape::Vector(kv_width)),
                ]);
            }
            if self.qk_norm {
                tensors.extend([spec(l, Role::AttnQNorm, Shape::Vector(d.head_dim)), spec(l, Role::AttnKNorm, Shape::Vector(d.head_dim))]);
            }
            if self.post_norms {
                tensors.extend([spec(l, Role::PostAttnNorm, Shape::Vector(d.hidden)), spec(l, Role::PostFfnNorm, Shape::Vector(d.hidden))]);
            }
        }
        tensors.push(spec(None, Role::OutputNorm, Shape::Vector(d.hidden)));
        tensors.push(TensorSpec { optional: true, ..spec(None, Role::Output, matrix(d.hidden, d.vocab)) });
        TensorTable { tensors }
    }
}
