//! The sliding-window-aware KV cache: local layers keep only the blocks their window can still
//! see (checked against a CPU statement of the rule after every step, with `check_integrity()`
//! after every operation), freed blocks return to the local pool, fork / truncate / free act on
//! both block groups, prefix hits across the window boundary reuse exactly the right K/V (markers
//! written into every layer's pool), a hit is refused or shortened when the local tail is gone,
//! snapshots round-trip and refuse another shape, and the KV bytes a long Gemma 3 270M sequence
//! holds with and without window-aware freeing.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{gpu, report};
use pagedlm::gpu::Context;
use pagedlm::kv::snapshot::SnapshotError;
use pagedlm::kv::{CacheConfig, KvCache, KvDtype, KvError, KvLayout, KvShape, SeqId};
use pagedlm::rng::Rng;

/// Three layers: 0 and 1 local, 2 global.
fn shape(window: u32) -> KvShape {
    KvShape { n_layers: 3, n_kv_heads: 1, head_dim: 4, fingerprint: 7, window, local_layers: 0b011 }
}

fn config(block_size: u32, prefix_cache: bool) -> CacheConfig {
    CacheConfig {
        layout: KvLayout::Paged,
        dtype: KvDtype::F32,
        block_size,
        pool_tokens: 400,
        max_seqs: 4,
        max_seq_len: 120,
        prefix_cache,
        local_pool_tokens: 0,
    }
}

/// The rule stated on positions: local block b of a sequence of `len` tokens whose latest step
/// began at `step_start` is held iff it exists and some position j in it can still be seen by
/// a query at `step_start` (`step_start - j < window`).
fn held_by_rule(b: usize, len: u32, step_start: u32, window: u32, bs: u32) -> bool {
    let last = (b as i64 + 1) * bs as i64 - 1;
    (b as u32) < len.div_ceil(bs) && (step_start as i64 - last) < window as i64
}

fn assert_window(cache: &KvCache, id: SeqId, len: u32, step_start: u32, window: u32, what: &str) {
    let bs = cache.block_size();
    let local = cache.local_blocks(id).unwrap();
    assert_eq!(local.len(), cache.blocks(id).unwrap().len(), "{what}: one local entry per block");
    for (b, &block) in local.iter().enumerate() {
        assert_eq!(
            block != u32::MAX,
            held_by_rule(b, len, step_start, window, bs),
            "{what}: local block {b} of {local:?} (len {len}, step at {step_start}, window {window}, block {bs})"
        );
    }
}

