//! Weights uploaded to the GPU once, kept in their GGUF formats (any of [`GgmlType::SUPPORTED`],
//! in any mix), loaded as the model's layer plan asks for them and found in its tensor table.
//! A projection's tensors are stacked into one matrix (q|k|v, gate|up), so a layer runs 4
//! matmuls instead of 7 (one more dispatch per extra type when the parts of a stack differ in
//! type); gate and up are interleaved for the gated epilogue when they share a type.

use crate::error::EngineError;
use crate::gguf::{GgmlType, Gguf};
use crate::gpu::ops::matmul::QuantMatrix;
use crate::gpu::Context;
use crate::model::{ModelConfig, ModelError, Op, Proj, Role, TensorTable};

/// One layer's weights, by what the plan's ops name them.
#[derive(Default)]
pub struct LayerWeights {
    /// Each norm's weights, `[len]` f32: the pre-norms, the post-norms, and under
    /// [`Role::AttnQNorm`] the per-head norms of q and k in one buffer, `[2, head_dim]`, q's
    /// first (the layout `qkv_heads` binds, [`crate::gpu::ops::qkv_heads::QkNorm`]).
    norms: Vec<(Role, wgpu::Buffer)>,
    /// Each projection's matrix, its tensors' rows stacked in the plan's order (gate and up
    /// interleaved instead where [`QuantMatrix::upload_gated`] applies: `gated`).
    matrices: Vec<(Proj, QuantMatrix)>,
}

impl LayerWeights {
    /// The norm weights the plan names `role`.
    pub fn norm(&self, role: Role) -> Result<&wgpu::Buffer, EngineError> {
        self.norms.iter().find(|(r, _)| *r == role).map(|(_, b)| b).ok_or_else(|| missing(format!("{role:?}")))
    }

    /// The matrix of projection `proj`.
    pub fn matrix(&self, proj: Proj) -> Result<&QuantMatrix, EngineError> {
        self.matrices.iter().find(|(p, _)| *p == proj).map(|(_, m)| m).ok_or_else(|| missing(format!("the {proj:?} projection")))
    }

    fn bytes(&self) -> u64 {
        self.norms.iter().map(|(_, b)| b.size()).sum::<u64>() + self.matrices.iter().map(|(_, m)| m.bytes()).sum::<u64>()
    }
}

/// A weight the graph asks for and the plan did not load: a bug.
fn missing(what: String) -> EngineError {
    ModelError::Format(format!("the layer plan loaded no weights for {what}")).into()
}

pub struct Weights {
    /// `[vocab, hidden]`: the embedding table, and the output projection when the file has none.
    pub token_embd: QuantMatrix,
    /// `[vocab, hidden]` when the model has an untied output projection.
    pub output: Option<QuantMatrix>,
    /// `[hidden]` f32
    pub output_norm: wgpu::Buffer,
    pub layers: Vec<LayerWeights>,
}

/// A matrix tensor's type and bytes, after checking its columns are whole blocks of at least 32
/// values (the kernels read activations per 32-value chunk).
fn matrix<'a>(gguf: &Gguf<'a>, table: &TensorTable, (layer, role): (Option<u32>, Role)) -> Result<(GgmlType, &'a [u8], u32), EngineError> {
    let spec = table.spec(layer, role)?;
    let (ggml_type, data) = spec.read(gguf)?;
    let (cols, rows) = spec.shape.matrix()?;
    let (block, _) = ggml_type.block_size().unwrap_or((1, 1));
    if cols as u64 % block.max(32) != 0 {
        return Err(ModelError::Format(format!("{}: {cols} columns are not whole {} blocks", spec.name, ggml_type.name())).into());
    }
    Ok((ggml_type, data, rows))
}

/// The norm weights `roles` of `layer` ([len] f32 each) one after the other in one buffer.
fn norms(ctx: &Context, gguf: &Gguf<'_>, table: &TensorTable, layer: Option<u32>, roles: &[Role]) -> Result<wgpu::Buffer, EngineError> {
    let mut bytes = Vec::new();
    let mut label = Vec::new();
    for &role in roles {
        let spec = table.spec(layer, role)?;
        bytes.extend_from_slice(spec.read(gguf)?.1);
        label.push(spec.name.as_str());
    }
    Ok(ctx.storage_init(&label.join("|"), &bytes))
}

