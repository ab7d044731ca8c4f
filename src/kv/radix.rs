//! The prefix cache: a radix tree over token ids at block granularity (RadixAttention).
//!
//! Every node below the root stands for one physical KV block and the token ids whose K/V it
//! holds: a **full** node holds `block_size` tokens and may have children (the blocks that
//! followed it in some sequence); a **partial** node holds fewer and is always a leaf (the last,
//! partly filled block of a finished sequence). A path from the root spells a token prefix, and
//! its blocks hold that prefix's K/V at positions `0..len`, so any sequence starting with the same
//! tokens can read them instead of recomputing.
//!
//! ## Ownership
//! The tree holds one reference (in the pool's [`BlockAllocator`]) to each block it stores; live
//! sequences hold their own. A block in the tree is never written again: full blocks have no free
//! slot, and a partial block is only ever *copied* into a new sequence (copy-on-write), whose
//! writes then go to the copy. A block is evictable when the tree's is its only reference.
//!
//! ## Eviction
//! Least recently used first, leaves only (a block is useless without the blocks before it), and
//! only blocks no live sequence holds. Evicting a leaf can make its parent a leaf in turn.
//!
//! ## Sliding-window layers
//! A cache with windowed layers has a second block group ([`super::window`]). Each node then also
//! records its block in that group, or `u32::MAX` when the local block is gone: freed by the
//! sequence once out of its window before it was published, or evicted from the tree since. A
//! cached prefix of m tokens is usable only if the global blocks of `0..m` are there (the path)
//! **and** the local blocks that a query at position m can see are
//! ([`WindowRule::first_needed_block`]`(m)` up to the block of m − 1). The match walks down the
//! path as before, then takes the longest usable m: the whole match if its local tail is there,
//! otherwise the longest block boundary `k · block_size` whose local tail is. Blocks before the
//! tail are not taken, even when present: the new sequence would free them at its first step.
//!
//! Local blocks are evicted on their own, from any node, when the local group runs short: a
//! missing local block only shortens matches that end within a window after it. Least recently
//! used first, and among equals the earliest positions first (the tails of paths are what
//! later prompts need). Evicting a node's global block (a leaf) also releases its local block.
//!
//! ## Keying
//! Stored K/V depend on the model, the KV dtype, the layout and the block size; a tree is made for
//! one [`CacheKey`] and refuses lookups and inserts under another, so nothing cached under one can
//! be read as the other.

use super::alloc::BlockAllocator;
use super::window::WindowRule;
use super::{KvDtype, KvError, KvLayout};

/// No block in this group (a local block that is gone).
pub const NO_BLOCK: u32 = u32::MAX;

/// The allocators of the groups whose blocks the tree holds: the global group's, and the local
/// (sliding-window) group's when the cache has one.
pub struct Allocators<'a> {
    pub global: &'a mut BlockAllocator,
    pub local: Option<&'a mut BlockAllocator>,
}

impl Allocators<'_> {
    fn local(&mut self) -> Result<&mut BlockAllocator, KvError> {
        self.local.as_deref_mut().ok_or_else(|| KvError::Internal("the prefix tree holds local blocks but no local allocator was given".into()))
    }
}

/// Everything that changes what a cached block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CacheKey {
    /// [`super::KvShape::fingerprint`].
    pub model: u64,
    pub dtype: KvDtype,
    pub layout: KvLayout,
    pub block_size: u32,
}

/// The longest cached prefix of a token sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Full blocks holding the first `blocks.len() × block_size` tokens, shareable as they are.
    pub blocks: Vec<u32>,
    /// A block whose first `n` tokens continue the prefix (a partial node, or a full node that
    /// matches only part of the way): to be copied, not shared, since the new sequence writes
    /// its next tokens into it.
    pub partial: Option<(u32, u32)>,
    /// Tokens covered: `blocks.len() × block_size + partial n`.
    pub tokens: u32,
    /// With windowed layers: per block of `blocks`, its local block to share, [`NO_BLOCK`] for
    /// blocks before the window's tail (see the module documentation). Empty without.
    pub local: Vec<u32>,
    /// The partial block's local block (to be copied like `partial`).
    pub partial_local: Option<u32>,
}

