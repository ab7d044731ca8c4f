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
//!
//! ## Two block groups (sliding-window layers)
//! With windowed layers ([`KvShape::window`]) the cache keeps two block groups, as llama.cpp's
//! `llama_kv_cache_iswa` does: the global layers in one (`pool`, `table_buffer`), the local
//! layers in another, each with its own pool (its layers only), allocator and block-table buffer
//! over the same rows (a sequence's `table_base` indexes both). A sequence's local table has an
//! entry per logical block like its global one, but holds only the blocks its window can still
//! see ([`WindowRule`]): each [`KvCache::append`] first frees the local blocks that no query from
//! the step's first position on can see; their entries read `u32::MAX` (never read by the
//! kernels, which stay inside the window). Without windowed layers there is one group and
//! nothing differs.
//!
//! **Sizing the local group:** it needs, per running sequence, at most
//! [`WindowRule::decode_blocks`] blocks while decoding, plus the blocks of one step's new tokens
//! (the scheduler's step budget is shared by the batch), plus room for the prefix tree's local
//! tails: see [`KvCache::default_local_pool_tokens`]. The tree's local blocks are evicted on
//! their own when the group runs short.

use std::sync::Arc;

use crate::gpu::ops::pool::PoolBuffers;
use crate::gpu::Context;

mod prefix;
mod report;

use super::alloc::{AllocError, BlockAllocator};
use super::pool::KvPool;
use super::radix::{Allocators, CacheKey, RadixTree, NO_BLOCK};
use super::window::WindowRule;
use super::{KvDtype, KvError, KvShape};

/// Tokens of one step's new K/V that [`KvCache::default_local_pool_tokens`] makes room for in
/// the local group beyond the windows (the scheduler's default step budget is 256).
pub const LOCAL_STEP_TOKENS: u32 = 512;

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
    /// With windowed layers: logical block i → physical block of the local group, `NO_BLOCK`
    /// once freed (exactly the blocks before `first_needed_block(step_start)`). Empty without.
    local: Vec<u32>,
    /// Tokens whose K/V are (or are being) written: positions 0..len.
    len: u32,
    /// First position of the latest step appended (or where a prefix hit starts).
    step_start: u32,
}

/// The local (sliding-window) layers' block group.
struct LocalGroup {
    pool: KvPool,
    /// `[max_seqs][max_blocks_per_seq] u32`, the same rows as the global table (GPU only).
    table_buffer: Option<wgpu::Buffer>,
    rule: WindowRule,
}

pub struct KvCache {
    /// The device the pool lives on: copy-on-write and block-table uploads go through it.
    /// `None` for a cache in CPU memory (the CPU backend, [`KvCache::new_host`]), whose kernels
    /// read the tables from [`KvCache::blocks`] and [`KvCache::local_blocks`].
    ctx: Option<Arc<Context>>,
    pub layout: KvLayout,
    pub pool: KvPool,
    /// `[max_seqs][max_blocks_per_seq] u32`: each sequence's block table as the kernels read it
    /// (GPU only).
    table_buffer: Option<wgpu::Buffer>,
    pub max_blocks_per_seq: u32,
    /// The longest sequence this cache holds.
    pub max_seq_len: u32,
    seqs: Vec<Option<Sequence>>,
    key: CacheKey,
    radix: RadixTree,
    shape: KvShape,
    local: Option<LocalGroup>,
    /// Layer l → (in the local group, index of its buffers in its group's pool).
    layer_slots: Vec<(bool, usize)>,
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
    /// Token slots of the local (sliding-window) layers' pool; 0 = the default
    /// ([`KvCache::default_local_pool_tokens`]). Ignored without windowed layers.
    pub local_pool_tokens: u32,
}

impl KvCache {
    /// A cache whose pool lives in GPU buffers of `ctx`.
    pub fn new(ctx: &Arc<Context>, shape: &KvShape, config: CacheConfig) -> Result<KvCache, KvError> {
        Self::build(Some(ctx), shape, config)
    }

    /// A cache whose pool lives in CPU memory ([`crate::kv::HostPool`]), for the CPU backend:
    /// the same blocks, tables, prefix tree and snapshots, no device.
    pub fn new_host(shape: &KvShape, config: CacheConfig) -> Result<KvCache, KvError> {
        Self::build(None, shape, config)
    }

