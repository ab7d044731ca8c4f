//! KV snapshots: export from one engine, import into another, continue with the same tokens as
//! continuing in place; every kind of mismatch or damage is refused with a typed error and leaves
//! the pool as it was.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::tiny_model;
use pagedlm::engine::{Engine, EngineError, EngineOptions, GenerateRequest, KvDtype, KvLayout};
use pagedlm::kv::snapshot::SnapshotError;
use pagedlm::kv::KvError;
use pagedlm::rng::Rng;

fn ids(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 3 + rng.below(256) as u32).collect()
}

fn opts(block_size: u32) -> EngineOptions {
    EngineOptions { max_context: 160, block_size, check_integrity: true, ..Default::default() }
}

fn snapshot_error(e: EngineError) -> SnapshotError {
    match e {
        EngineError::Kv(KvError::Snapshot(s)) => s,
        other => panic!("expected a snapshot error, got {other}"),
    }
}

gpu_test! {
    async fn export_import_continue_gives_the_tokens_of_continuing_in_place() {
        let bytes = tiny_model(41);
        let mut rng = Rng::new(8);
        for (block_size, kv_dtype) in [(16u32, KvDtype::F32), (5, KvDtype::F32), (16, KvDtype::Int8)] {
            let o = EngineOptions { kv_dtype, ..opts(block_size) };
            let mut source = Engine::load(&bytes, o.clone()).await.unwrap();
            let prompt = ids(&mut rng, 45);
            let request = GenerateRequest { max_tokens: 10, ignore_eos: true, ..Default::default() };
            let first = source.generate(&prompt, &request, &mut |_| true).await.unwrap();
            // The conversation so far, then the next turn.
            let mut history = prompt.clone();
            history.extend(&first.tokens);
            let snapshot = source.export_snapshot(&history).await.unwrap();
            let mut next = history.clone();
            next.extend(ids(&mut rng, 7));
            let in_place = source.generate(&next, &request, &mut |_| true).await.unwrap();
            assert!(in_place.prefix_hit_tokens as usize >= history.len());

            let mut target = Engine::load(&bytes, o).await.unwrap();
            let before = target.stats().pool;
            let tokens = target.import_snapshot(&snapshot).unwrap();
            assert_eq!(tokens, history);
            target.kv_cache().check_integrity().unwrap();
            assert!(target.stats().pool.blocks_cached > before.blocks_cached);
            let moved = target.generate(&next, &request, &mut |_| true).await.unwrap();
            assert_eq!(moved.prefix_hit_tokens as usize, history.len(), "block {block_size} {kv_dtype:?}: the imported history was not reused");
            assert_eq!(moved.tokens, in_place.tokens, "block {block_size} {kv_dtype:?}: tokens differ after the transfer");
            // Importing the same snapshot again changes nothing but the LRU order.
            let blocks_used = target.stats().pool.blocks_cached;
            target.import_snapshot(&snapshot).unwrap();
            assert_eq!(target.stats().pool.blocks_cached, blocks_used);
            target.kv_cache().check_integrity().unwrap();
        }
    }
}