/// Counters of the prefix cache since it was made (or reset).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PrefixStats {
    pub enabled: bool,
    /// Requests that looked up a prefix.
    pub requests: u64,
    /// Prompt tokens of those requests.
    pub prompt_tokens: u64,
    /// Of those, tokens whose K/V came from the cache.
    pub hit_tokens: u64,
    /// `hit_tokens / prompt_tokens`.
    pub hit_rate: f64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks the tree holds now.
    pub nodes: u32,
}

#[derive(Clone, Debug)]
struct Node {
    tokens: Vec<u32>,
    block: u32,
    /// The block in the local group, [`NO_BLOCK`] when gone (or without windowed layers).
    local: u32,
    /// Position of the node's first token.
    start: u32,
    parent: usize,
    children: Vec<usize>,
    last_used: u64,
}

const ROOT: usize = 0;

pub struct RadixTree {
    key: CacheKey,
    block_size: u32,
    /// The local group's rule; `None` without windowed layers.
    window: Option<WindowRule>,
    /// Arena; `None` marks a free slot. Slot 0 is the root (no block).
    nodes: Vec<Option<Node>>,
    free_slots: Vec<usize>,
    clock: u64,
    stats: PrefixStats,
}

impl RadixTree {
    pub fn new(key: CacheKey) -> RadixTree {
        let root = Node { tokens: Vec::new(), block: NO_BLOCK, local: NO_BLOCK, start: 0, parent: ROOT, children: Vec::new(), last_used: 0 };
        RadixTree {
            key,
            block_size: key.block_size,
            window: None,
            nodes: vec![Some(root)],
            free_slots: Vec::new(),
            clock: 0,
            stats: PrefixStats { enabled: true, ..Default::default() },
        }
    }

    /// A tree whose nodes also hold local blocks under `rule` (see the module documentation).
    pub fn windowed(key: CacheKey, rule: WindowRule) -> RadixTree {
        RadixTree { window: Some(rule), ..RadixTree::new(key) }
    }

    pub fn key(&self) -> CacheKey {
        self.key
    }

    fn check_key(&self, key: &CacheKey) -> Result<(), KvError> {
        if *key != self.key {
            return Err(KvError::CacheKeyMismatch(format!("the cache holds {:?}, asked for {:?}", self.key, key)));
        }
        Ok(())
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node index")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node index")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch_path(&mut self, mut i: usize, now: u64) {
        while i != ROOT {
            let n = self.node_mut(i);
            n.last_used = now;
            i = n.parent;
        }
    }

    /// The path of `tokens` in the tree: the full nodes matched whole, then the node matched
    /// in part (a partial node, or a full one whose tokens diverge) with the tokens it matches.
    fn walk(&self, tokens: &[u32]) -> (Vec<usize>, Option<(usize, usize)>) {
        let bs = self.block_size as usize;
        let (mut path, mut cur, mut pos) = (Vec::new(), ROOT, 0usize);
        while pos < tokens.len() {
            let chunk = &tokens[pos..(pos + bs).min(tokens.len())];
            let mut best: Option<(usize, usize)> = None;
            for &c in &self.node(cur).children {
                let lcp = self.node(c).tokens.iter().zip(chunk).take_while(|(a, b)| a == b).count();
                if lcp == bs {
                    best = Some((c, lcp));
                    break;
                }
                if lcp > 0 && best.is_none_or(|(_, l)| lcp > l) {
                    best = Some((c, lcp));
                }
            }
            match best {
                Some((c, lcp)) if lcp == bs => {
                    path.push(c);
                    cur = c;
                    pos += bs;
                }
                other => return (path, other),
            }
        }
        (path, None)
    }

