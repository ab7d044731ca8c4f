//! The CPU backend's weights: the tensors the model's layer plan computes with, copied out of the
//! file once as its tensor table finds them, kept in their GGUF formats, their shapes checked.
//! Each is read straight into the memory that keeps it: the weights are in memory once.

use crate::error::EngineError;
use crate::gguf::{GgmlType, Gguf, TensorInfo};
use crate::model::{ModelConfig, ModelError, Op, Plan, Role, TensorTable};

use super::kernels::QMatrix;

/// One layer's weights, by the role the plan's ops name them with.
#[derive(Default)]
pub struct LayerWeights {
    /// Norms' weights, `[len]` f32.
    vectors: Vec<(Role, Vec<f32>)>,
    /// Matrices, one per tensor (a projection over several runs one matmul per tensor).
    matrices: Vec<(Role, QMatrix)>,
}

impl LayerWeights {
    /// The norm weights `role`.
    pub fn vector(&self, role: Role) -> Result<&[f32], EngineError> {
        self.vectors.iter().find(|(r, _)| *r == role).map(|(_, v)| v.as_slice()).ok_or_else(|| missing(role))
    }

    /// The matrix `role`.
    pub fn matrix(&self, role: Role) -> Result<&QMatrix, EngineError> {
        self.matrices.iter().find(|(r, _)| *r == role).map(|(_, m)| m).ok_or_else(|| missing(role))
    }

    fn bytes(&self) -> u64 {
        self.vectors.iter().map(|(_, v)| v.len() as u64 * 4).sum::<u64>() + self.matrices.iter().map(|(_, m)| m.bytes()).sum::<u64>()
    }
}

/// A weight the forward pass asks for and the plan did not load: a bug.
fn missing(role: Role) -> EngineError {
    ModelError::Format(format!("the layer plan loaded no {role:?} weights")).into()
}

/// The model's weights in CPU memory.
pub struct HostModel {
    pub config: ModelConfig,
    /// Whether the matmuls quantize their activations to int8 blocks (as llama.cpp's CPU
    /// kernels do) instead of multiplying them in f32.
    pub int8_activations: bool,
    /// The ops the forward pass runs ([`ModelConfig::plan`]).
    pub(super) plan: Plan,
    pub(super) embd: QMatrix,
    pub(super) layers: Vec<LayerWeights>,
    pub(super) output_norm: Vec<f32>,
    /// `None`: the output projection is the embedding (tied weights).
    pub(super) output: Option<QMatrix>,
}

/// The matrix `role` of `layer`, as the table gives it, read from the file straight into the
/// memory that keeps it.
fn matrix(gguf: &Gguf<'_>, table: &TensorTable, layer: Option<u32>, role: Role) -> Result<QMatrix, EngineError> {
    let spec = table.spec(layer, role)?;
    let info = spec.check(gguf)?;
    fits_one_allocation(info)?;
    let (cols, rows) = spec.shape.matrix()?;
    let (rows, cols) = (rows as usize, cols as usize);
    let matrix = match info.ggml_type {
        GgmlType::F32 => QMatrix::from_f32(rows, cols, f32s(gguf, info)?),
        ty => QMatrix::from_raw(ty, rows, cols, gguf.read_tensor(info)?.into_owned()),
    };
    Ok(matrix.map_err(|e| ModelError::Format(format!("tensor {}: {e}", spec.name)))?)
}

/// Refuses a tensor larger than one allocation can be (2 GiB in wasm32): the CPU backend keeps
/// each tensor in one.
fn fits_one_allocation(info: &TensorInfo) -> Result<(), EngineError> {
    match info.size_bytes > isize::MAX as u64 {
        true => Err(ModelError::Unsupported(format!(
            "tensor {} takes {} bytes, more than one allocation of the CPU backend holds here ({} bytes): run it on WebGPU",
            info.name,
            info.size_bytes,
            isize::MAX
        ))
        .into()),
        false => Ok(()),
    }
}

