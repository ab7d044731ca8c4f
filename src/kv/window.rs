//! The sliding-window rule of the local layers' block group: which blocks a sequence still
//! needs, as a function of positions only, so the cache, the prefix tree, snapshots and the
//! tests all apply the same rule.
//!
//! A local layer's query at position p reads keys j with `p - j < window`, i.e.
//! `j >= p + 1 - window`. A step that appends positions `p..p + n` therefore needs, in the local
//! group, the blocks from the one holding `max(0, p + 1 - window)` up to the one holding
//! `p + n - 1`; every earlier block can go back to the pool before the step runs (a block is
//! freed once every position j in it has `j + window <= p`). Later steps start later, so a freed
//! block is never needed again unless the sequence is rewound.

/// The window and the block size of a local block group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRule {
    /// Positions a local query sees, itself included (≥ 1).
    pub window: u32,
    pub block_size: u32,
}

impl WindowRule {
    /// The first block that a query at position `p`, and every query after it, can still see.
    pub fn first_needed_block(&self, p: u32) -> u32 {
        p.saturating_add(1).saturating_sub(self.window) / self.block_size
    }

    /// The local blocks a sequence of `len` tokens holds when its last step began at position
    /// `step_start`: `first_needed_block(step_start)..ceil(len / block_size)`.
    pub fn held_blocks(&self, step_start: u32, len: u32) -> std::ops::Range<u32> {
        let end = len.div_ceil(self.block_size);
        self.first_needed_block(step_start).min(end)..end
    }

    /// Most local blocks one sequence holds while decoding (one token per step): the blocks the
    /// window's `window - 1` earlier positions touch besides the one being written
    /// (`ceil((window - 1) / block_size)`), plus that one.
    pub fn decode_blocks(&self) -> u32 {
        self.window.saturating_sub(1).div_ceil(self.block_size) + 1
    }
}