    /// Of a walked path, the longest usable prefix: the whole path when every local block a
    /// query right after it sees is present, else the longest block boundary whose local tail
    /// is. Returns the full nodes to use and whether the partial node is used.
    fn usable(&self, path: &[usize], partial: Option<(usize, usize)>) -> (usize, bool) {
        let Some(rule) = self.window else { return (path.len(), partial.is_some()) };
        let bs = self.block_size as usize;
        let present = |k: usize, with_partial: bool| {
            let m = (k * bs + if with_partial { partial.map_or(0, |p| p.1) } else { 0 }) as u32;
            let nodes = path[..k].iter().copied().chain(partial.filter(|_| with_partial).map(|p| p.0));
            nodes.skip(rule.first_needed_block(m) as usize).all(|n| self.node(n).local != NO_BLOCK)
        };
        if partial.is_some() && present(path.len(), true) {
            return (path.len(), true);
        }
        let k = (0..=path.len()).rev().find(|&k| present(k, false)).unwrap_or(0);
        (k, false)
    }

    /// The longest cached prefix of `tokens` whose K/V every layer still has (callers pass the
    /// prompt without its last token, so that the last one is always computed and yields the
    /// next token's logits). Marks the matched path as recently used. Does not take references:
    /// the caller retains what it uses before anything else can evict it.
    pub fn match_prefix(&mut self, key: &CacheKey, tokens: &[u32]) -> Result<PrefixMatch, KvError> {
        self.check_key(key)?;
        let (path, partial) = self.walk(tokens);
        let (k, with_partial) = self.usable(&path, partial);
        let partial = partial.filter(|_| with_partial);
        let mut m = PrefixMatch {
            blocks: path[..k].iter().map(|&n| self.node(n).block).collect(),
            partial: partial.map(|(n, lcp)| (self.node(n).block, lcp as u32)),
            tokens: (k * self.block_size as usize + partial.map_or(0, |p| p.1)) as u32,
            ..Default::default()
        };
        if let Some(rule) = self.window {
            let first = rule.first_needed_block(m.tokens) as usize;
            m.local = path[..k].iter().enumerate().map(|(i, &n)| if i < first { NO_BLOCK } else { self.node(n).local }).collect();
            m.partial_local = partial.map(|(n, _)| self.node(n).local);
        }
        let now = self.tick();
        self.touch_path(partial.map(|p| p.0).or(path[..k].last().copied()).unwrap_or(ROOT), now);
        Ok(m)
    }

    /// How many leading tokens of `tokens` [`RadixTree::match_prefix`] would give, without
    /// marking anything as used (for scheduling decisions). 0 under another key.
    pub fn peek(&self, key: &CacheKey, tokens: &[u32]) -> u32 {
        if *key != self.key {
            return 0;
        }
        let (path, partial) = self.walk(tokens);
        let (k, with_partial) = self.usable(&path, partial);
        (k * self.block_size as usize + if with_partial { partial.map_or(0, |p| p.1) } else { 0 }) as u32
    }

    /// Stores a finished sequence: `tokens` are the ids whose K/V its `blocks` hold (positions
    /// `0..tokens.len()`, `blocks.len() = ceil(len / block_size)`). Blocks new to the tree gain
    /// one reference; prefixes already cached keep their blocks (the sequence's duplicate copies
    /// go back to the pool when it is freed). A partial node that the new tokens extend is
    /// replaced, its reference released.
    pub fn insert(&mut self, key: &CacheKey, tokens: &[u32], blocks: &[u32], alloc: &mut BlockAllocator) -> Result<(), KvError> {
        self.insert_path(key, (tokens, blocks, &[]), &mut Allocators { global: alloc, local: None }, false)
    }

    /// [`RadixTree::insert`] with the sequence's local blocks too (`local[i]` for `blocks[i]`,
    /// [`NO_BLOCK`] where already freed). A cached full node whose local block is gone takes
    /// the sequence's (same tokens at the same positions: the same K/V).
    pub fn insert_groups(&mut self, key: &CacheKey, (tokens, blocks, local): (&[u32], &[u32], &[u32]), allocs: &mut Allocators<'_>) -> Result<(), KvError> {
        self.insert_path(key, (tokens, blocks, local), allocs, false)
    }

