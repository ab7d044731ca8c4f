//! The KV cache's bookkeeping: random allocate / append / fork / truncate / free sequences with
//! `check_integrity()` after every operation, pool exhaustion as a typed error that touches no
//! other sequence, and the contiguous layout's reservations.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{gpu, tiny_config};
use pagedlm::engine::kv_shape;
use pagedlm::kv::{CacheConfig, KvCache, KvDtype, KvError, KvLayout, SeqId};
use pagedlm::rng::Rng;
use pagedlm::synth::SynthConfig;

gpu_test! {
    async fn random_operations_keep_the_cache_consistent() {
        let ctx = gpu().await;
        let cfg = tiny_config(SynthConfig::tiny().seed);
        for (layout, block_size, seed) in [(KvLayout::Paged, 16, 1u64), (KvLayout::Paged, 1, 2), (KvLayout::Paged, 7, 3), (KvLayout::Contiguous, 0, 4)] {
            let config = CacheConfig { layout, dtype: KvDtype::F32, block_size, pool_tokens: 400, max_seqs: 8, max_seq_len: 120, prefix_cache: false, local_pool_tokens: 0 };
            let mut cache = KvCache::new(&ctx, &kv_shape(&cfg), config).unwrap();
            let mut rng = Rng::new(seed);
            let mut live: Vec<(SeqId, u32)> = Vec::new();
            let (mut exhausted, mut forks) = (0, 0);
            for step in 0..3000 {
                match rng.below(10) {
                    0..=1 => match cache.allocate() {
                        Ok(id) => live.push((id, 0)),
                        Err(KvError::TooManySequences(_)) => assert_eq!(live.len(), 8),
                        Err(KvError::PoolExhausted { .. }) => exhausted += 1,
                        Err(e) => panic!("allocate: {e}"),
                    },
                    2..=5 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let n = 1 + rng.below(20) as u32;
                        let before = cache.blocks(live[i].0).unwrap().to_vec();
                        let others: Vec<Vec<u32>> = live.iter().map(|(s, _)| cache.blocks(*s).unwrap().to_vec()).collect();
                        match cache.append(live[i].0, n) {
                            Ok(start) => {
                                assert_eq!(start, live[i].1);
                                live[i].1 += n;
                            }
                            Err(KvError::PoolExhausted { .. }) | Err(KvError::SequenceTooLong { .. }) => {
                                exhausted += 1;
                                assert_eq!(cache.blocks(live[i].0).unwrap(), &before[..], "a failed append changed the table");
                                let after: Vec<Vec<u32>> = live.iter().map(|(s, _)| cache.blocks(*s).unwrap().to_vec()).collect();
                                assert_eq!(after, others, "a failed append touched another sequence");
                            }
                            Err(e) => panic!("append: {e}"),
                        }
                    }
                    6 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        match cache.fork(live[i].0) {
                            Ok(id) => {
                                forks += 1;
                                live.push((id, live[i].1));
                            }
                            Err(KvError::PoolExhausted { .. }) | Err(KvError::TooManySequences(_)) => {}
                            Err(e) => panic!("fork: {e}"),
                        }
                    }
                    7 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let len = rng.below(live[i].1 as u64 + 1) as u32;
                        cache.truncate(live[i].0, len).unwrap();
                        live[i].1 = len;
                    }
                    8..=9 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        cache.free(live.swap_remove(i).0).unwrap();
                    }
                    _ => {}
                }
                if let Err(e) = cache.check_integrity() {
                    panic!("{layout:?} block size {block_size}, step {step}: {e}");
                }
                for (id, len) in &live {
                    assert_eq!(cache.len(*id).unwrap(), *len);
                }
            }
            assert!(exhausted > 0 && forks > 0, "{layout:?}: the workload must reach exhaustion ({exhausted}) and forks ({forks})");
            for (id, _) in live.drain(..) {
                cache.free(id).unwrap();
            }
            let stats = cache.stats();
            assert_eq!(stats.blocks_used, 0, "{layout:?}: blocks leaked");
            assert_eq!(stats.blocks_free, stats.blocks_total);
            cache.check_integrity().unwrap();
        }
    }
}

