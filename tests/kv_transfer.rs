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

/// FNV-1a, the snapshot's checksum (`src/kv/snapshot.rs`): a mutation resealed with it reaches
/// the checks behind the checksum.
fn reseal(bytes: &mut Vec<u8>) {
    let body = bytes.len().saturating_sub(8);
    bytes.truncate(body);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes.iter() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    bytes.extend_from_slice(&h.to_le_bytes());
}

/// A hostile value for a header field: wrong types, huge and negative numbers, NaN-ish strings.
fn hostile(rng: &mut Rng, original: &serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    match rng.below(12) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(1e300),
        4 => json!("NaN"),
        5 => json!([1, 2, 3]),
        6 => json!({"a": 1}),
        7 => json!(true),
        8 => json!("x".repeat(rng.below(300) as usize)),
        9 => json!(rng.below(1 << 20)),
        10 => original.as_u64().map_or(json!(0), |v| json!(v.wrapping_add(1 + rng.below(3)))),
        _ => original.clone(),
    }
}

/// One mutation of `good` (a snapshot of `tokens`): returns the bytes and, when the mutation
/// leaves a snapshot that must be accepted, the tokens it holds.
fn mutate(rng: &mut Rng, good: &[u8], tokens: &[u32], vocab: u32) -> (Vec<u8>, Option<Vec<u32>>) {
    let hlen = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let tokens_at = 16 + hlen;
    let data_at = tokens_at + 4 * tokens.len();
    let mut b = good.to_vec();
    match rng.below(8) {
        // Bytes flipped anywhere, checksum left: always refused.
        0 => {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(b.len() as u64) as usize;
                b[at] ^= 1 + rng.below(255) as u8;
            }
            (b, None)
        }
        // Cut anywhere, or trailing bytes.
        1 => {
            if rng.below(2) == 0 {
                b.truncate(rng.below(good.len() as u64) as usize);
            } else {
                b.extend((0..1 + rng.below(64)).map(|_| rng.below(256) as u8));
            }
            (b, None)
        }
        // Bytes flipped in the header or its length, resealed.
        2 => {
            for _ in 0..1 + rng.below(4) {
                let at = 12 + rng.below((tokens_at - 12) as u64) as usize;
                b[at] ^= 1 + rng.below(255) as u8;
            }
            reseal(&mut b);
            (b, None)
        }
        // A header field given a hostile value (or dropped), resealed with the right length:
        // accepted only when the value is the one it had.
        3 => {
            let mut header: serde_json::Value = serde_json::from_slice(&good[16..tokens_at]).unwrap();
            let fields: Vec<String> = header.as_object().unwrap().keys().cloned().collect();
            let field = &fields[rng.below(fields.len() as u64) as usize];
            let original = header[field.as_str()].clone();
            let value = hostile(rng, &original);
            let same = value == original;
            if rng.below(10) == 0 {
                header.as_object_mut().unwrap().remove(field.as_str());
            } else {
                header[field.as_str()] = value;
            }
            let text = serde_json::to_vec(&header).unwrap();
            let mut out = good[..12].to_vec();
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(&text);
            out.extend_from_slice(&good[tokens_at..]);
            reseal(&mut out);
            let intact = same && header.get(field.as_str()).is_some();
            (out, intact.then(|| tokens.to_vec()))
        }
        // Token ids replaced, resealed: accepted when every id is in the vocabulary.
        4 => {
            let mut held = tokens.to_vec();
            for _ in 0..1 + rng.below(4) {
                let k = rng.below(held.len() as u64) as usize;
                held[k] = match rng.below(3) {
                    0 => vocab + rng.below(1000) as u32,
                    1 => u32::MAX - rng.below(4) as u32,
                    _ => rng.below(vocab as u64) as u32,
                };
                b[tokens_at + 4 * k..tokens_at + 4 * k + 4].copy_from_slice(&held[k].to_le_bytes());
            }
            reseal(&mut b);
            let ok = held.iter().all(|&t| t < vocab);
            (b, ok.then_some(held))
        }
        // K/V bytes changed, resealed: opaque data, accepted as given.
        5 => {
            for _ in 0..1 + rng.below(16) {
                let at = data_at + rng.below((b.len() - 8 - data_at) as u64) as usize;
                b[at] = rng.below(256) as u8;
            }
            reseal(&mut b);
            (b, Some(tokens.to_vec()))
        }
        // Cut or grown anywhere, then resealed: the lengths must catch it.
        6 => {
            let body = b.len() - 8;
            b.truncate(body);
            if rng.below(2) == 0 {
                b.truncate(8 + rng.below((body - 8) as u64) as usize);
            } else {
                b.extend((0..1 + rng.below(4096)).map(|_| rng.below(256) as u8));
            }
            b.extend_from_slice(&[0; 8]);
            reseal(&mut b);
            (b, None)
        }
        // Random bytes behind a valid magic and version.
        _ => {
            let mut out = good[..12].to_vec();
            out.extend((0..rng.below(2 * good.len() as u64)).map(|_| rng.below(256) as u8));
            out.extend_from_slice(&[0; 8]);
            reseal(&mut out);
            (out, None)
        }
    }
}