    /// Shares the full blocks of a sequence that is still running (`tokens.len()` a multiple of
    /// the block size). Unlike [`RadixTree::insert`], this stops at a cached block that is not
    /// the sequence's own: hanging the sequence's next blocks below it would pin a block that
    /// only the tree holds (an inner node is never evicted) for as long as the sequence runs.
    /// So every tree block a live sequence holds has ancestors that it holds too.
    pub fn publish(&mut self, key: &CacheKey, tokens: &[u32], blocks: &[u32], alloc: &mut BlockAllocator) -> Result<(), KvError> {
        self.publish_groups(key, (tokens, blocks, &[]), &mut Allocators { global: alloc, local: None })
    }

    /// [`RadixTree::publish`] with the sequence's local blocks (as in [`RadixTree::insert_groups`]).
    pub fn publish_groups(&mut self, key: &CacheKey, (tokens, blocks, local): (&[u32], &[u32], &[u32]), allocs: &mut Allocators<'_>) -> Result<(), KvError> {
        if tokens.len() % self.block_size as usize != 0 {
            return Err(KvError::Internal(format!("{} tokens are not whole blocks of {}", tokens.len(), self.block_size)));
        }
        self.insert_path(key, (tokens, blocks, local), allocs, true)
    }

    // Long: one walk down the path that reuses, adopts or adds a node per block, in both groups.
    fn insert_path(
        &mut self,
        key: &CacheKey,
        (tokens, blocks, local): (&[u32], &[u32], &[u32]),
        allocs: &mut Allocators<'_>,
        own_path_only: bool,
    ) -> Result<(), KvError> {
        self.check_key(key)?;
        let bs = self.block_size as usize;
        if blocks.len() != tokens.len().div_ceil(bs) {
            return Err(KvError::Internal(format!("{} tokens need {} blocks, {} given", tokens.len(), tokens.len().div_ceil(bs), blocks.len())));
        }
        if self.window.is_some() == local.is_empty() || (!local.is_empty() && local.len() != blocks.len()) {
            return Err(KvError::Internal(format!(
                "{} local blocks for {} blocks in a tree {} a window",
                local.len(),
                blocks.len(),
                if self.window.is_some() { "with" } else { "without" }
            )));
        }
        let local_of = |i: usize| local.get(i).copied().unwrap_or(NO_BLOCK);
        let now = self.tick();
        let mut cur = ROOT;
        for (i, chunk) in tokens.chunks(bs).enumerate() {
            let is_full = chunk.len() == bs;
            // An existing node that already covers this chunk: the same full block, or (for a
            // partial chunk) any node whose tokens start with it.
            let covering = self.node(cur).children.iter().copied().find(|&c| {
                let ct = &self.node(c).tokens;
                if is_full {
                    ct.as_slice() == chunk
                } else {
                    ct.len() >= chunk.len() && &ct[..chunk.len()] == chunk
                }
            });
            if let Some(c) = covering {
                if own_path_only && self.node(c).block != blocks[i] {
                    break;
                }
                if is_full && self.node(c).local == NO_BLOCK && local_of(i) != NO_BLOCK {
                    allocs.local()?.retain(local_of(i))?;
                    self.node_mut(c).local = local_of(i);
                }
                self.node_mut(c).last_used = now;
                cur = c;
                continue;
            }
            // Partial leaves that this chunk extends are superseded.
            let stale: Vec<usize> = self
                .node(cur)
                .children
                .iter()
                .copied()
                .filter(|&c| {
                    let n = self.node(c);
                    n.tokens.len() < bs && n.children.is_empty() && chunk.len() > n.tokens.len() && chunk[..n.tokens.len()] == n.tokens[..]
                })
                .collect();
            for c in stale {
                self.remove_leaf(c, allocs)?;
            }
            let block = blocks[i];
            allocs.global.retain(block)?;
            if local_of(i) != NO_BLOCK {
                allocs.local()?.retain(local_of(i))?;
            }
            let start = (i * bs) as u32;
            let node = Node { tokens: chunk.to_vec(), block, local: local_of(i), start, parent: cur, children: Vec::new(), last_used: now };
            let idx = match self.free_slots.pop() {
                Some(s) => {
                    self.nodes[s] = Some(node);
                    s
                }
                None => {
                    self.nodes.push(Some(node));
                    self.nodes.len() - 1
                }
            };
            self.node_mut(cur).children.push(idx);
            cur = idx;
            if !is_full {
                break;
            }
        }
        self.touch_path(cur, now);
        Ok(())
    }