    fn build(ctx: Option<&Arc<Context>>, shape: &KvShape, config: CacheConfig) -> Result<KvCache, KvError> {
        let new_pool = |shape: &KvShape, n_blocks: u32, block_size: u32| match ctx {
            Some(ctx) => KvPool::new(ctx, shape, config.dtype, block_size, n_blocks),
            None => KvPool::new_host(shape, config.dtype, block_size, n_blocks),
        };
        let new_table = |label: &str, bytes: u64| ctx.map(|ctx| ctx.storage_zeroed(label, bytes));
        let CacheConfig { layout, dtype, block_size, pool_tokens, max_seqs, max_seq_len, prefix_cache, .. } = config;
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
        let n_local = shape.n_local();
        let pool = new_pool(&shape.with_layers(shape.n_layers - n_local), n_blocks, block_size)?;
        let max_blocks_per_seq = max_seq_len.div_ceil(block_size);
        let table_bytes = max_seqs as u64 * max_blocks_per_seq as u64 * 4;
        let table_buffer = new_table("kv.block_table", table_bytes);
        let key = CacheKey { model: shape.fingerprint, dtype, layout, block_size };
        let rule = WindowRule { window: shape.window, block_size };
        let local = if n_local == 0 {
            None
        } else {
            let local_blocks = match layout {
                KvLayout::Contiguous => max_seqs,
                KvLayout::Paged => Self::default_local_pool_tokens(shape, &config).div_ceil(block_size).min(n_blocks).max(1),
            };
            let local_blocks =
                if config.local_pool_tokens > 0 && layout == KvLayout::Paged { config.local_pool_tokens.div_ceil(block_size) } else { local_blocks };
            let pool = new_pool(&shape.with_layers(n_local), local_blocks, block_size)?;
            Some(LocalGroup { pool, table_buffer: new_table("kv.block_table.local", table_bytes), rule })
        };
        let mut radix = if local.is_some() { RadixTree::windowed(key, rule) } else { RadixTree::new(key) };
        radix.set_enabled(prefix_cache && layout == KvLayout::Paged);
        let (mut n_global_seen, mut n_local_seen) = (0, 0);
        let layer_slots = (0..shape.n_layers)
            .map(|l| {
                let counter = if shape.is_local(l) { &mut n_local_seen } else { &mut n_global_seen };
                *counter += 1;
                (shape.is_local(l), *counter - 1)
            })
            .collect();
        Ok(KvCache {
            ctx: ctx.cloned(),
            layout,
            pool,
            table_buffer,
            max_blocks_per_seq,
            max_seq_len,
            seqs: vec![None; max_seqs as usize],
            key,
            radix,
            shape: *shape,
            local,
            layer_slots,
        })
    }

    /// The local group's default size in tokens: per sequence the window's decode need
    /// ([`WindowRule::decode_blocks`]), plus one step's new tokens ([`LOCAL_STEP_TOKENS`]), and
    /// with the prefix cache as much again for the tree's local tails; never more than the
    /// global pool (what the same sequences would hold without freeing). 0 without a window.
    pub fn default_local_pool_tokens(shape: &KvShape, config: &CacheConfig) -> u32 {
        if !shape.windowed() || config.block_size == 0 {
            return 0;
        }
        let bs = config.block_size;
        let rule = WindowRule { window: shape.window, block_size: bs };
        let running = config.max_seqs as u64 * rule.decode_blocks() as u64 * bs as u64 + LOCAL_STEP_TOKENS as u64;
        let tree = if config.prefix_cache { config.max_seqs as u64 * rule.decode_blocks() as u64 * bs as u64 } else { 0 };
        (running + tree).min(config.pool_tokens.div_ceil(bs) as u64 * bs as u64).min(u32::MAX as u64) as u32
    }

    pub fn block_size(&self) -> u32 {
        self.pool.block_size
    }

    fn seq(&self, id: SeqId) -> Result<&Sequence, KvError> {
        self.seqs.get(id.0 as usize).and_then(|s| s.as_ref()).ok_or(KvError::UnknownSequence(id.0))
    }

    fn seq_mut(&mut self, id: SeqId) -> Result<&mut Sequence, KvError> {
        self.seqs.get_mut(id.0 as usize).and_then(|s| s.as_mut()).ok_or(KvError::UnknownSequence(id.0))
    }