gpu_test! {
    // Hostile snapshots: over 100,000 mutated, truncated and resealed ones (10,000 in the
    // browser, the same code). None panics; a refused one changes nothing in the pool; an
    // accepted one holds exactly the tokens it carries and leaves the pool consistent, and one
    // whose mutation must be refused never is.
    async fn fuzzed_snapshots_are_refused_or_accepted_intact() {
        let n: u32 = if cfg!(target_arch = "wasm32") { 10_000 } else { 100_000 };
        let bytes = tiny_model(44);
        let mut source = Engine::load(&bytes, opts(4)).await.unwrap();
        let mut rng = Rng::new(12);
        let history = ids(&mut rng, 10);
        let good = source.export_snapshot(&history).await.unwrap();
        let vocab = source.config().vocab;
        let mut engine = Engine::load(&bytes, EngineOptions { check_integrity: false, ..opts(4) }).await.unwrap();
        let (mut refused, mut accepted) = (0u32, 0u32);
        for i in 0..n {
            let (data, want) = mutate(&mut rng, &good, &history, vocab);
            let before = (engine.stats().pool, engine.stats().refcounts);
            match engine.import_snapshot(&data) {
                Ok(got) => {
                    let want = want.unwrap_or_else(|| panic!("input {i}: a snapshot that must be refused was accepted ({} bytes)", data.len()));
                    assert_eq!(got, want, "input {i}: accepted with other tokens");
                    accepted += 1;
                }
                Err(e) => {
                    assert!(matches!(e, EngineError::Kv(KvError::Snapshot(_))), "input {i}: refused with {e}, not a snapshot error");
                    assert_eq!(before, (engine.stats().pool, engine.stats().refcounts), "input {i}: a refused snapshot changed the pool ({e})");
                    refused += 1;
                }
            }
            if i % 512 == 0 {
                engine.kv_cache().check_integrity().unwrap();
                engine.context().expect("a WebGPU engine").queue.submit(None);
            }
        }
        engine.kv_cache().check_integrity().unwrap();
        common::report(&format!("snapshot fuzz: {n} inputs, {refused} refused, {accepted} accepted, 0 panics"));
        assert!(accepted > n / 10 && refused > n / 2, "{accepted} accepted, {refused} refused: the mutations should reach both outcomes");
        // The engine still serves: the untouched snapshot imports and a request reuses it.
        assert_eq!(engine.import_snapshot(&good).unwrap(), history);
        let g = engine.generate(&history, &GenerateRequest { max_tokens: 3, ..Default::default() }, &mut |_| true).await.unwrap();
        assert!(g.prefix_hit_tokens > 0, "the imported prefix was not reused");
    }
}
