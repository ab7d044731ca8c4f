//! KV-cache layouts. [`contiguous`] is the baseline: per layer one K and one V buffer reserved
//! for a sequence's maximum length, written in place at each token's position.

pub mod alloc;
pub mod contiguous;

pub use contiguous::ContiguousKv;