    fn free_slot(&self) -> Result<usize, KvError> {
        self.seqs.iter().position(|s| s.is_none()).ok_or(KvError::TooManySequences(self.seqs.len() as u32))
    }

    /// Writes a sequence's table rows (both groups) from logical block `from_block` on.
    /// Nothing for a cache in CPU memory (its kernels read the tables where they are kept).
    fn upload_table(&self, id: SeqId, from_block: usize) {
        let (Ok(seq), Some(ctx), Some(table)) = (self.seq(id), &self.ctx, &self.table_buffer) else { return };
        let offset = (id.0 as u64 * self.max_blocks_per_seq as u64 + from_block as u64) * 4;
        if from_block < seq.blocks.len() {
            ctx.queue.write_buffer(table, offset, bytemuck::cast_slice(&seq.blocks[from_block..]));
        }
        if let Some(LocalGroup { table_buffer: Some(local_table), .. }) = &self.local {
            if from_block < seq.local.len() {
                ctx.queue.write_buffer(local_table, offset, bytemuck::cast_slice(&seq.local[from_block..]));
            }
        }
    }

    /// Copies block `src` into `dst` (copy-on-write) of one group's pool in a submission of its
    /// own, queued before any later step's writes to `dst`.
    fn copy_block_now(&self, local: bool, src: u32, dst: u32, label: &'static str) {
        let pool = match (&self.local, local) {
            (Some(group), true) => &group.pool,
            _ => &self.pool,
        };
        let Some(ctx) = &self.ctx else {
            pool.copy_block_host(src, dst);
            return;
        };
        let mut encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        pool.copy_block(&mut encoder, src, dst);
        ctx.submit(Some(encoder.finish()));
    }

    /// The tree and the allocators of both groups, borrowed together.
    fn tree_and_allocs(&mut self) -> (&mut RadixTree, Allocators<'_>) {
        let allocs = Allocators { global: &mut self.pool.alloc, local: self.local.as_mut().map(|g| &mut g.pool.alloc) };
        (&mut self.radix, allocs)
    }

    /// `n` free global blocks, evicting cached prefixes (least recently used first) if the free
    /// list is short. On failure nothing is taken.
    fn take_blocks(&mut self, n: u32) -> Result<Vec<u32>, KvError> {
        if self.pool.alloc.free_count() < n {
            let (radix, mut allocs) = self.tree_and_allocs();
            radix.evict_groups(&mut allocs, n)?;
        }
        Ok(self.pool.alloc.alloc(n)?)
    }

    /// `n` free local blocks, evicting the tree's local blocks if the free list is short.
    fn take_local(&mut self, n: u32) -> Result<Vec<u32>, KvError> {
        let group = self.local.as_mut().ok_or_else(|| KvError::Internal("no local block group".into()))?;
        if group.pool.alloc.free_count() < n {
            self.radix.evict_local(&mut group.pool.alloc, n)?;
        }
        Ok(group.pool.alloc.alloc(n)?)
    }

    /// `n` fresh blocks in both groups (local ones only when windowed); all or nothing.
    fn take_both(&mut self, n: u32) -> Result<(Vec<u32>, Vec<u32>), KvError> {
        let global = self.take_blocks(n)?;
        if self.local.is_none() || n == 0 {
            return Ok((global, Vec::new()));
        }
        match self.take_local(n) {
            Ok(local) => Ok((global, local)),
            Err(e) => {
                self.release(&global, &[])?;
                Err(e)
            }
        }
    }

    /// One reference fewer on each held block of both groups (`NO_BLOCK` skipped).
    fn release(&mut self, global: &[u32], local: &[u32]) -> Result<(), KvError> {
        self.each_held(global, local, |alloc, b| alloc.release(b).map(drop))
    }

    /// One reference more on each held block of both groups (`NO_BLOCK` skipped).
    fn retain(&mut self, global: &[u32], local: &[u32]) -> Result<(), KvError> {
        self.each_held(global, local, BlockAllocator::retain)
    }

