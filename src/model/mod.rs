//! The model, whichever backend runs it: the architectures' descriptions ([`arch`]: tensor
//! table and layer plan), the hyper-parameters and features read from GGUF metadata
//! ([`config`]), what one forward step asks of a backend ([`step`]), and the float64 oracle the
//! backends are tested against ([`reference`]). Nothing here knows a GPU or a CPU
//! kernel: the backends (`src/webgpu/`, `src/cpu/`) read this and run it.

pub mod arch;
pub mod config;
#[cfg(feature = "testing")]
pub mod reference;
pub mod step;

pub use arch::{Activation, Architecture, Description, Op, Plan, Proj, Role, RopePairing, TensorSpec, TensorTable};
pub use config::{HyperParams, ModelConfig};
pub use step::{Choose, Logits, RowOutput, StepRow};

use crate::gguf::{GgmlType, Gguf, GgufError};

/// Errors of the model layer: a file pagedlm cannot read or run. A wrapped error is shown as a
/// prefix plus its text, never also as a `source()`, so an error chain says each message once.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("not a usable GGUF file: {0}")]
    Gguf(GgufError),
    #[error("the model file is malformed: {0}")]
    Format(String),
    #[error("pagedlm does not support {0}")]
    Unsupported(String),
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> ModelError {
        ModelError::Gguf(e)
    }
}

/// Refuses a file holding a tensor of a type pagedlm does not compute with, naming the first one,
/// before any weight is loaded.
pub fn check_types(gguf: &Gguf<'_>) -> Result<(), ModelError> {
    match gguf.tensors.iter().find(|t| !t.ggml_type.is_supported()) {
        Some(t) => Err(ModelError::Unsupported(format!(
            "tensor {} has type {}; pagedlm computes with {}",
            t.name,
            t.ggml_type.name(),
            GgmlType::SUPPORTED.map(|t| t.name()).join(", ")
        ))),
        None => Ok(()),
    }
}
