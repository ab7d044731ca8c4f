//! The engine's error and the kind of each failure, with the code JS sees for it
//! ([`ErrorKind::code`]). Every lower layer has its own error enum; this one wraps them and says,
//! through [`EngineError::kind`], what the caller can do about it.
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

/// Declares [`ErrorKind`] from rows of `doc, Kind => "CODE"`, so that a kind, what it means and
/// the code JS sees for it are said once, together; [`ErrorKind::ALL`] and [`ErrorKind::code`]
/// follow from the rows.
macro_rules! error_kinds {
    ($($(#[$doc:meta])* $kind:ident => $code:literal,)+) => {
        /// What kind of failure an [`EngineError`] is: what the caller can do about it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)+
        }

        impl ErrorKind {
            /// Every kind, in the order declared.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind),+];

            /// The code JS sees as `error.code` for this kind (`js/index.d.ts` lists the codes
            /// in its `ErrorCode` type, with the few the JS and the wasm layer add).
            pub fn code(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => $code,)+
                }
            }
        }
    };
}

error_kinds! {
    /// No usable WebGPU/Vulkan adapter or device.
    NoDevice => "WEBGPU_UNAVAILABLE",
    /// The model file is not one pagedlm can read or run.
    ModelFormat => "MODEL_FORMAT",
    /// The model's bytes could not be read from their source while loading (the file changed or
    /// shrank, a read was refused): read it again, or download it again.
    ModelRead => "MODEL_READ",
    /// An engine feature this configuration lacks (e.g. a snapshot of an INT8 pool): a
    /// setting to change. A model file pagedlm cannot run (a tensor type, a head size) is
    /// [`ErrorKind::ModelFormat`]: the caller's remedy is another file.
    Unsupported => "UNSUPPORTED",
    /// The prompt or sequence does not fit the context.
    ContextOverflow => "CONTEXT_OVERFLOW",
    /// The KV pool cannot hold the sequence.
    KvPoolFull => "KV_POOL_FULL",
    /// A caller's argument is out of range or malformed.
    InvalidArgument => "INVALID_ARGUMENT",
    /// The device failed while running (validation, readback).
    Gpu => "GPU_ERROR",
    /// An allocation past the engine's memory cap (`max_memory_bytes`) or one the device
    /// refused: the engine stays usable for what fits.
    OutOfMemory => "OUT_OF_MEMORY",
    /// The device is gone: the engine must be recreated (the model bytes can be reused).
    DeviceLost => "DEVICE_LOST",
    /// A KV snapshot from another model or engine configuration.
    SnapshotMismatch => "SNAPSHOT_MISMATCH",
    /// KV snapshot bytes that are damaged.
    SnapshotCorrupt => "SNAPSHOT_CORRUPT",
    /// A bug in pagedlm: a broken invariant or contract.
    Internal => "INTERNAL",
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
            EngineError::Sampling(_) | EngineError::EmptyPrompt | EngineError::BadToken { .. } | EngineError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            EngineError::Step { kind, .. } => *kind,
            EngineError::DeviceLost { .. } => ErrorKind::DeviceLost,
        }
    }
}

fn tokenizer_kind(e: &TokenizerError) -> ErrorKind {
    match e {
        // The caller asked for chat from a base model, or for a conversation the model's
        // template cannot write (it raised, or failed on these messages): completion mode or
        // other messages.
        TokenizerError::NoChatTemplate | TokenizerError::Template(_) => ErrorKind::InvalidArgument,
        _ => ErrorKind::ModelFormat,
    }
}