    /// `op` on each global block and each held local block, with its group's allocator.
    fn each_held(&mut self, global: &[u32], local: &[u32], op: impl Fn(&mut BlockAllocator, u32) -> Result<(), AllocError>) -> Result<(), KvError> {
        for &b in global {
            op(&mut self.pool.alloc, b)?;
        }
        if let Some(group) = self.local.as_mut() {
            for &b in local.iter().filter(|&&b| b != NO_BLOCK) {
                op(&mut group.pool.alloc, b)?;
            }
        }
        Ok(())
    }

    /// A new, empty sequence. The contiguous layout reserves its whole maximum length now.
    pub fn allocate(&mut self) -> Result<SeqId, KvError> {
        let slot = self.free_slot()?;
        let mut seq = Sequence::default();
        if self.layout == KvLayout::Contiguous {
            (seq.blocks, seq.local) = self.take_both(1)?;
        }
        self.seqs[slot] = Some(seq);
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok(id)
    }

    /// Moves the sequence's step start to `step_start` (never back) and frees the local blocks
    /// that no query from there on can see (the window rule); their table entries become
    /// `u32::MAX`.
    fn slide(&mut self, id: SeqId, step_start: u32) -> Result<(), KvError> {
        let Some(rule) = self.local.as_ref().map(|g| g.rule) else { return Ok(()) };
        let seq = self.seq_mut(id)?;
        seq.step_start = seq.step_start.max(step_start);
        let to = (rule.first_needed_block(seq.step_start) as usize).min(seq.local.len());
        let Some(from) = seq.local[..to].iter().position(|&b| b != NO_BLOCK) else { return Ok(()) };
        let freed: Vec<u32> = seq.local[from..to].iter_mut().map(|b| std::mem::replace(b, NO_BLOCK)).collect();
        self.release(&[], &freed)?;
        // Only the local table's freed slots change (now NO_BLOCK).
        if let (Some(LocalGroup { table_buffer: Some(table), .. }), Some(ctx)) = (&self.local, &self.ctx) {
            let offset = (id.0 as u64 * self.max_blocks_per_seq as u64 + from as u64) * 4;
            ctx.queue.write_buffer(table, offset, bytemuck::cast_slice(&self.seq(id)?.local[from..to]));
        }
        Ok(())
    }

    /// Makes room for `n` more tokens and returns the position of the first. Blocks are taken
    /// one at a time as needed; on exhaustion the error says so and no other sequence's blocks
    /// are touched (this one's local blocks out of the window may have been freed already, which
    /// changes nothing it can read). With windowed layers, local blocks that the step's queries
    /// can no longer see go back to the local pool first.
    pub fn append(&mut self, id: SeqId, n: u32) -> Result<u32, KvError> {
        let bs = self.pool.block_size;
        let max_len = self.max_seq_len;
        let seq = self.seq(id)?;
        let start = seq.len;
        let new_len = start.checked_add(n).filter(|&l| l <= max_len).ok_or(KvError::SequenceTooLong { needed: start as u64 + n as u64, limit: max_len })?;
        if n > 0 {
            self.slide(id, start)?;
        }
        let have = self.seq(id)?.blocks.len();
        let need = new_len.div_ceil(bs) as usize;
        if need > have {
            let (fresh, fresh_local) = self.take_both((need - have) as u32)?;
            let seq = self.seq_mut(id)?;
            seq.blocks.extend(fresh);
            seq.local.extend(fresh_local);
        }
        self.seq_mut(id)?.len = new_len;
        self.upload_table(id, have);
        Ok(start)
    }

    /// Gives a sequence its own copy of logical block `i` of one group if another holder (a
    /// fork, the prefix cache) shares it.
    fn unshare(&mut self, id: SeqId, local: bool, i: usize, label: &'static str) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        let shared = if local { seq.local[i] } else { seq.blocks[i] };
        let alloc = if local { &self.local.as_ref().expect("local blocks imply a local group").pool.alloc } else { &self.pool.alloc };
        if shared == NO_BLOCK || alloc.refcount(shared) <= 1 {
            return Ok(());
        }
        let fresh = if local { self.take_local(1)?[0] } else { self.take_blocks(1)?[0] };
        self.copy_block_now(local, shared, fresh, label);
        let seq = self.seq_mut(id)?;
        if local {
            seq.local[i] = fresh;
            self.release(&[], &[shared])
        } else {
            seq.blocks[i] = fresh;
            self.release(&[shared], &[])
        }
    }

