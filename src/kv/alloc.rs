//! The CPU side of the paged KV pool: which physical blocks are free, who holds each one.
//!
//! A block is free (refcount 0, on the free list) or held (refcount ≥ 1: by live sequences and,
//! later, by the prefix cache). Sharing a prefix is an extra reference, never a copy.

/// Errors of the block allocator.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocError {
    #[error("the KV pool is out of blocks: {needed} more needed, {free} free of {total}")]
    OutOfBlocks { needed: u32, free: u32, total: u32 },
    #[error("block {0} does not exist")]
    NoSuchBlock(u32),
    #[error("block {0} is not held")]
    NotHeld(u32),
}

/// Free list and reference counts over `total` blocks.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    refcount: Vec<u32>,
    /// Free blocks; popped from the end. Kept so that low ids are handed out first.
    free: Vec<u32>,
}

impl BlockAllocator {
    pub fn new(total: u32) -> BlockAllocator {
        BlockAllocator { refcount: vec![0; total as usize], free: (0..total).rev().collect() }
    }

    pub fn total(&self) -> u32 {
        self.refcount.len() as u32
    }

    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used_count(&self) -> u32 {
        self.total() - self.free_count()
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcount.get(block as usize).copied().unwrap_or(0)
    }

    /// Takes `n` free blocks (refcount 1 each), all or none.
    pub fn alloc(&mut self, n: u32) -> Result<Vec<u32>, AllocError> {
        if n > self.free_count() {
            return Err(AllocError::OutOfBlocks { needed: n, free: self.free_count(), total: self.total() });
        }
        let at = self.free.len() - n as usize;
        let blocks: Vec<u32> = self.free.drain(at..).rev().collect();
        for &b in &blocks {
            self.refcount[b as usize] = 1;
        }
        Ok(blocks)
    }

    /// One more holder of a held block (a sequence sharing a prefix, or the prefix cache).
    pub fn retain(&mut self, block: u32) -> Result<(), AllocError> {
        let rc = self.refcount.get_mut(block as usize).ok_or(AllocError::NoSuchBlock(block))?;
        if *rc == 0 {
            return Err(AllocError::NotHeld(block));
        }
        *rc += 1;
        Ok(())
    }

    /// One holder fewer; the block returns to the free list at zero. Returns true when freed.
    pub fn release(&mut self, block: u32) -> Result<bool, AllocError> {
        let rc = self.refcount.get_mut(block as usize).ok_or(AllocError::NoSuchBlock(block))?;
        if *rc == 0 {
            return Err(AllocError::NotHeld(block));
        }
        *rc -= 1;
        if *rc == 0 {
            self.free.push(block);
            return Ok(true);
        }
        Ok(false)
    }

    /// Checks the allocator's own invariants: every block is either free (refcount 0, listed
    /// once) or held (refcount ≥ 1, not listed). Returns a description of the first violation.
    pub fn check(&self) -> Result<(), String> {
        let mut listed = vec![false; self.refcount.len()];
        for &b in &self.free {
            let i = b as usize;
            if i >= listed.len() {
                return Err(format!("free list holds block {b}, past the pool's {}", listed.len()));
            }
            if listed[i] {
                return Err(format!("block {b} is on the free list twice"));
            }
            listed[i] = true;
            if self.refcount[i] != 0 {
                return Err(format!("block {b} is free but has refcount {}", self.refcount[i]));
            }
        }
        for (i, &rc) in self.refcount.iter().enumerate() {
            if rc == 0 && !listed[i] {
                return Err(format!("block {i} has refcount 0 but is not on the free list (leaked)"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_round_trip() {
        let mut a = BlockAllocator::new(4);
        let b = a.alloc(3).unwrap();
        assert_eq!(b, vec![0, 1, 2]);
        assert_eq!(a.alloc(2), Err(AllocError::OutOfBlocks { needed: 2, free: 1, total: 4 }));
        a.retain(1).unwrap();
        assert_eq!(a.release(1), Ok(false));
        assert_eq!(a.release(1), Ok(true));
        assert_eq!(a.release(1), Err(AllocError::NotHeld(1)));
        assert_eq!(a.retain(9), Err(AllocError::NoSuchBlock(9)));
        a.check().unwrap();
        assert_eq!(a.free_count(), 2);
    }
}
