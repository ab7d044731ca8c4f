//! The engine's error and the kind of each failure, which the JS layer maps to a code and the
//! CLI prints. Every lower layer has its own error enum; this one wraps them and says, through
//! [`EngineError::kind`], what the caller can do about it.
//!
//! Messages are said once: a wrapped error is shown as itself (`transparent`) or as a prefix
//! plus the inner text, never both as text and as a `source()` (which error chains print again).

use crate::constraint::ConstraintError;
use crate::gguf::GgufError;
use crate::gpu::GpuError;
use crate::kv::snapshot::SnapshotError;
use crate::kv::KvError;
use crate::model::ModelError;
use crate::sampler::SamplingError;
use crate::tokenizer::TokenizerError;

/// Errors of the engine, each with a message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizerError),
    #[error("invalid sampling parameters: {0}")]
    Sampling(SamplingError),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {limit}")]
    ContextOverflow { prompt: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: u32 },
    #[error("{0}")]
    InvalidArgument(String),
    /// A forward step failed; every request in it ends with a copy of this error, which keeps
    /// the failure's kind (a device failure stays [`ErrorKind::Gpu`]).
    #[error("the step failed: {message}")]
    Step { kind: ErrorKind, message: String },
    /// The GPU device was lost (a driver reset, the OS reclaiming memory, `destroy()`): the
    /// request ended with what it had generated (`tokens`, `text`), and the engine runs nothing
    /// more; a new engine on the same model bytes takes over.
    #[error("the GPU device was lost ({message}); the engine must be recreated")]
    DeviceLost { message: String, tokens: Vec<u32>, text: String },
}

impl From<TokenizerError> for EngineError {
    fn from(e: TokenizerError) -> EngineError {
        EngineError::Tokenizer(e)
    }
}

impl From<SamplingError> for EngineError {
    fn from(e: SamplingError) -> EngineError {
        EngineError::Sampling(e)
    }
}

impl From<GgufError> for EngineError {
    fn from(e: GgufError) -> EngineError {
        EngineError::Model(ModelError::from(e))
    }
}

/// What kind of failure an [`EngineError`] is: what the caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No usable WebGPU/Vulkan adapter or device.
    NoDevice,
    /// The model file is not one pagedlm can read or run.
    ModelFormat,
    /// An engine feature this configuration lacks (e.g. a snapshot of an INT8 pool): a
    /// setting to change. A model file pagedlm cannot run (a tensor type, a head size) is
    /// [`ErrorKind::ModelFormat`]: the caller's remedy is another file.
    Unsupported,
    /// The prompt or sequence does not fit the context.
    ContextOverflow,
    /// The KV pool cannot hold the sequence.
    KvPoolFull,
    /// A caller's argument is out of range or malformed.
    InvalidArgument,
    /// The device failed while running (validation, readback).
    Gpu,
    /// An allocation past the engine's memory cap (`max_memory_bytes`) or one the device
    /// refused: the engine stays usable for what fits.
    OutOfMemory,
    /// The device is gone: the engine must be recreated (the model bytes can be reused).
    DeviceLost,
    /// A KV snapshot from another model or engine configuration.
    SnapshotMismatch,
    /// KV snapshot bytes that are damaged.
    SnapshotCorrupt,
    /// A bug in pagedlm: a broken invariant or contract.
    Internal,
}

impl EngineError {
    /// The kind of this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Model(m) => model_kind(m),
            EngineError::Gpu(g) => gpu_kind(g),
            EngineError::Kv(k) => kv_kind(k),
            EngineError::Tokenizer(t) => tokenizer_kind(t),
            EngineError::ContextOverflow { .. } => ErrorKind::ContextOverflow,
            EngineError::Constraint(c) => match c {
                ConstraintError::Invalid(_) => ErrorKind::InvalidArgument,
                ConstraintError::Vocabulary(_) => ErrorKind::Unsupported,
                ConstraintError::Failed(_) => ErrorKind::Internal,
            },
            EngineError::Sampling(_) | EngineError::EmptyPrompt | EngineError::BadToken { .. } | EngineError::InvalidArgument(_) => {
                ErrorKind::InvalidArgument
            }
            EngineError::Step { kind, .. } => *kind,
            EngineError::DeviceLost { .. } => ErrorKind::DeviceLost,
        }
    }
}

fn tokenizer_kind(e: &TokenizerError) -> ErrorKind {
    match e {
        // The file is fine; the caller asked for chat from a base model, or for a conversation
        // the model's template cannot write: completion mode or other messages.
        TokenizerError::NoChatTemplate | TokenizerError::ChatRoles { .. } => ErrorKind::InvalidArgument,
        _ => ErrorKind::ModelFormat,
    }
}

fn model_kind(e: &ModelError) -> ErrorKind {
    match e {
        ModelError::Gguf(_) | ModelError::Format(_) | ModelError::Unsupported(_) => ErrorKind::ModelFormat,
    }
}

fn gpu_kind(e: &GpuError) -> ErrorKind {
    match e {
        GpuError::NoAdapter(_) | GpuError::Device(_) | GpuError::Limits(_) => ErrorKind::NoDevice,
        GpuError::Readback(_) | GpuError::Timestamps(_) | GpuError::Reported(_) => ErrorKind::Gpu,
        GpuError::OutOfMemory(_) => ErrorKind::OutOfMemory,
        GpuError::Shape { .. } | GpuError::UnknownShader(_) => ErrorKind::Internal,
    }
}

fn kv_kind(e: &KvError) -> ErrorKind {
    match e {
        KvError::PoolExhausted { .. } => ErrorKind::KvPoolFull,
        KvError::SequenceTooLong { .. } => ErrorKind::ContextOverflow,
        KvError::NotAvailable(_) => ErrorKind::Unsupported,
        KvError::Snapshot(s) => match s {
            // Intact bytes from another engine configuration: the page drops them and recomputes.
            SnapshotError::Mismatch { .. } | SnapshotError::Version(_) => ErrorKind::SnapshotMismatch,
            SnapshotError::NotASnapshot | SnapshotError::Length(_) | SnapshotError::Checksum | SnapshotError::Header(_) => {
                ErrorKind::SnapshotCorrupt
            }
        },
        KvError::Config(_) | KvError::WindowFreed { .. } => ErrorKind::InvalidArgument,
        KvError::UnknownSequence(_)
        | KvError::TooManySequences(_)
        | KvError::CacheKeyMismatch(_)
        | KvError::Internal(_)
        | KvError::Integrity(_) => {
            ErrorKind::Internal
        }
    }
}

impl EngineError {
    /// The error each request of a failed step ends with.
    pub fn step_failure(&self) -> EngineError {
        EngineError::Step { kind: self.kind(), message: self.to_string() }
    }
}