    /// Forgets the last tokens (positions `len..`) of a sequence, returning blocks it no longer
    /// needs. A kept, now partly filled last block that is shared is copied first (copy-on-write),
    /// so the sequence's next tokens never overwrite K/V that another holder reads. With
    /// windowed layers, rewinding behind what the local layers already freed is refused
    /// ([`KvError::WindowFreed`]) before anything changes.
    pub fn truncate(&mut self, id: SeqId, len: u32) -> Result<(), KvError> {
        let bs = self.pool.block_size;
        let contiguous = self.layout == KvLayout::Contiguous;
        let seq = self.seq(id)?;
        if len >= seq.len {
            return Ok(());
        }
        let keep = if contiguous { 1 } else { len.div_ceil(bs) as usize };
        if let Some(rule) = self.local.as_ref().map(|g| g.rule) {
            let first = rule.first_needed_block(len) as usize;
            if seq.local[..keep].iter().skip(first).any(|&b| b == NO_BLOCK) {
                let freed_before = seq.local.iter().rposition(|&b| b == NO_BLOCK).map_or(0, |i| i + 1) as u32 * bs;
                return Err(KvError::WindowFreed { seq: id.0, len, freed_before });
            }
        }
        // The sequence will write into its new last block from `len % bs` on: if another holder
        // (a fork, the prefix cache) shares that block, it gets its own copy first.
        if !contiguous && len % bs != 0 {
            self.unshare(id, false, keep - 1, "kv.truncate_cow")?;
            if self.local.is_some() {
                self.unshare(id, true, keep - 1, "kv.truncate_cow")?;
            }
        }
        let seq = self.seq_mut(id)?;
        seq.len = len;
        seq.step_start = seq.step_start.min(len);
        let dropped: Vec<u32> = seq.blocks.drain(keep.min(seq.blocks.len())..).collect();
        let dropped_local: Vec<u32> = seq.local.drain(keep.min(seq.local.len())..).collect();
        self.release(&dropped, &dropped_local)?;
        // A window of one position may need none of the kept local blocks.
        self.slide(id, 0)?;
        self.upload_table(id, 0);
        Ok(())
    }

    /// A new sequence with the same first `len` tokens. Paged: full blocks are shared (one more
    /// reference each, in both groups; freed local blocks stay freed); a partly filled last
    /// block is copied (copy-on-write happens here, at fork time, since the new sequence will
    /// write into it). Contiguous: the whole reservation is copied.
    pub fn fork(&mut self, src: SeqId) -> Result<SeqId, KvError> {
        let source = self.seq(src)?.clone();
        let bs = self.pool.block_size;
        let slot = self.free_slot()?;
        let full = (source.len / bs) as usize;
        let partial = source.len % bs != 0 || self.layout == KvLayout::Contiguous;
        let copy_from = if partial { source.blocks.get(full).copied() } else { None };
        // Allocate first so that failure leaves everything unchanged.
        let (fresh, fresh_local) = self.take_both(copy_from.map_or(0, |_| 1))?;
        let shared_local = &source.local[..full.min(source.local.len())];
        self.retain(&source.blocks[..full], shared_local)?;
        let mut seq = Sequence { blocks: source.blocks[..full].to_vec(), local: shared_local.to_vec(), ..source.clone() };
        if let Some(from) = copy_from {
            self.copy_block_now(false, from, fresh[0], "kv.fork");
            if let Some(&to) = fresh_local.first() {
                self.copy_block_now(true, source.local[full], to, "kv.fork");
            }
            seq.blocks.extend(fresh);
            seq.local.extend(fresh_local);
        }
        self.seqs[slot] = Some(seq);
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok(id)
    }

    /// Ends a sequence: every block it holds loses one reference.
    pub fn free(&mut self, id: SeqId) -> Result<(), KvError> {
        let seq = self.seqs.get_mut(id.0 as usize).and_then(|s| s.take()).ok_or(KvError::UnknownSequence(id.0))?;
        self.release(&seq.blocks, &seq.local)
    }

