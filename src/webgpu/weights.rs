//! Weights uploaded to the GPU once, kept in their GGUF formats (any of [`GgmlType::SUPPORTED`],
//! in any mix). q|k|v and gate|up are stacked into one matrix each, so a layer runs 4 matmuls
//! instead of 7 (one more dispatch per extra type when the parts of a stack differ in type).

use crate::gguf::{GgmlType, Gguf};
use crate::gpu::ops::matmul::QuantMatrix;
use crate::gpu::Context;

use crate::error::EngineError;
use crate::model::{ModelConfig, ModelError};

pub struct LayerWeights {
    /// [hidden] f32
    pub attn_norm: wgpu::Buffer,
    /// [(n_heads + 2 n_kv_heads) · head_dim, hidden]: q, then k, then v.
    pub wqkv: QuantMatrix,
    /// [hidden, n_heads · head_dim]
    pub wo: QuantMatrix,
    /// [hidden] f32
    pub ffn_norm: wgpu::Buffer,
    /// [2 · ffn, hidden]: gate and up, interleaved for the matmul's gated epilogue
    /// ([`QuantMatrix::upload_gated`]) when they share a type, else gate then up (`gated` false).
    pub w_gate_up: QuantMatrix,
    /// [hidden, ffn]
    pub w_down: QuantMatrix,
    /// With `ModelConfig::qk_norm`: the per-head norms of q and of k in one buffer, [2, head_dim]
    /// f32, q's first (the layout `qkv_heads` binds, [`crate::gpu::ops::qkv_heads::QkNorm`]).
    pub qk_norm: Option<wgpu::Buffer>,
    /// With `ModelConfig::post_norms`: the norms of the attention output and of the FFN output
    /// before their residual adds, [hidden] f32 each.
    pub post_norms: Option<[wgpu::Buffer; 2]>,
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

/// A matrix tensor: its bytes and type, after checking its dims are [cols, rows].
fn matrix<'a>(gguf: &Gguf<'a>, name: &str, cols: u32, rows: u32) -> Result<(&'a [u8], GgmlType), EngineError> {
    let (info, data) = gguf.require_tensor(name, &GgmlType::SUPPORTED)?;
    if info.dims.as_slice() != [cols as u64, rows as u64] {
        return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{cols}, {rows}]", info.dims)).into());
    }
    let (block, _) = info.ggml_type.block_size().unwrap_or((1, 1));
    if cols as u64 % block.max(32) != 0 {
        return Err(ModelError::Format(format!("{name}: {cols} columns are not whole {} blocks", info.ggml_type.name())).into());
    }
    Ok((data, info.ggml_type))
}

fn norm(ctx: &Context, gguf: &Gguf<'_>, name: &str, dim: u32) -> Result<wgpu::Buffer, EngineError> {
    norms(ctx, gguf, name, &[name], dim)
}

/// The norm weights `names` ([dim] f32 each) one after the other in one buffer.
fn norms(ctx: &Context, gguf: &Gguf<'_>, label: &str, names: &[&str], dim: u32) -> Result<wgpu::Buffer, EngineError> {
    let mut bytes = Vec::with_capacity(names.len() * dim as usize * 4);
    for name in names {
        let (info, data) = gguf.require_tensor(name, &[GgmlType::F32])?;
        if info.dims.as_slice() != [dim as u64] {
            return Err(ModelError::Format(format!("{name} has dims {:?}, expected [{dim}]", info.dims)).into());
        }
        bytes.extend_from_slice(data);
    }
    Ok(ctx.storage_init(label, &bytes))
}

/// Layer `l`'s gate and up projections (`p` names its tensors): interleaved when they can be,
/// else stacked.
fn gate_up(ctx: &Context, gguf: &Gguf<'_>, p: &dyn Fn(&str) -> String, cfg: &ModelConfig) -> Result<QuantMatrix, EngineError> {
    let (gate, up) = (p("ffn_gate.weight"), p("ffn_up.weight"));
    let (g, gt) = matrix(gguf, &gate, cfg.hidden, cfg.ffn)?;
    let (u, ut) = matrix(gguf, &up, cfg.hidden, cfg.ffn)?;
    match QuantMatrix::upload_gated(ctx, &p("ffn_gate_up"), (gt, g), (ut, u), cfg.ffn, cfg.hidden)? {
        Some(m) => Ok(m),
        None => stacked(ctx, gguf, &p("ffn_gate_up"), &[(gate, cfg.ffn), (up, cfg.ffn)], cfg.hidden),
    }
}

fn stacked(
    ctx: &Context,
    gguf: &Gguf<'_>,
    label: &str,
    parts: &[(String, u32)],
    cols: u32,
) -> Result<QuantMatrix, EngineError> {
    let mut raw = Vec::with_capacity(parts.len());
    for (name, rows) in parts {
        let (data, t) = matrix(gguf, name, cols, *rows)?;
        raw.push((t, data, *rows));
    }
    Ok(QuantMatrix::upload_stacked(ctx, label, &raw, cols)?)
}

impl Weights {
    pub fn upload(ctx: &Context, gguf: &Gguf<'_>, cfg: &ModelConfig) -> Result<Weights, EngineError> {
        crate::model::check_types(gguf)?;
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
                w_gate_up: gate_up(ctx, gguf, &p, cfg)?,
                w_down: {
                    let (data, k) = matrix(gguf, &p("ffn_down.weight"), cfg.ffn, cfg.hidden)?;
                    QuantMatrix::upload(ctx, &p("ffn_down"), k, data, cfg.hidden, cfg.ffn)?
                },
                qk_norm: match cfg.qk_norm {
                    true => Some(norms(ctx, gguf, &p("attn_qk_norm"), &[&p("attn_q_norm.weight"), &p("attn_k_norm.weight")], cfg.head_dim)?),
                    false => None,
                },
                post_norms: match cfg.post_norms {
                    true => Some([
                        norm(ctx, gguf, &p("post_attention_norm.weight"), cfg.hidden)?,
                        norm(ctx, gguf, &p("post_ffw_norm.weight"), cfg.hidden)?,
                    ]),
                    false => None,
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
            .map(|l| {
                let extra = l.qk_norm.iter().chain(l.post_norms.iter().flatten()).map(|b| b.size()).sum::<u64>();
                l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes() + l.attn_norm.size() + l.ffn_norm.size() + extra
            })
            .sum();
        layers + self.token_embd.bytes() + self.output.as_ref().map_or(0, |o| o.bytes()) + self.output_norm.size()
    }
}