/// An F32 tensor's values, read into the vector that keeps them.
fn f32s(gguf: &Gguf<'_>, info: &TensorInfo) -> Result<Vec<f32>, EngineError> {
    let mut values = vec![0f32; (info.size_bytes / 4) as usize];
    gguf.read_into(info, 0, bytemuck::cast_slice_mut(&mut values)).map_err(ModelError::from)?;
    // GGUF is little-endian, as every target pagedlm builds for: a no-op there.
    values.iter_mut().for_each(|v| *v = f32::from_bits(u32::from_le(v.to_bits())));
    Ok(values)
}

/// The norm weights `role` of `layer`.
fn vector(gguf: &Gguf<'_>, table: &TensorTable, layer: Option<u32>, role: Role) -> Result<Vec<f32>, EngineError> {
    let info = table.spec(layer, role)?.check(gguf)?;
    fits_one_allocation(info)?;
    f32s(gguf, info)
}

impl HostModel {
    /// Copies the tensors `config`'s layer plan computes with out of the file (kept quantized)
    /// and checks their shapes.
    pub fn load(gguf: &Gguf<'_>, config: &ModelConfig, int8_activations: bool) -> Result<HostModel, EngineError> {
        HostModel::load_with(gguf, config, int8_activations, &mut |_| {})
    }

    /// [`HostModel::load`], calling `placed` with the bytes of each tensor read.
    pub fn load_with(gguf: &Gguf<'_>, config: &ModelConfig, int8_activations: bool, placed: &mut dyn FnMut(u64)) -> Result<HostModel, EngineError> {
        crate::model::check_types(gguf)?;
        let (table, plan) = (config.tensors(), config.plan());
        let placed = std::cell::RefCell::new(placed);
        let matrix = |layer, role| -> Result<QMatrix, EngineError> {
            let m = self::matrix(gguf, &table, layer, role)?;
            (placed.borrow_mut())(m.bytes());
            Ok(m)
        };
        let vector = |layer, role| -> Result<Vec<f32>, EngineError> {
            let v = self::vector(gguf, &table, layer, role)?;
            (placed.borrow_mut())(v.len() as u64 * 4);
            Ok(v)
        };
        let mut layers = Vec::with_capacity(plan.layers.len());
        for (l, ops) in (0u32..).zip(&plan.layers) {
            let mut lw = LayerWeights::default();
            for op in ops {
                match *op {
                    Op::Norm(role) | Op::Residual { post_norm: Some(role) } => lw.vectors.push((role, vector(Some(l), role)?)),
                    Op::HeadNorm { q, k } => {
                        for role in [q, k] {
                            lw.vectors.push((role, vector(Some(l), role)?));
                        }
                    }
                    Op::Matmul { weights, .. } => {
                        for &role in weights {
                            lw.matrices.push((role, matrix(Some(l), role)?));
                        }
                    }
                    Op::Bias { biases, .. } => {
                        for &role in biases {
                            lw.vectors.push((role, vector(Some(l), role)?));
                        }
                    }
                    Op::Rope(_) | Op::Attention(_) | Op::Residual { post_norm: None } | Op::Glu(_) => {}
                }
            }
            layers.push(lw);
        }
        let output = match table.spec(None, Role::Output)?.present_in(gguf) {
            true => Some(matrix(None, Role::Output)?),
            false => None,
        };
        Ok(HostModel {
            config: config.clone(),
            int8_activations,
            embd: matrix(None, Role::TokenEmbd)?,
            layers,
            output_norm: vector(None, plan.output_norm)?,
            output,
            plan,
        })
    }

    /// Bytes of the weights in memory.
    pub fn bytes(&self) -> u64 {
        let layers: u64 = self.layers.iter().map(LayerWeights::bytes).sum();
        layers + self.embd.bytes() + self.output.as_ref().map_or(0, QMatrix::bytes) + self.output_norm.len() as u64 * 4
    }
}