    pub fn len(&self, id: SeqId) -> Result<u32, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// The sequence's physical blocks in logical order (the global group's).
    pub fn blocks(&self, id: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.seq(id)?.blocks)
    }

    /// The sequence's local-group blocks in logical order, `u32::MAX` where freed (empty
    /// without windowed layers).
    pub fn local_blocks(&self, id: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.seq(id)?.local)
    }

    /// Sequence slots: every live `SeqId.0` is below this.
    pub fn max_seqs(&self) -> u32 {
        self.seqs.len() as u32
    }

    /// Offset (in u32 entries) of a sequence's row in `table_buffer` (and in the local group's).
    pub fn table_base(&self, id: SeqId) -> u32 {
        id.0 * self.max_blocks_per_seq
    }

    /// Live sequences.
    pub fn sequences(&self) -> Vec<SeqId> {
        self.seqs.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(i, _)| SeqId(i as u32)).collect()
    }

    /// The pool holding layer `l`'s K/V (its block group's).
    fn layer_pool(&self, l: usize) -> (&KvPool, usize) {
        match (self.layer_slots[l], &self.local) {
            ((true, i), Some(group)) => (&group.pool, i),
            ((_, i), _) => (&self.pool, i),
        }
    }

    /// Layer `l`'s K and V buffers and the block table of its group, as the kernels bind them.
    /// A GPU cache's only: the CPU backend reads [`KvCache::layer_host`].
    pub fn layer_buffers(&self, l: usize) -> PoolBuffers<'_> {
        let (pool, i) = self.layer_pool(l);
        let block_table = match (self.layer_slots[l].0, &self.local) {
            (true, Some(group)) => group.table_buffer.as_ref(),
            _ => self.table_buffer.as_ref(),
        };
        PoolBuffers { k: &pool.k[i], v: &pool.v[i], block_table: block_table.expect("a GPU cache has block-table buffers") }
    }

    /// A cache in CPU memory: layer `l`'s pool ([`KvPool::host`] holds its buffers), the index
    /// of its buffers there, and whether it is a local (windowed) layer, whose blocks are a
    /// sequence's [`KvCache::local_blocks`].
    pub fn layer_host(&self, l: usize) -> (&KvPool, usize, bool) {
        let (pool, i) = self.layer_pool(l);
        (pool, i, self.layer_slots[l].0 && self.local.is_some())
    }

    /// The global block-table buffer a GPU cache's kernels read; `None` in CPU memory.
    pub fn table_buffer(&self) -> Option<&wgpu::Buffer> {
        self.table_buffer.as_ref()
    }

    /// Whether the pool lives in CPU memory (the CPU backend).
    pub fn is_host(&self) -> bool {
        self.ctx.is_none()
    }

    /// Physical blocks of layer `l`'s group (the kernels' `n_blocks` for that layer).
    pub fn layer_blocks(&self, l: usize) -> u32 {
        self.layer_pool(l).0.n_blocks
    }

    /// Layer `l`'s sliding window, `None` for a global layer.
    pub fn window(&self, l: usize) -> Option<u32> {
        self.shape.layer_window(l as u32)
    }

    /// The KV dtype of every group.
    pub fn dtype(&self) -> KvDtype {
        self.pool.dtype
    }

    /// The local group's pool (its layers' buffers and allocator); `None` without windowed layers.
    pub fn local_pool(&self) -> Option<&KvPool> {
        self.local.as_ref().map(|g| &g.pool)
    }

    /// GPU bytes of every group's pool.
    pub fn bytes_total(&self) -> u64 {
        self.pool.bytes_total() + self.local.as_ref().map_or(0, |g| g.pool.bytes_total())
    }

    /// K/V bytes of one token over all layers, what it costs before window-aware freeing.
    pub fn bytes_per_token(&self) -> u64 {
        self.pool.bytes_per_token() + self.local.as_ref().map_or(0, |g| g.pool.bytes_per_token())
    }

    /// K/V bytes of the blocks a sequence's tables reference (both groups, slots not yet
    /// written included).
    pub fn bytes_held(&self, id: SeqId) -> Result<u64, KvError> {
        let seq = self.seq(id)?;
        let local = self.local.as_ref().map_or(0, |g| seq.local.iter().filter(|&&b| b != NO_BLOCK).count() as u64 * g.pool.bytes_per_block());
        Ok(seq.blocks.len() as u64 * self.pool.bytes_per_block() + local)
    }
}
