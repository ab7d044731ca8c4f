//! Weights uploaded to the GPU once, kept in their GGUF formats (any of [`GgmlType::SUPPORTED`],
//! in any mix), loaded as the model's layer plan asks for them and found in its tensor table.
//! A projection's tensors are stacked into one matrix (q|k|v, gate|up), so a layer runs 4
//! matmuls instead of 7 (one more dispatch per extra type when the parts of a stack differ in
//! type); gate and up are interleaved for the gated epilogue when they share a type.

use crate::error::EngineError;
use crate::gguf::{GgmlType, Gguf, TensorInfo};
use crate::gpu::ops::matmul::{interleave_gate_up, max_part_bytes, QuantMatrix, FILL_CHUNK_BYTES};
use crate::gpu::Context;
use crate::model::arch::Shape;
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

/// A matrix tensor's header entry and rows, after checking its columns are whole blocks of at
/// least 32 values (the kernels read activations per 32-value chunk).
fn matrix<'g>(gguf: &'g Gguf<'_>, table: &TensorTable, (layer, role): (Option<u32>, Role)) -> Result<(&'g TensorInfo, u32), EngineError> {
    let spec = table.spec(layer, role)?;
    let info = spec.check(gguf)?;
    let (cols, rows) = spec.shape.matrix()?;
    let (block, _) = info.ggml_type.block_size().unwrap_or((1, 1));
    if cols as u64 % block.max(32) != 0 {
        return Err(ModelError::Format(format!("{}: {cols} columns are not whole {} blocks", spec.name, info.ggml_type.name())).into());
    }
    Ok((info, rows))
}

/// The norm weights `roles` of `layer` ([len] f32 each) one after the other in one buffer.
fn norms(up: &mut Uploader<'_, '_>, table: &TensorTable, layer: Option<u32>, roles: &[Role]) -> Result<wgpu::Buffer, EngineError> {
    let mut bytes = Vec::new();
    let mut label = Vec::new();
    for &role in roles {
        let spec = table.spec(layer, role)?;
        let data = spec.read(up.gguf)?.1;
        up.placed(data.len() as u64);
        bytes.extend_from_slice(&data);
        label.push(spec.name.as_str());
    }
    Ok(up.ctx.storage_init(&label.join("|"), &bytes))
}

/// Rows `row0..row0 + rows` of a tensor of the file: a matrix, or a half of a fused one.
#[derive(Clone, Copy)]
struct Rows<'g> {
    info: &'g TensorInfo,
    row0: u32,
    rows: u32,
}

/// Streams the file's matrices to the GPU in bounded chunks: a matrix is never whole in memory,
/// only [`FILL_CHUNK_BYTES`] of it (twice: GGUF bytes and repacked words).
struct Uploader<'c, 'g> {
    ctx: &'c Context,
    gguf: &'c Gguf<'g>,
    /// Called with the bytes of each tensor range placed.
    placed: &'c mut dyn FnMut(u64),
    /// Bytes written since the queue last took them.
    unflushed: u64,
}

impl Uploader<'_, '_> {
    fn placed(&mut self, bytes: u64) {
        (self.placed)(bytes);
    }