    fn remove_leaf(&mut self, i: usize, allocs: &mut Allocators<'_>) -> Result<(), KvError> {
        let node = self.nodes[i].take().expect("live node index");
        debug_assert!(node.children.is_empty());
        self.node_mut(node.parent).children.retain(|&c| c != i);
        self.free_slots.push(i);
        allocs.global.release(node.block)?;
        if node.local != NO_BLOCK {
            allocs.local()?.release(node.local)?;
        }
        Ok(())
    }

    /// Evicts least recently used leaves that only the tree holds until `free` blocks are free or
    /// nothing more can go. Returns the number of blocks evicted.
    pub fn evict(&mut self, alloc: &mut BlockAllocator, free: u32) -> Result<u32, KvError> {
        self.evict_groups(&mut Allocators { global: alloc, local: None }, free)
    }

    /// [`RadixTree::evict`] in a tree with local blocks (an evicted leaf releases both).
    pub fn evict_groups(&mut self, allocs: &mut Allocators<'_>, free: u32) -> Result<u32, KvError> {
        let mut evicted = 0;
        while allocs.global.free_count() < free {
            let alloc = &*allocs.global;
            let victim = self.oldest(|n| n.children.is_empty() && alloc.refcount(n.block) == 1, |n| (n.last_used, 0));
            let Some(v) = victim else { break };
            self.remove_leaf(v, allocs)?;
            evicted += 1;
        }
        self.stats.evictions += evicted as u64;
        Ok(evicted)
    }

    /// The node (not the root) that `evictable` accepts with the smallest `age`: the eviction victim.
    fn oldest(&self, evictable: impl Fn(&Node) -> bool, age: impl Fn(&Node) -> (u64, u32)) -> Option<usize> {
        let nodes = self.nodes.iter().enumerate().skip(1).filter_map(|(i, n)| n.as_ref().map(|n| (i, n)));
        nodes.filter(|(_, n)| evictable(n)).min_by_key(|(_, n)| age(n)).map(|(i, _)| i)
    }

    /// Evicts local blocks that only the tree holds, from any node (least recently used, then
    /// earliest positions first), until `free` local blocks are free or none can go. The nodes
    /// stay (their global blocks still serve longer prefixes). Returns the blocks evicted.
    pub fn evict_local(&mut self, local: &mut BlockAllocator, free: u32) -> Result<u32, KvError> {
        let mut evicted = 0;
        while local.free_count() < free {
            let victim = self.oldest(|n| n.local != NO_BLOCK && local.refcount(n.local) == 1, |n| (n.last_used, n.start));
            let Some(v) = victim else { break };
            let block = std::mem::replace(&mut self.node_mut(v).local, NO_BLOCK);
            local.release(block)?;
            evicted += 1;
        }
        self.stats.evictions += evicted as u64;
        Ok(evicted)
    }

    /// Drops every node (each block loses the tree's reference); counters restart.
    pub fn clear(&mut self, alloc: &mut BlockAllocator) -> Result<(), KvError> {
        self.clear_groups(&mut Allocators { global: alloc, local: None })
    }

