//! The KV cache: a pool of fixed-size blocks in GPU buffers ([`pool`]), the CPU allocator behind
//! it ([`alloc`]) and sequences with block tables over it ([`cache`]), which is the interface the
//! model and the scheduler use. The contiguous layout is the same interface with one block of
//! the maximum length per sequence.

pub mod alloc;
pub mod cache;
pub mod pool;
pub mod radix;
pub mod snapshot;

pub use crate::quant::KvDtype;
pub use cache::{CacheConfig, KvCache, KvLayout, SeqId};
pub use pool::{KvPool, PoolStats};
pub use radix::{CacheKey, PrefixMatch, PrefixStats, RadixTree};

use alloc::AllocError;

/// What the KV cache needs to know of the model: the pool's per-layer shape and the identity of
/// the model whose K/V it stores (the prefix cache and snapshots are keyed by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// The model's fingerprint (`ModelConfig::fingerprint`: metadata, tensor table and samples of every tensor).
    pub fingerprint: u64,
}

/// A broken invariant of the KV cache, found by [`KvCache::check_integrity`]: a bug, never a
/// state a caller can cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the KV cache's bookkeeping is inconsistent: {0}")]
pub struct IntegrityError(pub String);

/// Errors of the KV cache.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KvError {
    #[error("the KV pool is full: {needed} more blocks needed, {free} free of {total}")]
    PoolExhausted { needed: u32, free: u32, total: u32 },
    #[error("the sequence would hold {needed} tokens but the cache allows {limit}")]
    SequenceTooLong { needed: u64, limit: u32 },
    #[error("no sequence {0} in the KV cache")]
    UnknownSequence(u32),
    #[error("the KV cache holds at most {0} sequences at once")]
    TooManySequences(u32),
    #[error("KV cache configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error("the prefix cache was made for other KV data: {0}")]
    CacheKeyMismatch(String),
    #[error("{0} is not available yet")]
    NotAvailable(String),
    #[error("KV cache bookkeeping: {0}")]
    Internal(String),
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
}

impl From<crate::quant::kv_int8::Int8Error> for KvError {
    fn from(e: crate::quant::kv_int8::Int8Error) -> KvError {
        KvError::Config(e.0)
    }
}

impl From<AllocError> for KvError {
    fn from(e: AllocError) -> KvError {
        match e {
            AllocError::OutOfBlocks { needed, free, total } => KvError::PoolExhausted { needed, free, total },
            other => KvError::Internal(other.to_string()),
        }
    }
}
