//! The prefix cache (radix tree over KV blocks): hits give the same logits and tokens as fresh
//! prefills, eviction under a small pool keeps every request correct, the cache is keyed by what
//! its K/V depend on, and a property test over random multi-conversation workloads checks, with
//! markers written into the GPU pool itself, that every reused position holds the K/V of exactly
//! the prefix the new request has, including blocks published by sequences still running and
//! sequences rewound into a shared block.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;

use common::{gpu, tiny_config, tiny_model};
use pagedlm::engine::{kv_shape, Engine, EngineOptions, GenerateRequest, KvDtype, KvLayout, ScoreMode};
use pagedlm::kv::alloc::BlockAllocator;
use pagedlm::kv::{CacheConfig, CacheKey, KvCache, KvError, RadixTree, SeqId};
use pagedlm::rng::Rng;

/// |logits through a cache hit − logits of a fresh prefill|. Both run the same kernels on the
/// same K/V values; they differ only where the cached rows were computed in a prefill pass of
/// another shape (another matmul tiling), i.e. f32 rounding.
const HIT_TOL: f32 = 1e-3;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn ids(rng: &mut Rng, n: usize) -> Vec<u32> {
    // Byte tokens of the tiny vocabulary (3..259), never the specials.
    (0..n).map(|_| 3 + rng.below(256) as u32).collect()
}

gpu_test! {
    async fn hits_give_the_logits_of_a_fresh_prefill() {
        let bytes = tiny_model(21);
        let mut rng = Rng::new(5);
        for (block_size, kv_dtype) in [(4u32, KvDtype::F32), (16, KvDtype::F32), (16, KvDtype::Int8)] {
            let opts = EngineOptions { max_context: 128, block_size, kv_dtype, prefill_chunk: 32, check_integrity: true, ..Default::default() };
            let mut engine = Engine::load(&bytes, opts).await.unwrap();
            let base = ids(&mut rng, 37); // 37 tokens: a partly filled last block for both sizes
            let (first, hit) = engine.next_token_logits(&base).await.unwrap();
            assert_eq!(hit, 0, "an empty cache has nothing to hit");
            let fresh = engine.score_logits(&base, base.len(), ScoreMode::Prefill).await.unwrap();
            assert!(max_diff(&first, &fresh[0]) <= HIT_TOL);
            let mut cases: Vec<(&str, Vec<u32>, u32)> = Vec::new();
            // The same prompt again: everything but the last token comes from the cache.
            cases.push(("full hit", base.clone(), base.len() as u32 - 1));
            // Diverging mid-block, at a block boundary, inside the cached partial last block.
            for (name, keep) in [("mid-block", 21usize), ("block boundary", 32), ("inside the partial block", 35)] {
                let mut p = base[..keep].to_vec();
                p.extend(ids(&mut rng, 9));
                cases.push((name, p, keep as u32));
            }
            // Extending the cached prompt (the next turn of a conversation).
            let mut longer = base.clone();
            longer.extend(ids(&mut rng, 20));
            cases.push(("extension", longer, base.len() as u32));
            for (name, prompt, want_hit) in cases {
                let (logits, hit) = engine.next_token_logits(&prompt).await.unwrap();
                // A random continuation may by chance agree with the cache for a token or so.
                assert!(hit >= want_hit && hit < prompt.len() as u32, "{name} (block {block_size}): hit {hit}, expected {want_hit}");
                let fresh = engine.score_logits(&prompt, prompt.len(), ScoreMode::Prefill).await.unwrap();
                let d = max_diff(&logits, &fresh[0]);
                assert!(d <= HIT_TOL, "{name} (block {block_size}, {kv_dtype:?}): logits differ by {d} from a fresh prefill");
                engine.kv_cache().check_integrity().unwrap();
            }
            let stats = engine.stats();
            assert!(stats.prefix.hit_tokens > 0 && stats.prefix.hit_rate > 0.0, "{:?}", stats.prefix);
            assert!(stats.pool.blocks_cached > 0);
            // Reset: every block returns to the free list.
            engine.reset_cache().unwrap();
            let stats = engine.stats();
            assert_eq!(stats.pool.blocks_free, stats.pool.blocks_total);
            assert!(stats.refcounts.iter().all(|&r| r == 0));
            let (_, hit) = engine.next_token_logits(&base).await.unwrap();
            assert_eq!(hit, 0, "nothing is cached after a reset");
        }
    }
}

