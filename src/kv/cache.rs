//! The KV cache as the model and the scheduler see it: sequences with block tables over a
//! [`KvPool`], and the operations allocate, append, fork, free, `stats` and `check_integrity`.
//!
//! Two layouts sit behind this one interface:
//! - **paged**: blocks of `block_size` tokens (default 16), taken one at a time as a sequence grows;
//! - **contiguous** (the baseline): one block of the maximum sequence length per sequence,
//!   reserved whole when the sequence is allocated.
//!
//! The GPU reads a sequence through its row of the block-table buffer
//! (`[max_seqs][max_blocks_per_seq] u32`), written whenever a block is added.
//!
//! With the paged layout the cache also keeps a prefix cache ([`RadixTree`]): a sequence started
//! with [`KvCache::allocate_for_prompt`] begins with the longest cached prefix of its prompt, and
//! [`KvCache::finish`] hands a finished sequence's blocks to the tree. When the pool runs short,
//! the tree's least recently used blocks that no sequence holds are evicted before anything fails.

use std::sync::Arc;

use crate::gpu::Context;

use super::pool::{KvPool, PoolStats};
use super::radix::{CacheKey, PrefixStats, RadixTree};
use super::{IntegrityError, KvDtype, KvError, KvShape};

/// Where a sequence's KV cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvLayout {
    /// One reservation of the maximum length per sequence (the baseline).
    Contiguous,
    /// Fixed-size blocks from a shared pool, found through a per-sequence block table.
    Paged,
}

/// A sequence's handle (its slot in the block-table buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

#[derive(Clone, Debug, Default)]
struct Sequence {
    /// Logical block i → physical block.
    blocks: Vec<u32>,
    /// Tokens whose K/V are (or are being) written: positions 0..len.
    len: u32,
}

pub struct KvCache {
    /// The device the pool lives on: copy-on-write and block-table uploads go through it.
    ctx: Arc<Context>,
    pub layout: KvLayout,
    pub pool: KvPool,
    /// `[max_seqs][max_blocks_per_seq] u32`: each sequence's block table as the kernels read it.
    pub table_buffer: wgpu::Buffer,
    pub max_blocks_per_seq: u32,
    /// The longest sequence this cache holds.
    pub max_seq_len: u32,
    seqs: Vec<Option<Sequence>>,
    key: CacheKey,
    radix: RadixTree,
}

/// How to size a cache.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    pub layout: KvLayout,
    pub dtype: KvDtype,
    /// Tokens per block (paged only; the contiguous layout uses `max_seq_len`).
    pub block_size: u32,
    /// Token slots in the pool (paged); the contiguous layout reserves `max_seqs × max_seq_len`.
    pub pool_tokens: u32,
    pub max_seqs: u32,
    pub max_seq_len: u32,
    /// Keep finished sequences' blocks for reuse by later prompts (paged layout only).
    pub prefix_cache: bool,
}

impl KvCache {
    pub fn new(ctx: &Arc<Context>, shape: &KvShape, config: CacheConfig) -> Result<KvCache, KvError> {
        let CacheConfig { layout, dtype, block_size, pool_tokens, max_seqs, max_seq_len, prefix_cache } = config;
        if max_seqs == 0 || max_seq_len == 0 {
            return Err(KvError::Config("max_seqs and max_seq_len must be at least 1".into()));
        }
        let (block_size, n_blocks) = match layout {
            KvLayout::Contiguous => (max_seq_len, max_seqs),
            KvLayout::Paged => {
                if block_size == 0 {
                    return Err(KvError::Config("block size must be at least 1".into()));
                }
                (block_size, pool_tokens.div_ceil(block_size).max(1))
            }
        };
        let pool = KvPool::new(ctx, shape, dtype, block_size, n_blocks)?;
        let max_blocks_per_seq = max_seq_len.div_ceil(block_size);
        let table_buffer = ctx.storage_zeroed("kv.block_table", max_seqs as u64 * max_blocks_per_seq as u64 * 4);
        let key = CacheKey { model: shape.fingerprint, dtype, layout, block_size };
        let mut radix = RadixTree::new(key);
        radix.set_enabled(prefix_cache && layout == KvLayout::Paged);
        Ok(KvCache {
            ctx: ctx.clone(),
            layout,
            pool,
            table_buffer,
            max_blocks_per_seq,
            max_seq_len,
            seqs: vec![None; max_seqs as usize],
            key,
            radix,
        })
    }