gpu_test! {
    async fn mismatched_or_damaged_snapshots_are_refused_and_change_nothing() {
        let bytes = tiny_model(42);
        let mut rng = Rng::new(9);
        let mut source = Engine::load(&bytes, opts(8)).await.unwrap();
        let history = ids(&mut rng, 30);
        let snapshot = source.export_snapshot(&history).await.unwrap();
        // Per token: K and V of every layer and KV head, plus 4 bytes of token id.
        let cfg = source.config().clone();
        let per_token = (cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 * 4) as usize;
        assert!(snapshot.len() >= history.len() * per_token && snapshot.len() < 32 * (per_token + 4) + 1024, "{} bytes", snapshot.len());

        let check = |engine: &mut Engine, data: &[u8], want: &dyn Fn(&SnapshotError) -> bool, what: &str| {
            let before = (engine.stats().pool, engine.stats().refcounts);
            let err = snapshot_error(engine.import_snapshot(data).unwrap_err());
            assert!(want(&err), "{what}: {err}");
            let after = (engine.stats().pool, engine.stats().refcounts);
            assert_eq!(before, after, "{what}: a refused snapshot changed the pool");
            engine.kv_cache().check_integrity().unwrap();
        };
        let mut same = Engine::load(&bytes, opts(8)).await.unwrap();
        // Truncated anywhere, a flipped byte anywhere, bad magic, another version.
        for cut in [0usize, 7, 20, snapshot.len() / 2, snapshot.len() - 1] {
            check(&mut same, &snapshot[..cut], &|e| matches!(e, SnapshotError::NotASnapshot | SnapshotError::Length(_) | SnapshotError::Checksum), "truncated");
        }
        for at in [9usize, 40, snapshot.len() / 3, snapshot.len() - 3] {
            let mut bad = snapshot.clone();
            bad[at] ^= 0x10;
            check(&mut same, &bad, &|e| matches!(e, SnapshotError::Checksum | SnapshotError::Version(_)), "flipped");
        }
        let mut bad = snapshot.clone();
        bad[0] = b'X';
        check(&mut same, &bad, &|e| matches!(e, SnapshotError::NotASnapshot), "magic");
        let mut bad = snapshot.clone();
        bad[8] = 2;
        check(&mut same, &bad, &|e| matches!(e, SnapshotError::Version(2)), "version");
        // Another model, another block size, the contiguous layout.
        let mut other_model = Engine::load(&tiny_model(43), opts(8)).await.unwrap();
        check(&mut other_model, &snapshot, &|e| matches!(e, SnapshotError::Mismatch { what: "model", .. }), "model");
        let mut other_dtype = Engine::load(&bytes, EngineOptions { kv_dtype: KvDtype::Int8, ..opts(8) }).await.unwrap();
        check(&mut other_dtype, &snapshot, &|e| matches!(e, SnapshotError::Mismatch { what: "KV dtype", .. }), "dtype");
        let mut other_block = Engine::load(&bytes, opts(16)).await.unwrap();
        check(&mut other_block, &snapshot, &|e| matches!(e, SnapshotError::Mismatch { what: "block size", .. }), "block size");
        let mut contiguous = Engine::load(&bytes, EngineOptions { kv_layout: KvLayout::Contiguous, ..opts(8) }).await.unwrap();
        let err = contiguous.import_snapshot(&snapshot).unwrap_err();
        assert!(matches!(err, EngineError::Kv(KvError::Config(_))), "{err}");
        // The untouched snapshot still imports.
        assert_eq!(same.import_snapshot(&snapshot).unwrap(), history);
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn real_model_continues_the_same_after_a_transfer() {
    pollster::block_on(async {
        let bytes = common::real_model_bytes().await;
        let o = EngineOptions { max_context: 256, ..Default::default() };
        let mut source = Engine::load(&bytes, o.clone()).await.unwrap();
        let mut target = Engine::load(&bytes, o).await.unwrap();
        let msgs = [pagedlm::tokenizer::ChatMessage { role: "user".into(), content: "What is the capital of France?".into() }];
        let prompt = source.chat_prompt(&msgs).unwrap();
        let request = GenerateRequest { max_tokens: 12, ..Default::default() };
        let snapshot = source.export_snapshot(&prompt).await.unwrap();
        let here = source.generate(&prompt, &request, &mut |_| true).await.unwrap();
        target.import_snapshot(&snapshot).unwrap();
        let there = target.generate(&prompt, &request, &mut |_| true).await.unwrap();
        assert_eq!(there.prefix_hit_tokens as usize, prompt.len() - 1);
        assert_eq!(there.tokens, here.tokens);
        println!("snapshot of {} tokens: {} bytes ({:.0} per token)", prompt.len(), snapshot.len(), snapshot.len() as f64 / prompt.len() as f64);
    });
}