fn check(cache: &KvCache, what: &str) {
    cache.check_integrity().unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// The windows of the brief: smaller than a block, equal to one, spanning several.
const CASES: [(u32, u32); 4] = [(3, 4), (4, 4), (10, 4), (17, 16)];

gpu_test! {
    async fn local_blocks_follow_the_window_step_by_step_and_in_chunks() {
        let ctx = gpu().await;
        for (seed, &(window, bs)) in CASES.iter().enumerate() {
            let mut cache = KvCache::new(&ctx, &shape(window), config(bs, false)).unwrap();
            let local_total = cache.stats().local.expect("a windowed shape has a local group").blocks_total;
            let mut rng = Rng::new(seed as u64 + 1);
            let (a, b) = (cache.allocate().unwrap(), cache.allocate().unwrap());
            let mut lens = [0u32, 0];
            for step in 0..60 {
                // Sequence a decodes one token per step; b appends chunks of 1..=9.
                for (i, id) in [a, b].into_iter().enumerate() {
                    let n = if i == 0 { 1 } else { 1 + rng.below(9) as u32 };
                    if lens[i] + n > 120 {
                        continue;
                    }
                    let start = cache.append(id, n).unwrap();
                    assert_eq!(start, lens[i]);
                    lens[i] += n;
                    assert_window(&cache, id, lens[i], start, window, &format!("window {window}, block {bs}, step {step}, seq {i}"));
                    check(&cache, "append");
                }
                let held: usize = [a, b].iter().map(|&id| cache.local_blocks(id).unwrap().iter().filter(|&&x| x != u32::MAX).count()).sum();
                let local = cache.stats().local.unwrap();
                assert_eq!(local.blocks_used as usize, held, "the local pool counts what the tables hold");
                assert_eq!(local.blocks_free + local.blocks_used, local_total);
            }
            // The global group keeps everything.
            assert_eq!(cache.blocks(a).unwrap().len() as u32, lens[0].div_ceil(bs));
            // A long sequence holds about the window, not its length, in the local group.
            let local_held = cache.local_blocks(a).unwrap().iter().filter(|&&x| x != u32::MAX).count() as u32;
            assert!(local_held <= (window - 1).div_ceil(bs) + 1, "{local_held} local blocks for window {window}");
            assert!(cache.bytes_held(a).unwrap() < cache.bytes_per_token() * lens[0] as u64);
            cache.free(a).unwrap();
            cache.free(b).unwrap();
            check(&cache, "free");
            let local = cache.stats().local.unwrap();
            assert_eq!(local.blocks_free, local_total, "freeing returns every local block");
            assert_eq!(cache.stats().blocks_free, cache.stats().blocks_total);
        }
    }
}

gpu_test! {
    async fn fork_truncate_and_free_act_on_both_groups() {
        let ctx = gpu().await;
        // 30 tokens in a window of 12: blocks 4..8 are held, so a rewind to 27 keeps what it needs.
        let (window, bs) = (12, 4);
        let mut cache = KvCache::new(&ctx, &shape(window), config(bs, false)).unwrap();
        let a = cache.allocate().unwrap();
        for _ in 0..30 {
            cache.append(a, 1).unwrap();
        }
        check(&cache, "30 tokens");
        let fork = cache.fork(a).unwrap();
        check(&cache, "fork");
        assert_window(&cache, fork, 30, 29, window, "fork");
        let (src, dst) = (cache.local_blocks(a).unwrap().to_vec(), cache.local_blocks(fork).unwrap().to_vec());
        let refcounts = cache.refcounts();
        let global_blocks = cache.stats().blocks_total as usize;
        for (i, (&s, &d)) in src.iter().zip(&dst).enumerate() {
            if s == u32::MAX {
                assert_eq!(d, u32::MAX, "a freed block stays freed in the fork");
            } else if i < 30 / bs as usize {
                assert_eq!((s, refcounts[global_blocks + s as usize]), (d, 2), "full local blocks are shared");
            } else {
                assert_ne!(s, d, "the partly filled last local block is copied");
            }
        }
        // Rewinding inside what the window still holds works; behind it, it is refused.
        cache.truncate(fork, 27).unwrap();
        check(&cache, "truncate inside the window");
        let (kept_a, kept_fork) = (cache.local_blocks(a).unwrap()[6], cache.local_blocks(fork).unwrap()[6]);
        assert_ne!(kept_a, kept_fork, "the now partly filled shared local block is copied on write");
        assert_window(&cache, fork, 27, 27, window, "truncated");
        cache.append(fork, 1).unwrap();
        check(&cache, "append after truncate");
        let before = cache.refcounts();
        let err = cache.truncate(fork, 5).unwrap_err();
        assert!(matches!(err, KvError::WindowFreed { len: 5, .. }), "{err}");
        assert_eq!(cache.refcounts(), before, "a refused rewind changes nothing");
        cache.free(a).unwrap();
        cache.free(fork).unwrap();
        check(&cache, "free");
        assert!(cache.refcounts().iter().all(|&r| r == 0), "every block of both groups is free");
    }
}

/// A marker for "layer l, position p of a sequence whose tokens are `prefix`".
fn marker(layer: usize, prefix: &[u32]) -> u32 {
    let mut h: u32 = 0x811c_9dc5 ^ layer as u32;
    for &t in prefix {
        for b in t.to_le_bytes() {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
    }
    h.max(1)
}

/// The physical block of position p in layer l's group.
fn block_of(cache: &KvCache, id: SeqId, l: usize, p: u32) -> u32 {
    let i = (p / cache.block_size()) as usize;
    if cache.window(l).is_some() {
        cache.local_blocks(id).unwrap()[i]
    } else {
        cache.blocks(id).unwrap()[i]
    }
}

/// Byte offset of (block, slot) in one layer's f32 K buffer of [`shape`] (1 KV head, head dim 4).
fn slot_offset(cache: &KvCache, block: u32, slot: u32) -> u64 {
    (block as u64 * cache.block_size() as u64 + slot as u64) * 4 * 4
}

/// Writes markers for positions `from..to` into every layer's K where the sequence holds them.
fn write_markers(ctx: &Context, cache: &KvCache, id: SeqId, tokens: &[u32], from: u32, to: u32) {
    for l in 0..3 {
        for p in from..to {
            let block = block_of(cache, id, l, p);
            if block != u32::MAX {
                let off = slot_offset(cache, block, p % cache.block_size());
                ctx.queue.write_buffer(cache.layer_buffers(l).k, off, &marker(l, &tokens[..=p as usize]).to_le_bytes());
            }
        }
    }
}

/// Checks that every position `0..upto` the sequence holds in each layer has the marker of
/// exactly its own prefix; returns how many (layer, position) pairs were checked.
async fn check_markers(ctx: &Context, cache: &KvCache, id: SeqId, tokens: &[u32], upto: u32) -> usize {
    let mut checked = 0;
    for l in 0..3 {
        let buf = cache.layer_buffers(l).k;
        let words = ctx.read_u32(buf, 0, buf.size() / 4).await.unwrap();
        for p in 0..upto {
            let block = block_of(cache, id, l, p);
            if block == u32::MAX {
                continue;
            }
            let got = words[slot_offset(cache, block, p % cache.block_size()) as usize / 4];
            assert_eq!(got, marker(l, &tokens[..=p as usize]), "layer {l}, position {p}: K of another prefix");
            checked += 1;
        }
    }
    checked
}

/// Runs a sequence of `tokens` one token per step, writing markers, publishing each step when
/// asked, and finishes it into the prefix cache.
async fn run_and_finish(ctx: &Context, cache: &mut KvCache, tokens: &[u32], publish: bool) {
    let id = cache.allocate().unwrap();
    for p in 0..tokens.len() as u32 {
        cache.append(id, 1).unwrap();
        write_markers(ctx, cache, id, tokens, p, p + 1);
        if publish {
            cache.publish(id, tokens).unwrap();
        }
        check(cache, "run");
    }
    cache.finish(id, tokens).unwrap();
    check(cache, "finish");
}

/// The hit the window rule allows, on positions: the longest m <= `walk` (the tokens the tree's
/// path matches) that is `walk` itself or a block boundary, such that every position j < m
/// with `m - j < window` lies in a block whose local K/V is present.
fn allowed_hit(walk: u32, window: u32, bs: u32, present: &dyn Fn(u32) -> bool) -> u32 {
    let ok = |m: u32| (0..m).filter(|&j| m - j < window).all(|j| present(j / bs));
    std::iter::once(walk).chain((0..=walk / bs).rev().map(|k| k * bs)).find(|&m| m <= walk && ok(m)).unwrap_or(0)
}

gpu_test! {
    async fn prefix_hits_across_the_window_take_exactly_the_kv_still_there() {
        let ctx = gpu().await;
        let mut rng = Rng::new(9);
        for &(window, bs) in &CASES {
            for publish in [false, true] {
                let mut cache = KvCache::new(&ctx, &shape(window), config(bs, true)).unwrap();
                let base: Vec<u32> = (0..41).map(|_| rng.below(1000) as u32).collect();
                run_and_finish(&ctx, &mut cache, &base, publish).await;
                // Without publishing, the tree got only the blocks still held at the end; with
                // it, every block while it was still in the window.
                let first_kept = if publish { 0 } else { (41 - 1 + 1u32).saturating_sub(window) / bs };
                let present = |b: u32| b >= first_kept;
                for keep in [40u32, 33, 30, 21, 12, 5] {
                    let mut prompt = base[..keep as usize].to_vec();
                    prompt.extend([5000, 5001]);
                    let peek = cache.peek_prefix(&prompt[..prompt.len() - 1]);
                    let (id, hit) = cache.allocate_for_prompt(&prompt).unwrap();
                    check(&cache, "allocate_for_prompt");
                    let want = allowed_hit(keep, window, bs, &present);
                    assert_eq!(hit, want, "window {window}, block {bs}, publish {publish}: prompt sharing {keep} tokens");
                    assert_eq!(peek, hit, "peek agrees with the match");
                    assert_window(&cache, id, hit, hit, window, "prefix hit");
                    let checked = check_markers(&ctx, &cache, id, &prompt, hit).await;
                    assert!(hit == 0 || checked > 0);
                    // Continue it: the copy-on-write block is the sequence's own.
                    let start = cache.append(id, 2).unwrap();
                    write_markers(&ctx, &cache, id, &prompt, start, start + 2);
                    check(&cache, "append after hit");
                    cache.free(id).unwrap();
                    check(&cache, "free after hit");
                }
                // The tree's K/V were not overwritten by the sequences that wrote after a hit.
                let (id, hit) = cache.allocate_for_prompt(&[base.clone(), vec![1]].concat()).unwrap();
                assert_eq!(hit, 41, "the whole finished sequence is reusable after it");
                check_markers(&ctx, &cache, id, &base, hit).await;
                cache.free(id).unwrap();
                cache.reset_prefix_cache().unwrap();
                check(&cache, "reset");
                assert!(cache.refcounts().iter().all(|&r| r == 0));
            }
        }
    }
}

gpu_test! {
    async fn a_small_local_pool_evicts_the_trees_local_blocks_and_stays_consistent() {
        let ctx = gpu().await;
        let (window, bs) = (6, 4);
        let cfg = CacheConfig { local_pool_tokens: 24, pool_tokens: 200, ..config(bs, true) };
        let mut cache = KvCache::new(&ctx, &shape(window), cfg).unwrap();
        assert_eq!(cache.stats().local.unwrap().blocks_total, 6);
        let mut rng = Rng::new(3);
        let mut conversations: Vec<Vec<u32>> = Vec::new();
        for round in 0..12 {
            // Either continue an earlier conversation (a hit) or start a new one.
            let mut tokens = match rng.below(2) {
                0 if !conversations.is_empty() => conversations[rng.below(conversations.len() as u64) as usize].clone(),
                _ => Vec::new(),
            };
            if tokens.len() > 90 {
                tokens.clear();
            }
            tokens.extend((0..5 + rng.below(12)).map(|_| rng.below(50) as u32));
            let (id, hit) = cache.allocate_for_prompt(&tokens).unwrap();
            check(&cache, "allocate_for_prompt");
            check_markers(&ctx, &cache, id, &tokens, hit).await;
            let mut len = hit;
            while len < tokens.len() as u32 {
                let n = (1 + rng.below(3) as u32).min(tokens.len() as u32 - len);
                cache.append(id, n).unwrap();
                write_markers(&ctx, &cache, id, &tokens, len, len + n);
                len += n;
                cache.publish(id, &tokens).unwrap();
                check(&cache, &format!("round {round}, {len} tokens"));
            }
            cache.finish(id, &tokens).unwrap();
            check(&cache, "finish");
            conversations.push(tokens);
        }
        assert!(cache.prefix_stats().evictions > 0, "six local blocks cannot hold every conversation's tail");
        let local = cache.stats().local.unwrap();
        assert_eq!(local.blocks_free + local.blocks_used + local.blocks_cached, local.blocks_total);
    }
}

gpu_test! {
    async fn snapshots_of_a_windowed_sequence_round_trip_and_refuse_another_shape() {
        let ctx = gpu().await;
        let (window, bs) = (10, 4);
        let mut rng = Rng::new(4);
        for n in [37usize, 9] {
            let tokens: Vec<u32> = (0..n).map(|_| rng.below(1000) as u32).collect();
            let mut source = KvCache::new(&ctx, &shape(window), config(bs, true)).unwrap();
            run_and_finish(&ctx, &mut source, &tokens, false).await;
            let bytes = source.export_prefix(&tokens).await.unwrap();
            let mut target = KvCache::new(&ctx, &shape(window), config(bs, true)).unwrap();
            assert_eq!(target.import(&bytes, 1000).unwrap(), tokens);
            check(&target, "import");
            let (id, hit) = target.allocate_for_prompt(&[tokens.clone(), vec![1]].concat()).unwrap();
            assert_eq!(hit as usize, n);
            let checked = check_markers(&ctx, &target, id, &tokens, hit).await;
            // Every global position, and in both local layers the positions from the first block
            // a query after the last token sees.
            let first_local = (n as u32 + 1).saturating_sub(window) / bs;
            assert_eq!(checked, n + 2 * (n - (first_local * bs) as usize), "every held position came across");
            // The local blocks left out make the snapshot smaller than all layers' K/V.
            let all_layers = n.div_ceil(bs as usize) as u64 * bs as u64 * source.bytes_per_token();
            assert_eq!(bytes.len() as u64 > all_layers, first_local == 0, "snapshot of {} bytes", bytes.len());
            // Another window, another set of local layers, no window: refused, nothing changes.
            for other in [shape(11), KvShape { local_layers: 0b101, ..shape(window) }, KvShape { window: 0, ..shape(window) }] {
                let mut cache = KvCache::new(&ctx, &other, config(bs, true)).unwrap();
                let err = cache.import(&bytes, 1000).unwrap_err();
                assert!(matches!(err, KvError::Snapshot(SnapshotError::Mismatch { .. })), "{other:?}: {err}");
                assert!(cache.refcounts().iter().all(|&r| r == 0));
            }
        }
    }
}

gpu_test! {
    async fn kv_bytes_held_by_a_long_gemma3_270m_sequence() {
        let ctx = gpu().await;
        // Gemma 3 270M: 18 layers, 1 KV head, head dim 256, window 512, layer l local iff l % 6 != 5.
        let local_layers = (0..18u64).filter(|l| l % 6 != 5).fold(0, |m, l| m | 1 << l);
        let gemma = KvShape { n_layers: 18, n_kv_heads: 1, head_dim: 256, fingerprint: 1, window: 512, local_layers };
        for dtype in [KvDtype::F32, KvDtype::Int8] {
            for len in [4096u32, 16000] {
                let cfg = CacheConfig {
                    layout: KvLayout::Paged,
                    dtype,
                    block_size: 16,
                    pool_tokens: len,
                    max_seqs: 1,
                    max_seq_len: len,
                    prefix_cache: false,
                    local_pool_tokens: 0,
                };
                let mut cache = KvCache::new(&ctx, &gemma, cfg).unwrap();
                let id = cache.allocate().unwrap();
                // Prefill in chunks of 256, then decode one token at a time for the last 64.
                let mut at = 0;
                while at < len - 64 {
                    let n = 256.min(len - 64 - at);
                    cache.append(id, n).unwrap();
                    at += n;
                }
                while at < len {
                    cache.append(id, 1).unwrap();
                    at += 1;
                }
                check(&cache, "long sequence");
                let held = cache.bytes_held(id).unwrap();
                let without = len.div_ceil(16) as u64 * 16 * cache.bytes_per_token();
                assert_eq!(cache.stats().bytes_held, held, "the only sequence holds every held block");
                assert!(held < without / 3, "window-aware freeing keeps about a fifth of the K/V");
                report(&format!(
                    "gemma3-270m KV, {} tokens, {}: {:.1} MiB held with window-aware freeing, {:.1} MiB without ({:.1}%); pools {:.1} MiB",
                    len,
                    dtype.name(),
                    held as f64 / 1048576.0,
                    without as f64 / 1048576.0,
                    100.0 * held as f64 / without as f64,
                    cache.stats().bytes_total as f64 / 1048576.0,
                ));
                cache.free(id).unwrap();
            }
        }
    }
}