    pub fn block_size(&self) -> u32 {
        self.pool.block_size
    }

    fn seq(&self, id: SeqId) -> Result<&Sequence, KvError> {
        self.seqs.get(id.0 as usize).and_then(|s| s.as_ref()).ok_or(KvError::UnknownSequence(id.0))
    }

    fn upload_table(&self, id: SeqId, from_block: usize) {
        if let Ok(seq) = self.seq(id) {
            if from_block < seq.blocks.len() {
                let offset = (id.0 as u64 * self.max_blocks_per_seq as u64 + from_block as u64) * 4;
                self.ctx.queue.write_buffer(&self.table_buffer, offset, bytemuck::cast_slice(&seq.blocks[from_block..]));
            }
        }
    }

    /// `n` free blocks, evicting cached prefixes (least recently used first) if the free list is
    /// short. On failure nothing is taken.
    /// Copies block `src` into `dst` (copy-on-write) in a submission of its own, queued before
    /// any later step's writes to `dst`.
    fn copy_block_now(&self, src: u32, dst: u32, label: &'static str) {
        let mut encoder = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        self.pool.copy_block(&mut encoder, src, dst);
        self.ctx.queue.submit(Some(encoder.finish()));
    }

    fn take_blocks(&mut self, n: u32) -> Result<Vec<u32>, KvError> {
        if self.pool.alloc.free_count() < n {
            self.radix.evict(&mut self.pool.alloc, n)?;
        }
        Ok(self.pool.alloc.alloc(n)?)
    }

    /// A new, empty sequence. The contiguous layout reserves its whole maximum length now.
    pub fn allocate(&mut self) -> Result<SeqId, KvError> {
        let slot = self.seqs.iter().position(|s| s.is_none()).ok_or(KvError::TooManySequences(self.seqs.len() as u32))?;
        let mut seq = Sequence::default();
        if self.layout == KvLayout::Contiguous {
            seq.blocks = self.take_blocks(1)?;
        }
        self.seqs[slot] = Some(seq);
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok(id)
    }

    /// Makes room for `n` more tokens and returns the position of the first. Blocks are taken
    /// one at a time as needed; on exhaustion nothing changes and the error says so (no other
    /// sequence's blocks are touched).
    pub fn append(&mut self, id: SeqId, n: u32) -> Result<u32, KvError> {
        let bs = self.pool.block_size;
        let max_len = self.max_seq_len;
        let seq = self.seq(id)?;
        let start = seq.len;
        let new_len = start.checked_add(n).filter(|&l| l <= max_len).ok_or(KvError::SequenceTooLong {
            needed: start as u64 + n as u64,
            limit: max_len,
        })?;
        let have = seq.blocks.len();
        let need = new_len.div_ceil(bs) as usize;
        if need > have {
            let fresh = self.take_blocks((need - have) as u32)?;
            let seq = self.seqs[id.0 as usize].as_mut().expect("checked above");
            seq.blocks.extend(fresh);
        }
        self.seqs[id.0 as usize].as_mut().expect("checked above").len = new_len;
        self.upload_table(id, have);
        Ok(start)
    }

    /// Forgets the last tokens (positions `len..`) of a sequence, returning blocks it no longer
    /// needs. A kept, now partly filled last block that is shared is copied first (copy-on-write),
    /// so the sequence's next tokens never overwrite K/V that another holder reads.
    pub fn truncate(&mut self, id: SeqId, len: u32) -> Result<(), KvError> {
        let bs = self.pool.block_size;
        let contiguous = self.layout == KvLayout::Contiguous;
        let seq = self.seqs.get_mut(id.0 as usize).and_then(|s| s.as_mut()).ok_or(KvError::UnknownSequence(id.0))?;
        if len >= seq.len {
            return Ok(());
        }
        let keep = if contiguous { 1 } else { len.div_ceil(bs) as usize };
        // The sequence will write into its new last block from `len % bs` on: if another holder
        // (a fork, the prefix cache) shares that block, it gets its own copy first.
        let last = (!contiguous && len % bs != 0).then(|| seq.blocks[keep - 1]).filter(|&b| self.pool.alloc.refcount(b) > 1);
        if let Some(shared) = last {
            let fresh = self.take_blocks(1)?[0];
            self.copy_block_now(shared, fresh, "kv.truncate_cow");
            self.pool.alloc.release(shared)?;
            self.seqs[id.0 as usize].as_mut().expect("checked above").blocks[keep - 1] = fresh;
        }
        let seq = self.seqs[id.0 as usize].as_mut().expect("checked above");
        seq.len = len;
        let dropped: Vec<u32> = seq.blocks.drain(keep.min(seq.blocks.len())..).collect();
        for b in dropped {
            self.pool.alloc.release(b)?;
        }
        self.upload_table(id, 0);
        Ok(())
    }

