//! The KV cache: a pool of fixed-size blocks in GPU buffers ([`pool`]), the CPU allocator behind
//! it ([`alloc`]) and sequences with block tables over it ([`cache`]), which is the interface the
//! model and the scheduler use. The contiguous layout is the same interface with one block of
//! the maximum length per sequence.

pub mod alloc;
pub mod cache;
pub mod pool;
pub mod radix;
pub mod snapshot;

pub use cache::{CacheConfig, KvCache, KvLayout, SeqId};
pub use pool::{KvPool, PoolStats};
pub use radix::{CacheKey, PrefixMatch, PrefixStats, RadixTree};

use alloc::AllocError;

/// The stored precision of K and V in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    F32,
    /// 8-bit integers with per-group scales, dequantized inside attention.
    Int8,
}

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Int8 => "int8",
        }
    }
}

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