gpu_test! {
    async fn conversations_under_a_small_pool_evict_and_stay_correct() {
        let bytes = tiny_model(22);
        // 14 blocks of 4 tokens: room for one long conversation, not for all of them.
        let small = EngineOptions { max_context: 48, block_size: 4, pool_tokens: 56, check_integrity: true, ..Default::default() };
        let big = EngineOptions { max_context: 48, prefix_cache: false, ..Default::default() };
        let mut cached = Engine::load(&bytes, small).await.unwrap();
        let mut plain = Engine::load(&bytes, big).await.unwrap();
        let mut rng = Rng::new(9);
        let system = ids(&mut rng, 10);
        let mut convs: Vec<Vec<u32>> = vec![system.clone(); 4];
        let mut hits = 0;
        for step in 0..24 {
            let c = rng.below(convs.len() as u64) as usize;
            let mut prompt = convs[c].clone();
            prompt.extend({ let n = 3 + rng.below(4) as usize; ids(&mut rng, n) });
            if prompt.len() > 40 {
                // Start the conversation over (the system prompt stays shared).
                prompt = system.clone();
                prompt.extend(ids(&mut rng, 4));
            }
            let request = GenerateRequest { max_tokens: 4, ..Default::default() };
            let got = cached.generate(&prompt, &request, &mut |_| true).await.unwrap();
            let want = plain.generate(&prompt, &request, &mut |_| true).await.unwrap();
            assert_eq!(got.tokens, want.tokens, "request {step}: tokens differ with the prefix cache (hit {})", got.prefix_hit_tokens);
            assert_eq!(got.prefix_hit_tokens + got.prefill_tokens, prompt.len() as u32);
            hits += got.prefix_hit_tokens;
            cached.kv_cache().check_integrity().unwrap();
            let mut next = prompt;
            next.extend(&got.tokens);
            convs[c] = next;
        }
        let stats = cached.stats();
        assert!(hits > 0, "no request hit the cache");
        assert!(stats.prefix.evictions > 0, "the pool was meant to be too small for every conversation: {:?}", stats.prefix);
        assert!(stats.sequences.is_empty());
        cached.reset_cache().unwrap();
        let stats = cached.stats();
        assert_eq!(stats.pool.blocks_free, stats.pool.blocks_total);
        assert!(stats.refcounts.iter().all(|&r| r == 0));
    }
}

gpu_test! {
    async fn the_cache_is_keyed_by_model_dtype_layout_and_block_size() {
        let a = tiny_config(1);
        let b = tiny_config(2);
        assert_ne!(a.fingerprint, b.fingerprint, "two models with different weights share a fingerprint");
        let again = tiny_config(1);
        assert_eq!(a.fingerprint, again.fingerprint);
        let key = CacheKey { model: a.fingerprint, dtype: KvDtype::F32, layout: KvLayout::Paged, block_size: 4 };
        let mut alloc = BlockAllocator::new(8);
        let mut tree = RadixTree::new(key);
        let blocks = alloc.alloc(2).unwrap();
        tree.insert(&key, &[5, 6, 7, 8, 9, 10], &blocks, &mut alloc).unwrap();
        assert_eq!(tree.match_prefix(&key, &[5, 6, 7, 8, 9]).unwrap().tokens, 5);
        let others = [
            CacheKey { model: b.fingerprint, ..key },
            CacheKey { dtype: KvDtype::Int8, ..key },
            CacheKey { layout: KvLayout::Contiguous, ..key },
            CacheKey { block_size: 8, ..key },
        ];
        for other in others {
            let err = tree.match_prefix(&other, &[5, 6, 7, 8, 9]).unwrap_err();
            assert!(matches!(err, KvError::CacheKeyMismatch(_)), "{other:?}: {err}");
            let err = tree.insert(&other, &[1], &blocks[..1], &mut alloc).unwrap_err();
            assert!(matches!(err, KvError::CacheKeyMismatch(_)), "{other:?}: {err}");
        }
        tree.check().unwrap();
        // Two engines on different models never see each other's cache: each cache carries its model.
        let ea = Engine::load(&tiny_model(1), EngineOptions { max_context: 32, ..Default::default() }).await.unwrap();
        let eb = Engine::load(&tiny_model(2), EngineOptions { max_context: 32, ..Default::default() }).await.unwrap();
        assert_ne!(ea.kv_cache().key(), eb.kv_cache().key());
        let ei = Engine::load(&tiny_model(1), EngineOptions { max_context: 32, block_size: 8, ..Default::default() }).await.unwrap();
        assert_ne!(ea.kv_cache().key(), ei.kv_cache().key());
    }
}