/// The matrix of a projection over `parts` of `layer`: their rows stacked, or gate and up
/// interleaved when they can be.
fn projection(ctx: &Context, gguf: &Gguf<'_>, table: &TensorTable, layer: Option<u32>, (proj, parts): (Proj, &[Role])) -> Result<QuantMatrix, EngineError> {
    let raw = parts.iter().map(|&role| matrix(gguf, table, (layer, role))).collect::<Result<Vec<_>, _>>()?;
    let label = parts.iter().map(|&role| role.name(layer)).collect::<Vec<_>>().join("|");
    let cols = table.spec(layer, parts[0])?.shape.matrix()?.0;
    // Gate and up as two tensors, or fused in one (gate rows first: its bytes' first half).
    let gate_up = match (proj, raw.as_slice()) {
        (Proj::GateUp, &[(gt, g, ffn), (ut, u, _)]) => Some(((gt, g), (ut, u), ffn)),
        (Proj::GateUp, &[(t, both, rows)]) if rows % 2 == 0 => Some(((t, &both[..both.len() / 2]), (t, &both[both.len() / 2..]), rows / 2)),
        _ => None,
    };
    if let Some((gate, up, ffn)) = gate_up {
        if let Some(m) = QuantMatrix::upload_gated(ctx, &label, gate, up, ffn, cols)? {
            return Ok(m);
        }
    }
    let stack: Vec<(GgmlType, &[u8], u32)> = raw.iter().map(|&(t, data, rows)| (t, data, rows)).collect();
    Ok(QuantMatrix::upload_stacked(ctx, &label, &stack, cols)?)
}

impl Weights {
    /// Uploads the weights `cfg`'s layer plan computes with, as its tensor table finds them in
    /// `gguf`.
    pub fn upload(ctx: &Context, gguf: &Gguf<'_>, cfg: &ModelConfig) -> Result<Weights, EngineError> {
        crate::model::check_types(gguf)?;
        let (table, plan) = (cfg.tensors(), cfg.plan());
        let head = |role| -> Result<QuantMatrix, EngineError> {
            let (ty, data, rows) = matrix(gguf, &table, (None, role))?;
            Ok(QuantMatrix::upload(ctx, &role.name(None), ty, data, rows, cfg.hidden)?)
        };
        let token_embd = head(Role::TokenEmbd)?;
        let output = match table.spec(None, Role::Output)?.present_in(gguf) {
            true => Some(head(Role::Output)?),
            false => None,
        };
        let output_norm = norms(ctx, gguf, &table, None, &[plan.output_norm])?;
        let mut layers = Vec::with_capacity(plan.layers.len());
        for (l, ops) in (0u32..).zip(&plan.layers) {
            let mut lw = LayerWeights::default();
            for op in ops {
                match *op {
                    Op::Norm(role) | Op::Residual { post_norm: Some(role) } => lw.norms.push((role, norms(ctx, gguf, &table, Some(l), &[role])?)),
                    Op::HeadNorm { q, k } => lw.norms.push((q, norms(ctx, gguf, &table, Some(l), &[q, k])?)),
                    Op::Matmul { proj, weights } => lw.matrices.push((proj, projection(ctx, gguf, &table, Some(l), (proj, weights))?)),
                    // Stacked in one buffer, found by the first role.
                    Op::Bias { biases, .. } => lw.norms.push((biases[0], norms(ctx, gguf, &table, Some(l), biases)?)),
                    Op::Rope(_) | Op::Attention(_) | Op::Residual { post_norm: None } | Op::Glu(_) => {}
                }
            }
            layers.push(lw);
        }
        Ok(Weights { token_embd, output, output_norm, layers })
    }

    /// The output projection (the tied embedding when the file has none of its own).
    pub fn lm_head(&self) -> &QuantMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// GPU bytes held by the weights.
    pub fn bytes(&self) -> u64 {
        let layers: u64 = self.layers.iter().map(LayerWeights::bytes).sum();
        layers + self.token_embd.bytes() + self.output.as_ref().map_or(0, |o| o.bytes()) + self.output_norm.size()
    }
}
