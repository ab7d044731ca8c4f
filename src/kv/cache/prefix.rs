//! The prefix cache side of the KV cache: sequences that start from the longest cached prefix of
//! their prompt, finished sequences handed to the tree ([`RadixTree`]), eviction, and KV
//! snapshots of cached prefixes.

use crate::kv::radix::{CacheKey, PrefixStats, NO_BLOCK};
use crate::kv::snapshot::LayerBlocks;
use crate::kv::KvError;

use super::{KvCache, KvLayout, SeqId, Sequence};

impl KvCache {
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
            self.reset_prefix_cache()?;
        }
        self.radix.set_enabled(enabled);
        Ok(())
    }

    /// A new sequence for `prompt` that already holds the longest cached prefix of
    /// `prompt[..len - 1]` whose K/V every layer still has (the last prompt token is always
    /// computed, so that its logits exist; see [`RadixTree`] for the local layers' rule). Full
    /// cached blocks are shared; a block matched only in part is copied (copy-on-write) into a
    /// fresh block, which the sequence then writes its next tokens into. Returns the sequence
    /// and the number of prompt tokens whose K/V it already has (prefill starts there).
    pub fn allocate_for_prompt(&mut self, prompt: &[u32]) -> Result<(SeqId, u32), KvError> {
        if !self.radix.enabled() || prompt.len() < 2 {
            let id = self.allocate()?;
            if self.radix.enabled() {
                self.radix.record_request(prompt.len() as u32, 0);
            }
            return Ok((id, 0));
        }
        let slot = self.free_slot()?;
        let limit = (prompt.len() - 1).min(self.max_seq_len as usize);
        let m = self.radix.match_prefix(&self.key, &prompt[..limit])?;
        // Hold what was matched before taking fresh blocks, which may evict.
        self.retain(&m.blocks, &m.local)?;
        let (mut blocks, mut local) = (m.blocks.clone(), m.local.clone());
        if let Some((src, _)) = m.partial {
            let src_local: Vec<u32> = m.partial_local.into_iter().collect();
            self.retain(&[src], &src_local)?;
            let fresh = self.take_both(1);
            let release = self.release(&[src], &src_local);
            let (fresh, fresh_local) = match fresh {
                Ok(f) => f,
                Err(e) => {
                    self.release(&m.blocks, &m.local)?;
                    return Err(e);
                }
            };
            release?;
            self.copy_block_now(false, src, fresh[0], "kv.prefix_cow");
            if let (Some(&from), Some(&to)) = (src_local.first(), fresh_local.first()) {
                self.copy_block_now(true, from, to, "kv.prefix_cow");
            }
            blocks.extend(fresh);
            local.extend(fresh_local);
        }
        self.radix.record_request(prompt.len() as u32, m.tokens);
        self.seqs[slot] = Some(Sequence { blocks, local, len: m.tokens, step_start: m.tokens });
        let id = SeqId(slot as u32);
        self.upload_table(id, 0);
        Ok((id, m.tokens))
    }

    /// How many leading tokens of `tokens` the prefix cache would give (0 when it is off),
    /// without marking anything as recently used.
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
    /// Local blocks go with them where the sequence still holds them. A no-op with the prefix
    /// cache off.
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
        let local = seq.local[..full.min(seq.local.len())].to_vec();
        let (key, tokens) = (self.key, &tokens[..full * self.pool.block_size as usize]);
        let (radix, mut allocs) = self.tree_and_allocs();
        radix.publish_groups(&key, (tokens, &blocks, &local), &mut allocs)
    }

    /// Ends a sequence whose K/V hold `tokens` (at least its length; extra trailing ids, such as
    /// a sampled token never fed back, are ignored): with the prefix cache on, its blocks go to
    /// the tree for later prompts (local ones where still held); then the sequence is freed.
    pub fn finish(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        if self.radix.enabled() && seq.len > 0 {
            let len = seq.len as usize;
            if tokens.len() < len {
                return Err(KvError::Internal(format!("sequence {} holds {len} tokens, {} ids given", id.0, tokens.len())));
            }
            let (blocks, local, key) = (seq.blocks.clone(), seq.local.clone(), self.key);
            let (radix, mut allocs) = self.tree_and_allocs();
            radix.insert_groups(&key, (&tokens[..len], &blocks, &local), &mut allocs)?;
        }
        self.free(id)
    }

    /// Drops every cached prefix; blocks that no sequence holds return to the free list.
    pub fn reset_prefix_cache(&mut self) -> Result<(), KvError> {
        let (radix, mut allocs) = self.tree_and_allocs();
        radix.clear_groups(&mut allocs)
    }

    /// Evicts cached prefixes until `free` global blocks are free (or nothing more can go);
    /// returns the blocks evicted.
    pub fn evict(&mut self, free: u32) -> Result<u32, KvError> {
        let (radix, mut allocs) = self.tree_and_allocs();
        radix.evict_groups(&mut allocs, free)
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.radix.stats()
    }

    /// Each layer's pool, buffer and the given blocks of its group, for snapshots.
    fn layer_blocks_of<'a>(&'a self, blocks: &'a [u32], local: &'a [u32]) -> Vec<LayerBlocks<'a>> {
        (0..self.shape.n_layers as usize)
            .map(|l| {
                let (pool, buffer) = self.layer_pool(l);
                LayerBlocks { pool, buffer, blocks: if self.layer_slots[l].0 { local } else { blocks } }
            })
            .collect()
    }

    /// Serializes the K/V of `tokens` (all of them must be cached: see
    /// [`KvCache::peek_prefix`]) as a snapshot ([`crate::kv::snapshot`]); with windowed layers only
    /// the local blocks a query after the last token can see.
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
        let mut local = m.local.clone();
        local.extend(m.partial_local);
        crate::kv::snapshot::export(self.ctx.as_deref(), &self.layer_blocks_of(&blocks, &local), &self.key, &self.shape, tokens).await
    }

    /// Loads a snapshot into the prefix cache: its blocks are allocated (evicting cached
    /// prefixes if needed), uploaded and inserted under its tokens, so the next prompt that
    /// starts with them hits. Returns the tokens. A snapshot of another model or cache format
    /// (window included), or a damaged one, is refused before anything changes.
    pub fn import(&mut self, bytes: &[u8], vocab: u32) -> Result<Vec<u32>, KvError> {
        if !self.radix.enabled() {
            return Err(KvError::Config("snapshots need the prefix cache (paged layout)".into()));
        }
        let snap = crate::kv::snapshot::parse(bytes, &self.pool, &self.key, &self.shape, vocab)?;
        let n = snap.tokens.len() as u32;
        if n > self.max_seq_len {
            return Err(KvError::SequenceTooLong { needed: n as u64, limit: self.max_seq_len });
        }
        // A sequence holding what the window keeps after the last token: the local blocks
        // before it are never taken.
        let slot = self.free_slot()?;
        let n_blocks = n.div_ceil(self.pool.block_size);
        let blocks = self.take_blocks(n_blocks)?;
        let mut local = Vec::new();
        if let Some(rule) = self.local.as_ref().map(|g| g.rule) {
            let first = rule.first_needed_block(n).min(n_blocks);
            match self.take_local(n_blocks - first) {
                Ok(kept) => local = std::iter::repeat_n(NO_BLOCK, first as usize).chain(kept).collect(),
                Err(e) => {
                    self.release(&blocks, &[])?;
                    return Err(e);
                }
            }
        }
        snap.upload(self.ctx.as_deref(), &self.layer_blocks_of(&blocks, &local))?;
        self.seqs[slot] = Some(Sequence { blocks, local, len: n, step_start: n });
        self.finish(SeqId(slot as u32), &snap.tokens)?;
        Ok(snap.tokens)
    }
}