    /// Bytes of rows `first..first + n` of `r` (within its rows).
    fn read(&mut self, r: Rows<'_>, first: u32, n: u32) -> Result<std::borrow::Cow<'_, [u8]>, EngineError> {
        let row_bytes = r.info.size_bytes / r.info.dims.get(1).copied().unwrap_or(1).max(1);
        let data = self.gguf.read_range(r.info, (r.row0 + first) as u64 * row_bytes, n as u64 * row_bytes).map_err(ModelError::from)?;
        (self.placed)(data.len() as u64);
        Ok(data)
    }

    /// Writes one chunk and lets the queue take what has been written every so often (natively,
    /// writes wait in staging memory until a submission takes them).
    fn write(&mut self, m: &QuantMatrix, (first, n): (u32, u32), raw: &[u8]) -> Result<(), EngineError> {
        m.write_rows(self.ctx, first, n, raw)?;
        self.unflushed += raw.len() as u64;
        if self.unflushed >= FLUSH_BYTES {
            self.ctx.flush_writes();
            self.unflushed = 0;
        }
        Ok(())
    }

    /// A matrix of `parts` stacked along rows, each chunk gathered from the parts it spans.
    fn stacked(&mut self, label: &str, parts: &[Rows<'_>], cols: u32) -> Result<QuantMatrix, EngineError> {
        let shape: Vec<(GgmlType, u32)> = parts.iter().map(|r| (r.info.ggml_type, r.rows)).collect();
        let m = QuantMatrix::allocate(self.ctx, label, &shape, cols, max_part_bytes(self.ctx))?;
        for (first, n) in m.fill_chunks(FILL_CHUNK_BYTES) {
            let mut raw = Vec::new();
            let mut row0 = 0;
            for &r in parts {
                let (from, to) = (first.max(row0), (first + n).min(row0 + r.rows));
                if from < to {
                    raw.extend_from_slice(&self.read(r, from - row0, to - from)?);
                }
                row0 += r.rows;
            }
            self.write(&m, (first, n), &raw)?;
        }
        Ok(m)
    }

    /// Gate and up ([ffn, cols] each, one type) interleaved for the gated epilogue
    /// ([`interleave_gate_up`]), chunk by chunk.
    fn gated(&mut self, label: &str, (gate, up): (Rows<'_>, Rows<'_>), cols: u32) -> Result<QuantMatrix, EngineError> {
        let ffn = gate.rows;
        let mut m = QuantMatrix::allocate(self.ctx, label, &[(gate.info.ggml_type, 2 * ffn)], cols, max_part_bytes(self.ctx))?;
        m.gated = true;
        let row_bytes = (gate.info.size_bytes / gate.info.dims.get(1).copied().unwrap_or(1).max(1)) as usize;
        for (first, n) in m.fill_chunks(FILL_CHUNK_BYTES) {
            // Interleaved row 4c + j is gate row 2c + j (j < 2), else up row 2c + j - 2.
            let (c0, c1) = (first / 4, (first + n).div_ceil(4));
            let (from, to) = (2 * c0, (2 * c1).min(ffn));
            let g = self.read(gate, from, to - from)?.into_owned();
            let u = self.read(up, from, to - from)?.into_owned();
            let all = interleave_gate_up(&g, &u, row_bytes);
            let skip = (first - 4 * c0) as usize * row_bytes;
            self.write(&m, (first, n), &all[skip..skip + n as usize * row_bytes])?;
        }
        Ok(m)
    }
}

/// A whole matrix tensor's rows.
fn whole<'g>(&(info, rows): &(&'g TensorInfo, u32)) -> Rows<'g> {
    Rows { info, row0: 0, rows }
}

/// GGUF bytes written between two submissions that let the queue take them (natively, staging
/// memory holds them until then).
const FLUSH_BYTES: u64 = 64 << 20;

/// The matrix of a projection over `parts` of `layer`: their rows stacked, or gate and up
/// interleaved when they can be.
fn projection(up: &mut Uploader<'_, '_>, table: &TensorTable, layer: Option<u32>, (proj, parts): (Proj, &[Role])) -> Result<QuantMatrix, EngineError> {
    let gguf = up.gguf;
    let raw = parts.iter().map(|&role| matrix(gguf, table, (layer, role))).collect::<Result<Vec<_>, _>>()?;
    let label = parts.iter().map(|&role| role.name(layer)).collect::<Vec<_>>().join("|");
    let cols = table.spec(layer, parts[0])?.shape.matrix()?.0;
    // Gate and up as two tensors, or fused in one (gate rows first: its first half).
    let gate_up = match (proj, raw.as_slice()) {
        (Proj::GateUp, [g, u]) if g.0.ggml_type == u.0.ggml_type && g.1 % 2 == 0 => Some((whole(g), whole(u))),
        (Proj::GateUp, &[(info, rows)]) if rows % 4 == 0 => Some((Rows { info, row0: 0, rows: rows / 2 }, Rows { info, row0: rows / 2, rows: rows / 2 })),
        _ => None,
    };
    match gate_up {
        Some(pair) => up.gated(&label, pair, cols),
        None => up.stacked(&label, &raw.iter().map(whole).collect::<Vec<_>>(), cols),
    }
}

