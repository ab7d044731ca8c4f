//! Weights uploaded to the GPU once, kept in their quantized GGUF formats. q|k|v and gate|up are
//! stacked into one matrix each, so a layer runs 4 matmuls instead of 7.

use crate::gguf::{GgmlType, Gguf};
use crate::gpu::ops::matmul::{GgmlKind, QuantMatrix};
use crate::gpu::Context;

use super::{ModelConfig, ModelError};

const LINEAR_TYPES: &[GgmlType] = &[GgmlType::Q4_1, GgmlType::Q8_0];

pub struct LayerWeights {
    /// [hidden] f32
    pub attn_norm: wgpu::Buffer,
    /// [(n_heads + 2 n_kv_heads) · head_dim, hidden]: q, then k, then v.
    pub wqkv: QuantMatrix,
    /// [hidden, n_heads · head_dim]
    pub wo: QuantMatrix,
    /// [hidden] f32
    pub ffn_norm: wgpu::Buffer,
    /// [2 · ffn, hidden]: gate, then up.
    pub w_gate_up: QuantMatrix,
    /// [hidden, ffn]
    pub w_down: QuantMatrix,
}

pub struct Weights {
    /// [vocab, hidden]: the embedding table, and the output projection when the file has no output.weight.
    pub token_embd: QuantMatrix,
    /// [vocab, hidden] when the model has an untied output projection.
    pub output: Option<QuantMatrix>,
    /// [hidden] f32
    pub output_norm: wgpu::Buffer,
    pub layers: Vec<LayerWeights>,
}

fn kind(t: GgmlType, name: &str) -> Result<GgmlKind, ModelError> {
    match t {
        GgmlType::Q4_1 => Ok(GgmlKind::Q4_1),
        GgmlType::Q8_0 => Ok(GgmlKind::Q8_0),
        other => Err(ModelError::Unsupported(format!("tensor {name} of type {}", other.name()))),
    }
}

/// A matrix tensor: its bytes, its kind and its (rows, cols) after checking the dims.
fn matrix<'a>(gguf: &Gguf<'a>, name: &str, cols: u32, rows: u32) -> Result<(&'a [u8], GgmlKind), ModelError> {
    let (info, data) = gguf.require_tensor(name, LINEAR_TYPES)?;
    if info.dims.as_slice() != [cols as u64, rows as u64] {
        return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{cols}, {rows}]", info.dims)));
    }
    Ok((data, kind(info.ggml_type, name)?))
}

fn norm(ctx: &Context, gguf: &Gguf<'_>, name: &str, dim: u32) -> Result<wgpu::Buffer, ModelError> {
    let (info, data) = gguf.require_tensor(name, &[GgmlType::F32])?;
    if info.dims.as_slice() != [dim as u64] {
        return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{dim}]", info.dims)));
    }
    Ok(ctx.storage_init(name, data))
}

fn stacked(
    ctx: &Context,
    gguf: &Gguf<'_>,
    label: &str,
    parts: &[(String, u32)],
    cols: u32,
) -> Result<QuantMatrix, ModelError> {
    let mut raw = Vec::with_capacity(parts.len());
    let mut first_kind = None;
    for (name, rows) in parts {
        let (data, k) = matrix(gguf, name, cols, *rows)?;
        if *first_kind.get_or_insert(k) != k {
            return Err(ModelError::Unsupported(format!("{label}: parts with different quantization types")));
        }
        raw.push((data, *rows));
    }
    Ok(QuantMatrix::upload_stacked(ctx, label, first_kind.unwrap_or(GgmlKind::Q4_1), &raw, cols)?)
}

impl Weights {
    pub fn upload(ctx: &Context, gguf: &Gguf<'_>, cfg: &ModelConfig) -> Result<Weights, ModelError> {
        let (embd, embd_kind) = matrix(gguf, "token_embd.weight", cfg.hidden, cfg.vocab)?;
        let token_embd = QuantMatrix::upload(ctx, "token_embd", embd_kind, embd, cfg.vocab, cfg.hidden)?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => {
                let (out, out_kind) = matrix(gguf, "output.weight", cfg.hidden, cfg.vocab)?;
                Some(QuantMatrix::upload(ctx, "output", out_kind, out, cfg.vocab, cfg.hidden)?)
            }
            None => None,
        };
        let output_norm = norm(ctx, gguf, "output_norm.weight", cfg.hidden)?;
        let q_width = cfg.q_width();
        let kv_width = cfg.n_kv_heads * cfg.head_dim;
        let mut layers = Vec::with_capacity(cfg.n_layers as usize);
        for l in 0..cfg.n_layers {
            let p = |s: &str| format!("blk.{l}.{s}");
            layers.push(LayerWeights {
                attn_norm: norm(ctx, gguf, &p("attn_norm.weight"), cfg.hidden)?,
                wqkv: stacked(
                    ctx,
                    gguf,
                    &p("attn_qkv"),
                    &[(p("attn_q.weight"), q_width), (p("attn_k.weight"), kv_width), (p("attn_v.weight"), kv_width)],
                    cfg.hidden,
                )?,
                wo: {
                    let (data, k) = matrix(gguf, &p("attn_output.weight"), q_width, cfg.hidden)?;
                    QuantMatrix::upload(ctx, &p("attn_output"), k, data, cfg.hidden, q_width)?
                },
                ffn_norm: norm(ctx, gguf, &p("ffn_norm.weight"), cfg.hidden)?,
                w_gate_up: stacked(
                    ctx,
                    gguf,
                    &p("ffn_gate_up"),
                    &[(p("ffn_gate.weight"), cfg.ffn), (p("ffn_up.weight"), cfg.ffn)],
                    cfg.hidden,
                )?,
                w_down: {
                    let (data, k) = matrix(gguf, &p("ffn_down.weight"), cfg.ffn, cfg.hidden)?;
                    QuantMatrix::upload(ctx, &p("ffn_down"), k, data, cfg.hidden, cfg.ffn)?
                },
            });
        }
        Ok(Weights { token_embd, output, output_norm, layers })
    }

    /// The output projection (the tied embedding when the file has none of its own).
    pub fn lm_head(&self) -> &QuantMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// GPU bytes held by the weights.
    pub fn bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes() + l.attn_norm.size() + l.ffn_norm.size())
            .sum();
        layers + self.token_embd.bytes() + self.output.as_ref().map_or(0, |o| o.bytes()) + self.output_norm.size()
    }
}
