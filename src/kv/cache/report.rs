//! What the cache reports of itself: the pool's occupancy, every block's state and reference
//! count, and the check of its invariants (free + used + cached = total, no block held by more
//! holders than its reference count says).

use crate::kv::pool::{GroupStats, PoolStats};
use crate::kv::radix::NO_BLOCK;
use crate::kv::IntegrityError;

use super::{KvCache, KvLayout};

impl KvCache {
    pub fn stats(&self) -> PoolStats {
        let live_tokens: u64 = self.seqs.iter().flatten().map(|s| s.len as u64).sum();
        let held = self.pool.alloc.used_count();
        let cached = self.radix.blocks().iter().filter(|&&b| self.pool.alloc.refcount(b) == 1).count() as u32;
        let used = held - cached;
        let slots = used as u64 * self.pool.block_size as u64;
        let local = self.local.as_ref().map(|g| {
            let cached = self.radix.local_blocks().iter().filter(|&&b| g.pool.alloc.refcount(b) == 1).count() as u32;
            GroupStats {
                blocks_total: g.pool.n_blocks,
                blocks_used: g.pool.alloc.used_count() - cached,
                blocks_free: g.pool.alloc.free_count(),
                blocks_cached: cached,
                bytes_total: g.pool.bytes_total(),
            }
        });
        let local_held = self.local.as_ref().map_or(0, |g| g.pool.alloc.used_count() as u64 * g.pool.bytes_per_block());
        PoolStats {
            kv_dtype: self.pool.dtype.name(),
            block_size: self.pool.block_size,
            blocks_total: self.pool.n_blocks,
            blocks_used: used,
            blocks_free: self.pool.alloc.free_count(),
            blocks_cached: cached,
            bytes_total: self.bytes_total(),
            bytes_per_token: self.bytes_per_token() as f64,
            live_tokens,
            internal_fragmentation: slots.saturating_sub(live_tokens),
            bytes_held: held as u64 * self.pool.bytes_per_block() + local_held,
            local,
        }
    }

    /// Verifies the cache's invariants: the allocator's own (free list and refcounts agree), the
    /// prefix tree's own, every block's refcount equals the number of tables holding it plus the
    /// tree's reference plus `external[b]` (holders outside the cache), no table holds a block
    /// twice, each table has exactly the blocks its length needs, and no block a sequence holds
    /// hangs in the tree below one that only the tree holds (which eviction could not reach).
    /// With windowed layers the same holds in the local group (`external` counts global blocks
    /// only), and each sequence holds exactly the local blocks the window rule keeps.
    pub fn check_integrity_with(&self, external: &dyn Fn(u32) -> u32) -> Result<(), IntegrityError> {
        self.check_with(external).and_then(|()| self.check_local()).map_err(IntegrityError)
    }

    fn check_with(&self, external: &dyn Fn(u32) -> u32) -> Result<(), String> {
        self.pool.alloc.check()?;
        self.radix.check()?;
        let mut in_tree = vec![0u32; self.pool.n_blocks as usize];
        for b in self.radix.blocks() {
            *in_tree.get_mut(b as usize).ok_or_else(|| format!("the prefix cache holds block {b}, past the pool"))? += 1;
        }
        let mut holders = vec![0u32; self.pool.n_blocks as usize];
        for (i, seq) in self.seqs.iter().enumerate() {
            let Some(seq) = seq else { continue };
            let expected = match self.layout {
                KvLayout::Contiguous => 1,
                KvLayout::Paged => seq.len.div_ceil(self.pool.block_size) as usize,
            };
            if seq.blocks.len() != expected {
                return Err(format!("sequence {i} of {} tokens holds {} blocks, {expected} expected", seq.len, seq.blocks.len()));
            }
            if seq.len > self.max_seq_len {
                return Err(format!("sequence {i} has {} tokens, over the maximum {}", seq.len, self.max_seq_len));
            }
            count_holders(&mut holders, &seq.blocks, &format!("sequence {i}"))?;
        }
        for (b, &h) in holders.iter().enumerate() {
            let want = h + in_tree[b] + external(b as u32);
            let rc = self.pool.alloc.refcount(b as u32);
            if rc != want {
                return Err(format!("block {b} has refcount {rc} but {want} holders"));
            }
        }
        // A cached block counts as reclaimable (`PoolStats::blocks_cached`) only if eviction,
        // which takes leaves, can reach it: below a block that only the tree holds there must be
        // no block that a sequence holds.
        for (b, parent) in self.radix.parent_blocks() {
            if let Some(p) = parent {
                if holders[b as usize] > 0 && holders[p as usize] == 0 {
                    return Err(format!("block {b}, held by a sequence, hangs below block {p}, which only the prefix cache holds"));
                }
            }
        }
        Ok(())
    }