/// Writes a marker for "position p of a sequence whose tokens are `prefix`" into slot p of the
/// sequence's block in layer 0's K buffer (first float of KV head 0), as the model would write K.
fn marker(prefix: &[u32]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &t in prefix {
        for b in t.to_le_bytes() {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
    }
    h.max(1)
}

fn slot_offset(cache: &KvCache, block: u32, slot: u32) -> u64 {
    let p = &cache.pool;
    ((block as u64 * p.n_kv_heads as u64) * p.block_size as u64 + slot as u64) * p.head_dim as u64 * 4
}

fn write_markers(ctx: &pagedlm::gpu::Context, cache: &KvCache, seq: SeqId, tokens: &[u32], from: u32, to: u32) {
    let bs = cache.block_size();
    let blocks = cache.blocks(seq).unwrap().to_vec();
    for p in from..to {
        let off = slot_offset(cache, blocks[(p / bs) as usize], p % bs);
        ctx.queue.write_buffer(&cache.pool.k[0], off, &marker(&tokens[..=p as usize]).to_le_bytes());
    }
}

async fn check_markers(ctx: &pagedlm::gpu::Context, cache: &KvCache, seq: SeqId, tokens: &[u32], upto: u32) -> Result<(), String> {
    let bs = cache.block_size();
    let blocks = cache.blocks(seq).unwrap().to_vec();
    let words = ctx.read_u32(&cache.pool.k[0], 0, cache.pool.bytes_total() / cache.pool.k.len() as u64 / 2 / 4).await.unwrap();
    for p in 0..upto {
        let off = slot_offset(cache, blocks[(p / bs) as usize], p % bs) as usize / 4;
        if words[off] != marker(&tokens[..=p as usize]) {
            return Err(format!("position {p} (block {}, slot {}) holds K of another prefix", blocks[(p / bs) as usize], p % bs));
        }
    }
    Ok(())
}

gpu_test! {
    async fn random_multi_conversation_workloads_reuse_exactly_the_right_kv() {
        let ctx = gpu().await;
        let cfg = tiny_config(3);
        for (block_size, pool_tokens, seed) in [(4u32, 96u32, 1u64), (3, 60, 2), (8, 200, 3)] {
            let config = CacheConfig {
                layout: KvLayout::Paged,
                dtype: KvDtype::F32,
                block_size,
                pool_tokens,
                max_seqs: 3,
                max_seq_len: 64,
                prefix_cache: true,
                local_pool_tokens: 0,
            };
            let mut cache = KvCache::new(&ctx, &kv_shape(&cfg), config).unwrap();
            let mut rng = Rng::new(seed);
            // Shared system prompts; conversations branch from each other at turn boundaries.
            let systems: Vec<Vec<u32>> = (0..3).map(|_| { let n = 5 + rng.below(12) as usize; ids(&mut rng, n) }).collect();
            let mut histories: Vec<Vec<u32>> = Vec::new();
            // Live requests: (sequence, tokens it will hold when done, tokens written so far).
            let mut live: Vec<(SeqId, Vec<u32>, u32, usize)> = Vec::new();
            let (mut hits, mut requests, mut exhausted, mut ops) = (0u64, 0u64, 0u32, 0u32);
            let (mut published, mut rewinds) = (0u32, 0u32);
            let mut hit_kinds: HashMap<&str, u32> = HashMap::new();
            while ops < 500 {
                ops += 1;
                let start_new = live.is_empty() || (live.len() < 3 && rng.below(3) == 0);
                if start_new {
                    // A new turn of an existing conversation, a branch off one, or a new conversation.
                    let mut prompt = match rng.below(4) {
                        0 if !histories.is_empty() => histories[rng.below(histories.len() as u64) as usize].clone(),
                        1 if !histories.is_empty() => {
                            let h = &histories[rng.below(histories.len() as u64) as usize];
                            h[..1 + rng.below(h.len() as u64) as usize].to_vec()
                        }
                        _ => systems[rng.below(3) as usize].clone(),
                    };
                    prompt.extend({ let n = 1 + rng.below(7) as usize; ids(&mut rng, n) });
                    if prompt.len() > 40 {
                        prompt.truncate(12);
                    }
                    let (seq, hit) = match cache.allocate_for_prompt(&prompt) {
                        Ok(x) => x,
                        Err(KvError::PoolExhausted { .. }) => {
                            exhausted += 1;
                            continue;
                        }
                        Err(e) => panic!("allocate_for_prompt: {e}"),
                    };
                    assert!(hit < prompt.len() as u32, "the last prompt token must always be computed");
                    check_markers(&ctx, &cache, seq, &prompt, hit).await.unwrap_or_else(|e| panic!("op {ops}: a hit of {hit}: {e}"));
                    *hit_kinds.entry(if hit == 0 { "none" } else if hit % block_size == 0 { "boundary" } else { "mid-block" }).or_default() += 1;
                    hits += hit as u64;
                    requests += 1;
                    // The request will generate a few tokens after its prompt.
                    let mut tokens = prompt.clone();
                    tokens.extend({ let n = rng.below(6) as usize; ids(&mut rng, n) });
                    live.push((seq, tokens, hit, prompt.len()));
                } else {
                    let i = rng.below(live.len() as u64) as usize;
                    let (seq, tokens, written, _) = live[i].clone();
                    let action = rng.below(8);
                    if action == 0 {
                        // Abort: nothing is cached.
                        cache.free(seq).unwrap();
                        live.remove(i);
                    } else if action == 1 && written > 0 {
                        // Publish while running (what the scheduler does after each prefill
                        // chunk): later prompts may share the full blocks now.
                        cache.publish(seq, &tokens[..written as usize]).unwrap();
                        published += 1;
                    } else if action == 2 && written > 0 {
                        // Rewind and continue with other tokens: a kept block that is shared
                        // (published, or matched from the cache) must be copied, not overwritten.
                        let len = rng.below(written as u64) as u32;
                        match cache.truncate(seq, len) {
                            Ok(()) => {}
                            Err(KvError::PoolExhausted { .. }) => {
                                // No block for the copy: the sequence is as it was; preempt it.
                                exhausted += 1;
                                cache.check_integrity().unwrap();
                                cache.free(seq).unwrap();
                                live.remove(i);
                                continue;
                            }
                            Err(e) => panic!("truncate: {e}"),
                        }
                        check_markers(&ctx, &cache, seq, &tokens, len).await.unwrap_or_else(|e| panic!("op {ops}: after a rewind to {len}: {e}"));
                        let mut rewritten = tokens[..len as usize].to_vec();
                        rewritten.extend(ids(&mut rng, tokens.len() - len as usize));
                        live[i].1 = rewritten;
                        live[i].2 = len;
                        rewinds += 1;
                    } else if written as usize == tokens.len() {
                        cache.finish(seq, &tokens).unwrap();
                        histories.push(tokens);
                        if histories.len() > 12 {
                            histories.remove(0);
                        }
                        live.remove(i);
                    } else {
                        // Prefill the rest of the prompt, or decode one token.
                        let n = if (written as usize) < live[i].3 { live[i].3 as u32 - written } else { 1 };
                        match cache.append(seq, n) {
                            Ok(at) => {
                                assert_eq!(at, written);
                                write_markers(&ctx, &cache, seq, &tokens, written, written + n);
                                live[i].2 += n;
                            }
                            Err(KvError::PoolExhausted { .. }) => {
                                // What the scheduler will do: preempt (free) the request.
                                exhausted += 1;
                                cache.free(seq).unwrap();
                                live.remove(i);
                            }
                            Err(e) => panic!("append: {e}"),
                        }
                    }
                }
                cache.check_integrity().unwrap_or_else(|e| panic!("op {ops} (block {block_size}): {e}"));
            }
            for (seq, _, _, _) in live.drain(..) {
                cache.free(seq).unwrap();
            }
            let prefix = cache.prefix_stats();
            assert!(hits > 0 && prefix.hit_tokens == hits, "{prefix:?}");
            assert_eq!(prefix.requests, requests);
            assert!(hit_kinds.get("mid-block").copied().unwrap_or(0) > 0, "no hit ended mid-block: {hit_kinds:?}");
            assert!(prefix.evictions > 0, "the pool never had to evict (block {block_size}): {prefix:?}");
            assert!(published > 0 && rewinds > 0, "published {published}, rewinds {rewinds}");
            let _ = exhausted;
            cache.reset_prefix_cache().unwrap();
            cache.check_integrity().unwrap();
            assert_eq!(cache.pool.alloc.free_count(), cache.pool.n_blocks, "refcounts did not return to zero");
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn real_model_conversation_through_the_cache_gives_the_same_greedy_tokens() {
    use pagedlm::tokenizer::ChatMessage;
    pollster::block_on(async {
        let bytes = common::real_model_bytes().await;
        let mut cached = Engine::load(&bytes, EngineOptions { max_context: 512, ..Default::default() }).await.unwrap();
        let mut plain = Engine::load(&bytes, EngineOptions { max_context: 512, prefix_cache: false, ..Default::default() }).await.unwrap();
        let request = GenerateRequest { max_tokens: 12, ..Default::default() };
        let mut messages = vec![ChatMessage { role: "user".into(), content: "Name three colors of the rainbow.".into() }];
        let mut last_prompt_len = 0;
        for (turn, follow_up) in ["And two more?", "Which one is your favorite?"].iter().enumerate() {
            let prompt = cached.chat_prompt(&messages).unwrap();
            let got = cached.generate(&prompt, &request, &mut |_| true).await.unwrap();
            let want = plain.generate(&prompt, &request, &mut |_| true).await.unwrap();
            assert_eq!(got.tokens, want.tokens, "turn {turn}: greedy tokens differ through the prefix cache");
            assert_eq!(want.prefix_hit_tokens, 0);
            if turn > 0 {
                // The history up to the last reply comes from the cache (retokenizing a reply may
                // differ from the generated ids for a token or two at its end).
                assert!(got.prefix_hit_tokens + 8 >= last_prompt_len, "turn {turn}: hit {} of a {last_prompt_len}-token history", got.prefix_hit_tokens);
            }
            println!(
                "turn {turn}: prompt {} tokens, prefix hit {}, ttft {:.0} ms (without the cache {:.0} ms)",
                prompt.len(),
                got.prefix_hit_tokens,
                got.ttft_ms,
                want.ttft_ms
            );
            last_prompt_len = prompt.len() as u32 + got.tokens.len() as u32;
            messages.push(ChatMessage { role: "assistant".into(), content: got.text.clone() });
            messages.push(ChatMessage { role: "user".into(), content: (*follow_up).into() });
        }
        // A full hit: the same prompt again gives the same tokens.
        let prompt = cached.chat_prompt(&messages[..1]).unwrap();
        let again = cached.generate(&prompt, &request, &mut |_| true).await.unwrap();
        let want = plain.generate(&prompt, &request, &mut |_| true).await.unwrap();
        assert_eq!(again.prefix_hit_tokens, prompt.len() as u32 - 1);
        assert_eq!(again.tokens, want.tokens);
        cached.kv_cache().check_integrity().unwrap();
    });
}