impl Weights {
    /// Uploads the weights `cfg`'s layer plan computes with, as its tensor table finds them in
    /// `gguf`.
    pub fn upload(ctx: &Context, gguf: &Gguf<'_>, cfg: &ModelConfig) -> Result<Weights, EngineError> {
        Weights::upload_with(ctx, gguf, cfg, &mut |_| {})
    }

    /// [`Weights::upload`], streaming each matrix from the file in bounded chunks and calling
    /// `placed` with the bytes of each range placed.
    pub fn upload_with(ctx: &Context, gguf: &Gguf<'_>, cfg: &ModelConfig, placed: &mut dyn FnMut(u64)) -> Result<Weights, EngineError> {
        crate::model::check_types(gguf)?;
        let (table, plan) = (cfg.tensors(), cfg.plan());
        let mut up = Uploader { ctx, gguf, placed, unflushed: 0 };
        let head = |up: &mut Uploader<'_, '_>, role| -> Result<QuantMatrix, EngineError> {
            let (info, rows) = matrix(gguf, &table, (None, role))?;
            up.stacked(&role.name(None), &[Rows { info, row0: 0, rows }], cfg.hidden)
        };
        let token_embd = head(&mut up, Role::TokenEmbd)?;
        let output = match table.spec(None, Role::Output)?.present_in(gguf) {
            true => Some(head(&mut up, Role::Output)?),
            false => None,
        };
        let output_norm = norms(&mut up, &table, None, &[plan.output_norm])?;
        let mut layers = Vec::with_capacity(plan.layers.len());
        for (l, ops) in (0u32..).zip(&plan.layers) {
            let mut lw = LayerWeights::default();
            for op in ops {
                match *op {
                    Op::Norm(role) | Op::Residual { post_norm: Some(role) } => lw.norms.push((role, norms(&mut up, &table, Some(l), &[role])?)),
                    Op::HeadNorm { q, k } => lw.norms.push((q, norms(&mut up, &table, Some(l), &[q, k])?)),
                    Op::Matmul { proj, weights } => lw.matrices.push((proj, projection(&mut up, &table, Some(l), (proj, weights))?)),
                    // Stacked in one buffer, found by the first role.
                    Op::Bias { biases, .. } => lw.norms.push((biases[0], norms(&mut up, &table, Some(l), biases)?)),
                    Op::Rope(_) | Op::Attention(_) | Op::Residual { post_norm: None } | Op::Glu(_) => {}
                }
            }
            layers.push(lw);
        }
        ctx.flush_writes();
        Ok(Weights { token_embd, output, output_norm, layers })
    }

    /// GPU bytes the weights of `gguf` take once uploaded, from its header alone: each matrix in
    /// its GPU layout (row groups completed), each vector as it is.
    pub fn planned_bytes(gguf: &Gguf<'_>, cfg: &ModelConfig) -> Result<u64, EngineError> {
        let mut total = 0;
        for spec in &cfg.tensors().tensors {
            let Some(info) = gguf.tensor(&spec.name) else { continue };
            total += match spec.shape {
                Shape::Vector(_) => info.size_bytes.div_ceil(4) * 4,
                Shape::Matrix { .. } => {
                    let (cols, rows) = spec.shape.matrix()?;
                    QuantMatrix::planned_bytes(info.ggml_type, rows, cols)?
                }
            };
        }
        Ok(total)
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
