//! The llama model: configuration from GGUF metadata, weights uploaded once and kept quantized,
//! and the forward pass (see [`forward`]).

pub mod batch;
pub mod config;
pub mod forward;
#[cfg(feature = "testing")]
pub mod reference;
pub mod weights;

pub use config::ModelConfig;
pub use batch::{BatchGraph, StepRow};
pub use forward::{Logits, StepGraph};
pub use weights::Weights;

use crate::gguf::GgufError;
use crate::gpu::GpuError;

/// Errors of the model layer. A wrapped error is shown as itself (`transparent`) or as a prefix
/// plus its text, never also as a `source()`, so an error chain says each message once.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("not a usable GGUF file: {0}")]
    Gguf(GgufError),
    #[error("the model file is malformed: {0}")]
    Format(String),
    #[error("pagedlm does not support {0}")]
    Unsupported(String),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("the sequence needs {needed} tokens of context but holds at most {limit}")]
    ContextOverflow { needed: usize, limit: usize },
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> ModelError {
        ModelError::Gguf(e)
    }
}
