//! The CPU backend's weights: the model's tensors copied out of the file once, kept in their
//! GGUF formats, their shapes checked.

use crate::error::EngineError;
use crate::gguf::{GgmlType, Gguf};
use crate::model::{ModelConfig, ModelError};

use super::kernels::QMatrix;

/// One layer's weights, kept in their file's formats.
pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) wq: QMatrix,
    pub(super) wk: QMatrix,
    pub(super) wv: QMatrix,
    /// Gemma 3's per-head norms of q and k.
    pub(super) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(super) wo: QMatrix,
    pub(super) post_attention_norm: Option<Vec<f32>>,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) gate: QMatrix,
    pub(super) up: QMatrix,
    pub(super) down: QMatrix,
    pub(super) post_ffw_norm: Option<Vec<f32>>,
}

/// The model's weights in CPU memory.
pub struct HostModel {
    pub config: ModelConfig,
    /// Whether the matmuls quantize their activations to int8 blocks (as llama.cpp's CPU
    /// kernels do) instead of multiplying them in f32.
    pub int8_activations: bool,
    pub(super) embd: QMatrix,
    pub(super) layers: Vec<Layer>,
    pub(super) output_norm: Vec<f32>,
    /// `None`: the output projection is the embedding (tied weights).
    pub(super) output: Option<QMatrix>,
}

fn matrix(gguf: &Gguf<'_>, name: &str, cols: u32, rows: u32) -> Result<QMatrix, EngineError> {
    let (info, data) = gguf.require_tensor(name, &GgmlType::SUPPORTED)?;
    if info.dims.as_slice() != [cols as u64, rows as u64] {
        return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{cols}, {rows}]", info.dims)).into());
    }
    QMatrix::new(info.ggml_type, rows as usize, cols as usize, data).map_err(|e| ModelError::Format(format!("tensor {name}: {e}")).into())
}

fn vector(gguf: &Gguf<'_>, name: &str, dim: u32) -> Result<Vec<f32>, EngineError> {
    let (info, data) = gguf.require_tensor(name, &[GgmlType::F32])?;
    if info.dims.as_slice() != [dim as u64] {
        return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{dim}]", info.dims)).into());
    }
    Ok(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

impl HostModel {
    /// Copies the model's tensors out of the file (kept quantized) and checks their shapes.
    pub fn load(gguf: &Gguf<'_>, config: &ModelConfig, int8_activations: bool) -> Result<HostModel, EngineError> {
        crate::model::check_types(gguf)?;
        let c = config;
        let (q_width, kv_width) = (c.q_width(), c.n_kv_heads * c.head_dim);
        let layers = (0..c.n_layers)
            .map(|l| {
                let p = |s: &str| format!("blk.{l}.{s}");
                Ok(Layer {
                    attn_norm: vector(gguf, &p("attn_norm.weight"), c.hidden)?,
                    wq: matrix(gguf, &p("attn_q.weight"), c.hidden, q_width)?,
                    wk: matrix(gguf, &p("attn_k.weight"), c.hidden, kv_width)?,
                    wv: matrix(gguf, &p("attn_v.weight"), c.hidden, kv_width)?,
                    qk_norm: match c.qk_norm {
                        true => Some((vector(gguf, &p("attn_q_norm.weight"), c.head_dim)?, vector(gguf, &p("attn_k_norm.weight"), c.head_dim)?)),
                        false => None,
                    },
                    wo: matrix(gguf, &p("attn_output.weight"), q_width, c.hidden)?,
                    post_attention_norm: c.post_norms.then(|| vector(gguf, &p("post_attention_norm.weight"), c.hidden)).transpose()?,
                    ffn_norm: vector(gguf, &p("ffn_norm.weight"), c.hidden)?,
                    gate: matrix(gguf, &p("ffn_gate.weight"), c.hidden, c.ffn)?,
                    up: matrix(gguf, &p("ffn_up.weight"), c.hidden, c.ffn)?,
                    down: matrix(gguf, &p("ffn_down.weight"), c.ffn, c.hidden)?,
                    post_ffw_norm: c.post_norms.then(|| vector(gguf, &p("post_ffw_norm.weight"), c.hidden)).transpose()?,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => Some(matrix(gguf, "output.weight", c.hidden, c.vocab)?),
            None => None,
        };
        Ok(HostModel {
            config: config.clone(),
            int8_activations,
            embd: matrix(gguf, "token_embd.weight", c.hidden, c.vocab)?,
            layers,
            output_norm: vector(gguf, "output_norm.weight", c.hidden)?,
            output,
        })
    }

    /// Bytes of the weights in memory.
    pub fn bytes(&self) -> u64 {
        let v = |x: &Vec<f32>| x.len() as u64 * 4;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down].iter().map(|m| m.bytes()).sum::<u64>()
                    + v(&l.attn_norm)
                    + v(&l.ffn_norm)
                    + l.qk_norm.as_ref().map_or(0, |(a, b)| v(a) + v(b))
                    + l.post_attention_norm.as_ref().map_or(0, v)
                    + l.post_ffw_norm.as_ref().map_or(0, v)
            })
            .sum();
        layers + self.embd.bytes() + self.output.as_ref().map_or(0, QMatrix::bytes) + v(&self.output_norm)
    }
}

