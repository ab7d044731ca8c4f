//! The KV cache: a pool of fixed-size blocks in GPU buffers ([`pool`]), the CPU allocator behind
//! it ([`alloc`]) and sequences with block tables over it ([`cache`]), which is the interface the
//! model and the scheduler use. The contiguous layout is the same interface with one block of
//! the maximum length per sequence. A model with sliding-window layers keeps them in a second
//! block group that holds only the blocks their window can still see ([`window`]).

pub mod alloc;
pub mod cache;
pub mod pool;
pub mod radix;
pub mod snapshot;
pub mod window;

pub use crate::quant::KvDtype;
pub use cache::{CacheConfig, KvCache, KvLayout, SeqId};
pub use pool::{GroupStats, HostPool, KvPool, PoolStats};
pub use radix::{CacheKey, PrefixMatch, PrefixStats, RadixTree};
pub use window::WindowRule;

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
    /// Sliding window of the local layers in positions (a query at p sees keys j with
    /// `p - j < window`); 0 = no layer is windowed.
    pub window: u32,
    /// Bit l set: layer l is local (attends only within `window`); the others are global. Only
    /// read when `window > 0`; layers past 63 are global.
    pub local_layers: u64,
}

impl KvShape {
    /// Whether layer `l` keeps only its window's K/V.
    pub fn is_local(&self, l: u32) -> bool {
        self.window > 0 && l < 64 && self.local_layers >> l & 1 == 1
    }

    /// The window of layer `l`: `None` for a global layer.
    pub fn layer_window(&self, l: u32) -> Option<u32> {
        self.is_local(l).then_some(self.window)
    }

    /// Local layers (0 without a window).
    pub fn n_local(&self) -> u32 {
        (0..self.n_layers).filter(|&l| self.is_local(l)).count() as u32
    }

    /// Whether the cache needs a second block group for windowed layers.
    pub fn windowed(&self) -> bool {
        self.n_local() > 0
    }

    /// The same shape restricted to `n_layers` layers (one block group's pool).
    fn with_layers(&self, n_layers: u32) -> KvShape {
        KvShape { n_layers, ..*self }
    }
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
    #[error("cannot rewind sequence {seq} to {len} tokens: its local layers already freed the K/V of positions before {freed_before}")]
    WindowFreed { seq: u32, len: u32, freed_before: u32 },
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