gpu_test! {
    async fn stats_report_fragmentation_and_exhaustion_is_typed() {
        let ctx = gpu().await;
        let cfg = tiny_config(SynthConfig::tiny().seed);
        let mut cache = KvCache::new(&ctx, &kv_shape(&cfg), CacheConfig { layout: KvLayout::Paged, dtype: KvDtype::F32, block_size: 16, pool_tokens: 64, max_seqs: 4, max_seq_len: 64, prefix_cache: false, local_pool_tokens: 0 }).unwrap();
        let a = cache.allocate().unwrap();
        cache.append(a, 17).unwrap();
        let s = cache.stats();
        assert_eq!((s.blocks_total, s.blocks_used, s.blocks_free), (4, 2, 2));
        assert_eq!(s.live_tokens, 17);
        assert_eq!(s.internal_fragmentation, 2 * 16 - 17);
        assert_eq!(s.bytes_per_token, (cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 * 4) as f64);
        assert_eq!(s.bytes_total, 4 * 16 * s.bytes_per_token as u64);
        let b = cache.allocate().unwrap();
        cache.append(b, 32).unwrap();
        let err = cache.append(a, 16).unwrap_err();
        assert_eq!(err, KvError::PoolExhausted { needed: 1, free: 0, total: 4 });
        assert!(err.to_string().contains("KV pool is full"));
        assert_eq!(cache.len(a).unwrap(), 17, "a failed append leaves the length");
        // Fork shares the full block and copies the partial one.
        cache.free(b).unwrap();
        let c = cache.fork(a).unwrap();
        assert_eq!(cache.blocks(c).unwrap()[0], cache.blocks(a).unwrap()[0]);
        assert_ne!(cache.blocks(c).unwrap()[1], cache.blocks(a).unwrap()[1]);
        cache.check_integrity().unwrap();
        // Contiguous reserves the maximum length up front.
        let mut contiguous = KvCache::new(&ctx, &kv_shape(&cfg), CacheConfig { layout: KvLayout::Contiguous, dtype: KvDtype::F32, block_size: 16, pool_tokens: 0, max_seqs: 2, max_seq_len: 64, prefix_cache: false, local_pool_tokens: 0 }).unwrap();
        let d = contiguous.allocate().unwrap();
        assert_eq!(contiguous.stats().internal_fragmentation, 64);
        contiguous.append(d, 10).unwrap();
        assert_eq!(contiguous.stats().internal_fragmentation, 54);
        assert!(matches!(contiguous.append(d, 60), Err(KvError::SequenceTooLong { .. })));
    }
}

/// The memory figure of the README: 16 sequences with lengths drawn from 50 to 2,000 tokens,
/// held by the paged pool vs reserved by the contiguous layout at the maximum length. SmolLM2's
/// KV shape (3 KV heads × 64) with one layer allocated on the GPU; bytes scale by its 30 layers.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn memory_for_sixteen_sequences_paged_vs_contiguous() {
    pollster::block_on(async {
        let ctx = gpu().await;
        let one_layer = pagedlm::model::ModelConfig { n_layers: 1, n_kv_heads: 3, head_dim: 64, ..tiny_config(SynthConfig::tiny().seed) };
        let smollm2_layers = 30u64;
        let mut rng = Rng::new(2024);
        let lengths: Vec<u32> = (0..16).map(|_| 50 + rng.below(1951) as u32).collect();
        let live: u64 = lengths.iter().map(|&l| l as u64).sum();
        let mut held = Vec::new();
        for layout in [KvLayout::Contiguous, KvLayout::Paged] {
            let config = CacheConfig {
                layout,
                dtype: KvDtype::F32,
                block_size: 16,
                pool_tokens: 16 * 2000,
                max_seqs: 16,
                max_seq_len: 2000,
                prefix_cache: false,
                local_pool_tokens: 0,
            };
            let mut cache = KvCache::new(&ctx, &kv_shape(&one_layer), config).unwrap();
            for &len in &lengths {
                let id = cache.allocate().unwrap();
                cache.append(id, len).unwrap();
            }
            cache.check_integrity().unwrap();
            let s = cache.stats();
            let bytes = s.blocks_used as u64 * s.block_size as u64 * s.bytes_per_token as u64 * smollm2_layers;
            held.push(bytes);
            eprintln!(
                "16 sequences, {live} live tokens: {layout:?} holds {:.1} MB ({} blocks of {}, fragmentation {} slots)",
                bytes as f64 / 1e6,
                s.blocks_used,
                s.block_size,
                s.internal_fragmentation
            );
        }
        let per_token: u64 = smollm2_layers * 3 * 64 * 2 * 4;
        assert_eq!(held[0], 16 * 2000 * per_token, "contiguous reserves the maximum length for each sequence");
        assert!(held[1] < held[0], "paged holds less than contiguous reserves");
        assert!(held[1] <= (live + 16 * 15) * per_token, "paged wastes at most one partial block per sequence");
    });
}