    /// A new sequence with the same first `len` tokens. Paged: full blocks are shared (one more
    /// reference each); a partly filled last block is copied (copy-on-write happens here, at fork
    /// time, since the new sequence will write into it). Contiguous: the whole reservation is copied.
    pub fn fork(&mut self, src: SeqId) -> Result<SeqId, KvError> {
        let source = self.seq(src)?.clone();
        let bs = self.pool.block_size;
        let slot = self.seqs.iter().position(|s| s.is_none()).ok_or(KvError::TooManySequences(self.seqs.len() as u32))?;
        let full = (source.len / bs) as usize;
        let partial = source.len % bs != 0 || self.layout == KvLayout::Contiguous;
        let copy_from = if partial { source.blocks.get(full).copied() } else { None };
        let mut blocks = Vec::with_capacity(source.blocks.len());
        if let Some(_) = copy_from {
            // Allocate first so that failure leaves everything unchanged.
            let fresh = self.take_blocks(1)?;
            for &b in &source.blocks[..full] {
                self.pool.alloc.retain(b)?;
            }
            blocks.extend_from_slice(&source.blocks[..full]);
            blocks.extend(fresh);
        } else {
            for &b in &source.blocks[..full] {
                self.pool.alloc.retain(b)?;
            }
            blocks.extend_from_slice(&source.blocks[..full]);
        }
        if let (Some(from), Some(&to)) = (copy_from, blocks.last()) {
            self.copy_block_now(from, to, "kv.fork");
        }
        self.seqs[slot] = Some(Sequence { blocks, len: source.len });
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok(id)
    }

    /// Ends a sequence: every block it holds loses one reference.
    pub fn free(&mut self, id: SeqId) -> Result<(), KvError> {
        let seq = self.seqs.get_mut(id.0 as usize).and_then(|s| s.take()).ok_or(KvError::UnknownSequence(id.0))?;
        for b in seq.blocks {
            self.pool.alloc.release(b)?;
        }
        Ok(())
    }