fn model_kind(e: &ModelError) -> ErrorKind {
    match e {
        ModelError::Gguf(GgufError::Read(_)) => ErrorKind::ModelRead,
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
            SnapshotError::NotASnapshot | SnapshotError::Length(_) | SnapshotError::Checksum | SnapshotError::Header(_) => ErrorKind::SnapshotCorrupt,
        },
        KvError::Config(_) | KvError::WindowFreed { .. } => ErrorKind::InvalidArgument,
        KvError::UnknownSequence(_) | KvError::TooManySequences(_) | KvError::CacheKeyMismatch(_) | KvError::Internal(_) | KvError::Integrity(_) => {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::ErrorKind;

    const INDEX_D_TS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/index.d.ts"));
    /// The package's JS, which raises a few codes of its own (a failed download, an abort).
    const PACKAGE_JS: [(&str, &str); 4] = [
        ("js/index.js", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/index.js"))),
        ("js/worker.js", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/worker.js"))),
        ("js/protocol.js", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/protocol.js"))),
        ("js/storage.js", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/js/storage.js"))),
    ];
    /// The wasm layer, whose `ErrorCode::as_str` adds the codes of the failures only it has.
    const WEB_RS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/web.rs"));

    fn is_code(text: &str) -> bool {
        text.len() > 1 && text.starts_with(|c: char| c.is_ascii_uppercase()) && text.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
    }

    /// What `source` quotes that is written like a code (`"MODEL_DOWNLOAD"`). Every stretch
    /// between two double quotes counts, so that a quote in a comment or a template string cannot
    /// hide the literals after it; text outside a literal is never a lone capitalized word.
    fn code_literals(source: &str) -> BTreeSet<&str> {
        source.split('"').skip(1).filter(|s| is_code(s)).collect()
    }

    /// The codes `js/index.d.ts` lists in `export type ErrorCode = | "A" | "B" ...;`.
    fn package_codes() -> BTreeSet<String> {
        const HEAD: &str = "export type ErrorCode =";
        let start = INDEX_D_TS.find(HEAD).expect("js/index.d.ts has no `export type ErrorCode`");
        // The members, without their doc comments (which may quote codes, or hold a `;`).
        let (mut rest, mut members) = (&INDEX_D_TS[start + HEAD.len()..], String::new());
        loop {
            let end = rest.find(';').expect("the ErrorCode type ends with ;");
            match rest.find("/**") {
                Some(comment) if comment < end => {
                    members += &rest[..comment];
                    let close = rest[comment..].find("*/").expect("a doc comment in ErrorCode ends");
                    rest = &rest[comment + close + 2..];
                }
                _ => break members += &rest[..end],
            }
        }
        let codes: BTreeSet<String> = code_literals(&members).into_iter().map(String::from).collect();
        assert!(codes.len() >= ErrorKind::ALL.len(), "js/index.d.ts's ErrorCode lists only {codes:?}");
        codes
    }

    /// Every kind has its own code, in the SCREAMING_SNAKE_CASE JS codes are written in.
    #[test]
    fn every_kind_has_a_distinct_code() {
        let mut seen = std::collections::HashMap::new();
        for &kind in ErrorKind::ALL {
            let code = kind.code();
            assert!(is_code(code), "{kind:?}: {code:?}");
            if let Some(other) = seen.insert(code, kind) {
                panic!("{kind:?} and {other:?} share the code {code}");
            }
        }
    }

    /// The package's `ErrorCode` type lists exactly the codes pagedlm gives: every kind's, the
    /// wasm layer's own (`ErrorCode::as_str` in src/web.rs) and those the package's JS raises
    /// itself; every code the JS names is one of them.
    #[test]
    fn the_package_type_lists_exactly_the_codes_given() {
        let listed = package_codes();
        let kinds: BTreeSet<&str> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        let web_only: BTreeSet<&str> =
            WEB_RS.lines().filter(|l| l.trim_start().starts_with("ErrorCode::") && l.contains("=> \"")).flat_map(code_literals).collect();
        assert!(!web_only.is_empty(), "found no `ErrorCode::X => \"CODE\"` arm in src/web.rs: has ErrorCode::as_str moved?");
        let mut given = kinds.clone();
        given.extend(&web_only);
        for (file, source) in PACKAGE_JS {
            for code in code_literals(source) {
                assert!(listed.contains(code), "{file} names the code {code}, which js/index.d.ts's ErrorCode does not list");
                given.insert(code);
            }
        }
        for &code in &kinds {
            assert!(listed.contains(code), "js/index.d.ts's ErrorCode lacks {code}, an ErrorKind's code");
        }
        for &code in &web_only {
            assert!(listed.contains(code), "js/index.d.ts's ErrorCode lacks {code}, which src/web.rs gives");
        }
        let unused: Vec<&String> = listed.iter().filter(|c| !given.contains(c.as_str())).collect();
        assert!(unused.is_empty(), "js/index.d.ts's ErrorCode lists {unused:?}, which neither the engine, src/web.rs nor the package's JS gives");
    }
}
