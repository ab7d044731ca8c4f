//! The llama model: configuration from GGUF metadata, weights uploaded once and kept quantized,
//! the forward graph ([`graph`]) and what runs rows through it ([`runner`]).

pub mod config;
pub mod graph;
#[cfg(feature = "testing")]
pub mod reference;
pub mod runner;
pub mod weights;

pub use config::{Activation, Architecture, ModelConfig, RopePairing};
pub use graph::{AttentionKind, Choose, Feed, ForwardGraph, Logits, PendingStep, RowOutput, StepRow};
pub use runner::{GraphBudget, Model, Runner};
pub use weights::Weights;

use crate::gguf::GgufError;
use crate::gpu::GpuError;
use crate::kv::KvError;

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
    #[error(transparent)]
    Kv(#[from] KvError),
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> ModelError {
        ModelError::Gguf(e)
    }
}