    pub fn len(&self, id: SeqId) -> Result<u32, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// The sequence's physical blocks in logical order.
    pub fn blocks(&self, id: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.seq(id)?.blocks)
    }

    /// Offset (in u32 entries) of a sequence's row in `table_buffer`.
    pub fn table_base(&self, id: SeqId) -> u32 {
        id.0 * self.max_blocks_per_seq
    }

    /// Live sequences.
    pub fn sequences(&self) -> Vec<SeqId> {
        self.seqs.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(i, _)| SeqId(i as u32)).collect()
    }

    pub fn stats(&self) -> PoolStats {
        let live_tokens: u64 = self.seqs.iter().flatten().map(|s| s.len as u64).sum();
        let held = self.pool.alloc.used_count();
        let cached = self.radix.blocks().iter().filter(|&&b| self.pool.alloc.refcount(b) == 1).count() as u32;
        let used = held - cached;
        let slots = used as u64 * self.pool.block_size as u64;
        PoolStats {
            kv_dtype: self.pool.dtype.name(),
            block_size: self.pool.block_size,
            blocks_total: self.pool.n_blocks,
            blocks_used: used,
            blocks_free: self.pool.alloc.free_count(),
            blocks_cached: cached,
            bytes_total: self.pool.bytes_total(),
            bytes_per_token: self.pool.bytes_per_token() as f64,
            live_tokens,
            internal_fragmentation: slots.saturating_sub(live_tokens),
        }
    }

    /// Verifies the cache's invariants: the allocator's own (free list and refcounts agree), the
    /// prefix tree's own, every block's refcount equals the number of tables holding it plus the
    /// tree's reference plus `external[b]` (holders outside the cache), no table holds a block
    /// twice, each table has exactly the blocks its length needs, and no block a sequence holds
    /// hangs in the tree below one that only the tree holds (which eviction could not reach).
    pub fn check_integrity_with(&self, external: &dyn Fn(u32) -> u32) -> Result<(), IntegrityError> {
        self.check_with(external).map_err(IntegrityError)
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
            let mut seen = seq.blocks.clone();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("sequence {i} holds a block twice"));
            }
            for &b in &seq.blocks {
                let h = holders.get_mut(b as usize).ok_or_else(|| format!("sequence {i} holds block {b}, past the pool"))?;
                *h += 1;
            }
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

    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        self.check_integrity_with(&|_| 0)
    }

    /// The identity of the KV data this cache stores.
    pub fn key(&self) -> CacheKey {
        self.key
    }

    /// Whether finished sequences are kept for reuse.
    pub fn prefix_cache_enabled(&self) -> bool {
        self.radix.enabled()
    }

    /// Turns prefix reuse on or off (off also drops what is cached). Only the paged layout can
    /// share blocks; asking the contiguous layout for it is an error.
    pub fn set_prefix_cache(&mut self, enabled: bool) -> Result<(), KvError> {
        if enabled && self.layout != KvLayout::Paged {
            return Err(KvError::Config("the prefix cache needs the paged layout".into()));
        }
        if !enabled {
            self.radix.clear(&mut self.pool.alloc)?;
        }
        self.radix.set_enabled(enabled);
        Ok(())
    }

    /// A new sequence for `prompt` that already holds the longest cached prefix of
    /// `prompt[..len - 1]` (the last prompt token is always computed, so that its logits exist).
    /// Full cached blocks are shared; a block matched only in part is copied (copy-on-write)
    /// into a fresh block, which the sequence then writes its next tokens into. Returns the
    /// sequence and the number of prompt tokens whose K/V it already has (prefill starts there).
    pub fn allocate_for_prompt(&mut self, prompt: &[u32]) -> Result<(SeqId, u32), KvError> {
        if !self.radix.enabled() || prompt.len() < 2 {
            let id = self.allocate()?;
            if self.radix.enabled() {
                self.radix.record_request(prompt.len() as u32, 0);
            }
            return Ok((id, 0));
        }
        let slot = self.seqs.iter().position(|s| s.is_none()).ok_or(KvError::TooManySequences(self.seqs.len() as u32))?;
        let limit = (prompt.len() - 1).min(self.max_seq_len as usize);
        let m = self.radix.match_prefix(&self.key, &prompt[..limit])?;
        // Hold what was matched before taking a fresh block, which may evict.
        for &b in &m.blocks {
            self.pool.alloc.retain(b)?;
        }
        let mut blocks = m.blocks.clone();
        if let Some((src, _)) = m.partial {
            self.pool.alloc.retain(src)?;
            let fresh = self.take_blocks(1);
            let release = self.pool.alloc.release(src);
            let fresh = match fresh {
                Ok(f) => f,
                Err(e) => {
                    for &b in &m.blocks {
                        self.pool.alloc.release(b)?;
                    }
                    return Err(e);
                }
            };
            release?;
            self.copy_block_now(src, fresh[0], "kv.prefix_cow");
            blocks.extend(fresh);
        }
        self.radix.record_request(prompt.len() as u32, m.tokens);
        self.seqs[slot] = Some(Sequence { blocks, len: m.tokens });
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok((id, m.tokens))
    }

    /// How many leading tokens of `tokens` the prefix cache holds (0 when it is off), without
    /// marking anything as recently used.
    pub fn peek_prefix(&self, tokens: &[u32]) -> u32 {
        if self.radix.enabled() {
            self.radix.peek(&self.key, tokens)
        } else {
            0
        }
    }

    /// Shares a live sequence's computed prefix: the full blocks of `tokens[..len]` (`len` = the
    /// sequence's length) go to the prefix tree now, so that requests admitted while this one is
    /// still running reuse them instead of computing them again. Only full blocks are published:
    /// the sequence never writes into them again ([`KvCache::truncate`] copies a shared block
    /// before the sequence could), whereas its partly filled last block is still being written.
    /// A no-op with the prefix cache off.
    pub fn publish(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        if !self.radix.enabled() {
            return Ok(());
        }
        let len = seq.len as usize;
        if tokens.len() < len {
            return Err(KvError::Internal(format!("sequence {} holds {len} tokens, {} ids given", id.0, tokens.len())));
        }
        let full = len / self.pool.block_size as usize;
        if full == 0 {
            return Ok(());
        }
        let blocks = seq.blocks[..full].to_vec();
        self.radix.publish(&self.key, &tokens[..full * self.pool.block_size as usize], &blocks, &mut self.pool.alloc)
    }

    /// Ends a sequence whose K/V hold `tokens` (at least its length; extra trailing ids, such as
    /// a sampled token never fed back, are ignored): with the prefix cache on, its blocks go to
    /// the tree for later prompts; then the sequence is freed.
    pub fn finish(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        if self.radix.enabled() && seq.len > 0 {
            let len = seq.len as usize;
            if tokens.len() < len {
                return Err(KvError::Internal(format!("sequence {} holds {len} tokens, {} ids given", id.0, tokens.len())));
            }
            let blocks = seq.blocks.clone();
            self.radix.insert(&self.key, &tokens[..len], &blocks, &mut self.pool.alloc)?;
        }
        self.free(id)
    }

    /// Drops every cached prefix; blocks that no sequence holds return to the free list.
    pub fn reset_prefix_cache(&mut self) -> Result<(), KvError> {
        self.radix.clear(&mut self.pool.alloc)
    }

    /// Evicts cached prefixes until `free` blocks are free (or nothing more can go); returns the
    /// blocks evicted.
    pub fn evict(&mut self, free: u32) -> Result<u32, KvError> {
        self.radix.evict(&mut self.pool.alloc, free)
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.radix.stats()
    }

    /// Per physical block: 0 free, 1 held by a live sequence, 2 held only by the prefix cache.
    pub fn block_states(&self) -> Vec<u8> {
        let mut states = vec![0u8; self.pool.n_blocks as usize];
        for b in self.radix.blocks() {
            states[b as usize] = 2;
        }
        for seq in self.seqs.iter().flatten() {
            for &b in &seq.blocks {
                states[b as usize] = 1;
            }
        }
        states
    }

    /// Per physical block, its reference count.
    pub fn refcounts(&self) -> Vec<u32> {
        (0..self.pool.n_blocks).map(|b| self.pool.alloc.refcount(b)).collect()
    }

    /// Serializes the K/V of `tokens` (all of them must be cached: see
    /// [`KvCache::peek_prefix`]) as a snapshot ([`super::snapshot`]).
    pub async fn export_prefix(&mut self, tokens: &[u32]) -> Result<Vec<u8>, KvError> {
        if tokens.is_empty() {
            return Err(KvError::Config("nothing to export: no tokens".into()));
        }
        if !self.radix.enabled() {
            return Err(KvError::Config("snapshots need the prefix cache (paged layout)".into()));
        }
        let m = self.radix.match_prefix(&self.key, tokens)?;
        if (m.tokens as usize) < tokens.len() {
            return Err(KvError::Config(format!("only {} of the {} tokens are cached", m.tokens, tokens.len())));
        }
        let mut blocks = m.blocks.clone();
        blocks.extend(m.partial.map(|(b, _)| b));
        super::snapshot::export(&self.ctx, &self.pool, &self.key, tokens, &blocks).await
    }

    /// Loads a snapshot into the prefix cache: its blocks are allocated (evicting cached
    /// prefixes if needed), uploaded and inserted under its tokens, so the next prompt that
    /// starts with them hits. Returns the tokens. A snapshot of another model or cache format,
    /// or a damaged one, is refused before anything changes.
    pub fn import(&mut self, bytes: &[u8], vocab: u32) -> Result<Vec<u32>, KvError> {
        if !self.radix.enabled() {
            return Err(KvError::Config("snapshots need the prefix cache (paged layout)".into()));
        }
        let snap = super::snapshot::parse(bytes, &self.pool, &self.key, vocab)?;
        if snap.tokens.len() as u32 > self.max_seq_len {
            return Err(KvError::SequenceTooLong { needed: snap.tokens.len() as u64, limit: self.max_seq_len });
        }
        let id = self.allocate()?;
        if let Err(e) = self.append(id, snap.tokens.len() as u32) {
            self.free(id)?;
            return Err(e);
        }
        let blocks = self.blocks(id)?.to_vec();
        for (i, &b) in blocks.iter().enumerate() {
            snap.upload_block(&self.ctx, &self.pool, i as u32, b);
        }
        self.finish(id, &snap.tokens)?;
        Ok(snap.tokens)
    }
}