    /// [`RadixTree::clear`] in a tree with local blocks.
    pub fn clear_groups(&mut self, allocs: &mut Allocators<'_>) -> Result<(), KvError> {
        for i in 1..self.nodes.len() {
            if let Some(n) = self.nodes[i].take() {
                allocs.global.release(n.block)?;
                if n.local != NO_BLOCK {
                    allocs.local()?.release(n.local)?;
                }
            }
        }
        self.nodes.truncate(1);
        self.node_mut(ROOT).children.clear();
        self.free_slots.clear();
        let enabled = self.stats.enabled;
        self.stats = PrefixStats { enabled, ..Default::default() };
        Ok(())
    }

    /// Counts one request's lookup for the hit rate.
    pub fn record_request(&mut self, prompt_tokens: u32, hit_tokens: u32) {
        self.stats.requests += 1;
        self.stats.prompt_tokens += prompt_tokens as u64;
        self.stats.hit_tokens += hit_tokens as u64;
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.stats.enabled = enabled;
    }

    pub fn enabled(&self) -> bool {
        self.stats.enabled
    }

    pub fn stats(&self) -> PrefixStats {
        let mut s = self.stats.clone();
        s.hit_rate = if s.prompt_tokens == 0 { 0.0 } else { s.hit_tokens as f64 / s.prompt_tokens as f64 };
        s.nodes = self.nodes.iter().skip(1).filter(|n| n.is_some()).count() as u32;
        s
    }

    /// The blocks the tree holds.
    pub fn blocks(&self) -> Vec<u32> {
        self.nodes.iter().skip(1).flatten().map(|n| n.block).collect()
    }

    /// The local blocks the tree holds.
    pub fn local_blocks(&self) -> Vec<u32> {
        self.nodes.iter().skip(1).flatten().map(|n| n.local).filter(|&b| b != NO_BLOCK).collect()
    }

    /// Each block the tree holds with its parent's block (`None` below the root).
    pub fn parent_blocks(&self) -> Vec<(u32, Option<u32>)> {
        self.nodes.iter().skip(1).flatten().map(|n| (n.block, (n.parent != ROOT).then(|| self.node(n.parent).block))).collect()
    }

    /// The tree's own invariants: parent and child links agree, full nodes hold `block_size`
    /// tokens, partial nodes are leaves, no block appears twice, siblings differ.
    pub fn check(&self) -> Result<(), String> {
        let bs = self.block_size as usize;
        let mut seen = std::collections::HashSet::new();
        let mut seen_local = std::collections::HashSet::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let Some(n) = n else { continue };
            if n.tokens.is_empty() || n.tokens.len() > bs {
                return Err(format!("node {i} holds {} tokens (block size {bs})", n.tokens.len()));
            }
            if n.tokens.len() < bs && !n.children.is_empty() {
                return Err(format!("partial node {i} has children"));
            }
            if !seen.insert(n.block) {
                return Err(format!("block {} is in the tree twice", n.block));
            }
            if n.local != NO_BLOCK && (self.window.is_none() || !seen_local.insert(n.local)) {
                return Err(format!("node {i} holds local block {} twice or without a window", n.local));
            }
            let parent = self.nodes.get(n.parent).and_then(|p| p.as_ref()).ok_or(format!("node {i} has a dead parent"))?;
            if !parent.children.contains(&i) {
                return Err(format!("node {i} is not among its parent's children"));
            }
            if n.parent != ROOT && parent.tokens.len() != bs {
                return Err(format!("node {i} hangs below a partial node"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(n) = n else { continue };
            for &c in &n.children {
                let child = self.nodes.get(c).and_then(|x| x.as_ref()).ok_or(format!("node {i} has a dead child {c}"))?;
                if child.parent != i {
                    return Err(format!("child {c} of node {i} names another parent"));
                }
            }
            let full: Vec<&Vec<u32>> = n.children.iter().filter_map(|&c| self.nodes[c].as_ref()).filter(|c| c.tokens.len() == bs).map(|c| &c.tokens).collect();
            let mut uniq = full.clone();
            uniq.sort();
            uniq.dedup();
            if uniq.len() != full.len() {
                return Err(format!("node {i} has two children with the same full block of tokens"));
            }
        }
        Ok(())
    }
}