    /// The local group's part of [`KvCache::check_integrity_with`].
    fn check_local(&self) -> Result<(), String> {
        let Some(group) = &self.local else {
            return match self.seqs.iter().flatten().any(|s| !s.local.is_empty()) || !self.radix.local_blocks().is_empty() {
                true => Err("local blocks are held without a local group".into()),
                false => Ok(()),
            };
        };
        group.pool.alloc.check().map_err(|e| format!("local group: {e}"))?;
        let mut holders = vec![0u32; group.pool.n_blocks as usize];
        for b in self.radix.local_blocks() {
            *holders.get_mut(b as usize).ok_or_else(|| format!("the prefix cache holds local block {b}, past the pool"))? += 1;
        }
        for (i, seq) in self.seqs.iter().enumerate() {
            let Some(seq) = seq else { continue };
            if seq.local.len() != seq.blocks.len() || seq.step_start > seq.len {
                return Err(format!(
                    "sequence {i} has {} local entries for {} blocks (step start {}, length {})",
                    seq.local.len(),
                    seq.blocks.len(),
                    seq.step_start,
                    seq.len
                ));
            }
            let kept = match self.layout {
                KvLayout::Paged => group.rule.held_blocks(seq.step_start, seq.len),
                KvLayout::Contiguous => 0..seq.local.len() as u32,
            };
            for (b, &block) in seq.local.iter().enumerate() {
                if kept.contains(&(b as u32)) == (block == NO_BLOCK) {
                    return Err(format!(
                        "sequence {i}: local block {b} is {} but the window keeps blocks {kept:?}",
                        if block == NO_BLOCK { "freed" } else { "held" }
                    ));
                }
            }
            let held: Vec<u32> = seq.local.iter().copied().filter(|&b| b != NO_BLOCK).collect();
            count_holders(&mut holders, &held, &format!("sequence {i}'s local table"))?;
        }
        for (b, &want) in holders.iter().enumerate() {
            let rc = group.pool.alloc.refcount(b as u32);
            if rc != want {
                return Err(format!("local block {b} has refcount {rc} but {want} holders"));
            }
        }
        Ok(())
    }

    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        self.check_integrity_with(&|_| 0)
    }

    /// Per physical block: 0 free, 1 held by a live sequence, 2 held only by the prefix cache;
    /// the global group's blocks, then the local group's.
    pub fn block_states(&self) -> Vec<u8> {
        let mut states = vec![0u8; self.pool.n_blocks as usize];
        let mut local_states = vec![0u8; self.local.as_ref().map_or(0, |g| g.pool.n_blocks) as usize];
        for b in self.radix.blocks() {
            states[b as usize] = 2;
        }
        for b in self.radix.local_blocks() {
            local_states[b as usize] = 2;
        }
        for seq in self.seqs.iter().flatten() {
            for &b in &seq.blocks {
                states[b as usize] = 1;
            }
            for &b in seq.local.iter().filter(|&&b| b != NO_BLOCK) {
                local_states[b as usize] = 1;
            }
        }
        states.extend(local_states);
        states
    }

    /// Per physical block, its reference count (global group, then local group).
    pub fn refcounts(&self) -> Vec<u32> {
        let local = self.local.iter().flat_map(|g| (0..g.pool.n_blocks).map(|b| g.pool.alloc.refcount(b)));
        (0..self.pool.n_blocks).map(|b| self.pool.alloc.refcount(b)).chain(local).collect()
    }
}

/// Counts one table's blocks into `holders`, refusing a block past the pool or held twice.
fn count_holders(holders: &mut [u32], blocks: &[u32], who: &str) -> Result<(), String> {
    let mut seen = blocks.to_vec();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("{who} holds a block twice"));
    }
    for &b in blocks {
        *holders.get_mut(b as usize).ok_or_else(|| format!("{who} holds block {b}, past the pool"))? += 1;
    }
    Ok(())
}
