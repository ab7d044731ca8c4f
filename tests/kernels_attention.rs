//! Attention over the paged KV pool against the f64 CPU reference, natively and in the browser.
//! The whole pool is filled with random data and the block tables are shuffled (non-identity,
//! at a table_base > 0), so a key read past a token's causal limit or from a wrong block shows up.
//! block_size = max_len with one mapped block is the contiguous cache.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{assert_close, gpu, now_ms, report, variant_contexts};
use pagedlm::gpu::ops::attention::{attention_cpu, Attention, AttentionBuffers, AttentionPath, AttentionPlan, MAX_CHUNK};
use pagedlm::gpu::ops::pool::{PoolBuffers, PoolShape};
use pagedlm::gpu::{Context, Recorder};
use pagedlm::kv::KvDtype;
use pagedlm::rng::Rng;

/// Tolerance against the f64 reference: |got - want| <= TOL * max|v| + TOL * |want|. An output is
/// a weighted mean of v rows whose values span four orders of magnitude and both signs, so it can
/// cancel to near 0: its error scales with max|v|, not with itself. Measured worst errors on
/// lavapipe: 8e-8 * max|v| with unit-scale q and k, 1.2e-6 * max|v| with scores up to ±30.
const TOL: f32 = 1e-5;

/// Values spanning four orders of magnitude, so that small contributions must survive the sum.
fn varied(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0) * scale * 10f32.powf(rng.uniform(-2.0, 2.0))).collect()
}

/// The problem of one attention: `n_tokens` query rows over an f32 pool.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    n_tokens: u32,
    pool: PoolShape,
}

/// A shape with `block_size`-key blocks and two spare blocks in the pool.
fn paged(n_tokens: u32, (n_heads, n_kv_heads, head_dim): (u32, u32, u32), max_len: u32, block_size: u32) -> Shape {
    let n_blocks = max_len.div_ceil(block_size) + 2;
    Shape { n_tokens, pool: PoolShape { n_heads, n_kv_heads, head_dim, max_len, block_size, n_blocks, dtype: KvDtype::F32, window: 0, softcap: 0.0 } }
}

/// A block table whose row at `table_base` maps the sequence's ceil(max_len / block_size)
/// logical blocks to shuffled, distinct physical blocks (never the identity), with entries of
/// other sequences before and after it.
fn shuffled_table(rng: &mut Rng, shape: &PoolShape, table_base: u32) -> Vec<u32> {
    let mut perm: Vec<u32> = (0..shape.n_blocks).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let row_len = shape.max_len.div_ceil(shape.block_size) as usize;
    if perm[..row_len].iter().enumerate().all(|(i, &b)| b == i as u32) {
        perm.rotate_left(1);
    }
    let mut table: Vec<u32> = (0..table_base).map(|_| rng.below(shape.n_blocks as u64) as u32).collect();
    table.extend_from_slice(&perm[..row_len]);
    table.extend((0..3).map(|_| rng.below(shape.n_blocks as u64) as u32));
    table
}

/// Random inputs of one shape. `q_k_scale` scales q and k: scores have a standard deviation of
/// about q_k_scale² / 3 (×√(head_dim) / √(head_dim)).
struct Inputs {
    shape: Shape,
    qkv: Vec<f32>,
    k_pool: Vec<f32>,
    v_pool: Vec<f32>,
    table: Vec<u32>,
    table_base: u32,
    qkv_buf: wgpu::Buffer,
    k_buf: wgpu::Buffer,
    v_buf: wgpu::Buffer,
    pos_buf: wgpu::Buffer,
    table_buf: wgpu::Buffer,
    step_buf: wgpu::Buffer,
    out_buf: wgpu::Buffer,
}

impl Inputs {
    fn new(ctx: &Context, shape: Shape, seed: u64, q_k_scale: f32) -> Inputs {
        let mut rng = Rng::new(seed);
        let table_base = 1 + rng.below(7) as u32;
        let table = shuffled_table(&mut rng, &shape.pool, table_base);
        Inputs::with_table(ctx, shape, seed, q_k_scale, table, table_base)
    }

    fn with_table(ctx: &Context, shape: Shape, seed: u64, q_k_scale: f32, table: Vec<u32>, table_base: u32) -> Inputs {
        let mut rng = Rng::new(seed ^ 0x9e37);
        let qkv = rng.vec_uniform(shape.n_tokens as usize * shape.pool.qkv_row() as usize, -q_k_scale, q_k_scale);
        let pool = shape.pool.pool_len() as usize;
        let k_pool = rng.vec_uniform(pool, -q_k_scale, q_k_scale);
        let v_pool = varied(&mut rng, pool, 1.0);
        let out_len = shape.n_tokens as u64 * shape.pool.out_row();
        Inputs {
            qkv_buf: ctx.storage_init("qkv", bytemuck::cast_slice(&qkv)),
            k_buf: ctx.storage_init("k_pool", bytemuck::cast_slice(&k_pool)),
            v_buf: ctx.storage_init("v_pool", bytemuck::cast_slice(&v_pool)),
            pos_buf: ctx.storage_zeroed("positions", shape.n_tokens as u64 * 4),
            table_buf: ctx.storage_init("block_table", bytemuck::cast_slice(&table)),
            step_buf: ctx.uniform_init("step", bytemuck::bytes_of(&table_base)),
            // Poisoned so that an output row the kernels forget to write cannot pass.
            out_buf: ctx.storage_init("out", bytemuck::cast_slice(&vec![f32::NAN; out_len as usize])),
            shape,
            qkv,
            k_pool,
            v_pool,
            table,
            table_base,
        }
    }

    fn buffers<'a>(&'a self, out: &'a wgpu::Buffer) -> AttentionBuffers<'a> {
        AttentionBuffers {
            qkv: &self.qkv_buf,
            pool: PoolBuffers { k: &self.k_buf, v: &self.v_buf, block_table: &self.table_buf },
            positions: &self.pos_buf,
            step: &self.step_buf,
            out,
        }
    }

    fn attention(&self, ctx: &Context, plan: Option<AttentionPlan>) -> Attention {
        let s = self.shape;
        Attention::new(ctx, &self.buffers(&self.out_buf), s.pool, s.n_tokens, plan).unwrap_or_else(|e| panic!("{s:?} {plan:?}: {e}"))
    }

    /// Runs one step at `positions` and compares with the reference.
    async fn check(&self, ctx: &Context, attention: &mut Attention, positions: &[u32], what: &str) {
        let kv_len = positions.iter().max().copied().unwrap_or(0) + 1;
        attention.set_kv_len(kv_len).unwrap();
        ctx.queue.write_buffer(&self.pos_buf, 0, bytemuck::cast_slice(positions));
        let mut rec = Recorder::new(ctx, "attention test");
        for kernel in attention.kernels() {
            rec.dispatch(kernel);
        }
        rec.submit();
        let s = self.shape;
        let got = ctx.read_f32(&self.out_buf, 0, s.n_tokens as u64 * s.pool.out_row()).await.unwrap();
        let want = attention_cpu(&s.pool, &self.qkv, &self.k_pool, &self.v_pool, positions, &self.table, self.table_base).unwrap();
        let v_max = self.v_pool.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_close(&format!("{what} {s:?} {:?} kv_len {kv_len}", attention.plan()), &got, &want, TOL * v_max, TOL);
    }
}

fn plan(path: AttentionPath, chunk: u32) -> Option<AttentionPlan> {
    Some(AttentionPlan { path, chunk, workgroup_size: 8, one_dispatch_max_keys: 0, subgroups: false })
}

/// (n_heads, n_kv_heads, head_dim): MHA, MQA, SmolLM2's GQA, and a wide-head GQA.
const HEAD_SHAPES: [(u32, u32, u32); 4] = [(4, 4, 16), (8, 1, 32), (9, 3, 64), (6, 2, 128)];

gpu_test! {
    async fn decode_matches_cpu_across_context_lengths() {
        let ctx = gpu().await;
        // 4096 keys only natively: the browser run stays short.
        let (max_len, lengths): (u32, &[u32]) = if cfg!(target_arch = "wasm32") {
            (1000, &[1000, 1, 15, 16, 17, 33, 100, 65, 300])
        } else {
            (4096, &[1000, 1, 2, 15, 16, 17, 33, 63, 64, 65, 100, 300, 4096])
        };
        // Each head shape at every block size: 1, 16, 32, 64 and max_len (the contiguous cache).
        let cases = HEAD_SHAPES.iter().enumerate().flat_map(|(i, heads)| {
            [1u32, 16, 32, 64, max_len].into_iter().map(move |bs| (i, *heads, bs))
        });
        for (i, heads, block_size) in cases {
            let shape = paged(1, heads, max_len, block_size);
            let inputs = Inputs::new(&ctx, shape, 10 + i as u64 * 13 + block_size as u64, 1.0);
            // Auto (split-K, 128-key splits), small splits in GPU-sized workgroups, 512-key passes,
            // and one pass over everything (the baseline).
            let plans = [
                None,
                Some(AttentionPlan { path: AttentionPath::SplitK, chunk: 32, workgroup_size: 64, one_dispatch_max_keys: 0, subgroups: false }),
                Some(AttentionPlan { path: AttentionPath::SplitK, chunk: 128, workgroup_size: 8, one_dispatch_max_keys: 64, subgroups: false }),
                plan(AttentionPath::Passes, 512),
                plan(AttentionPath::Passes, 8192),
            ];
            for plan in plans {
                let mut attention = inputs.attention(&ctx, plan);
                // The same object across steps, longest first: stale split states must not leak.
                for &kv_len in lengths {
                    inputs.check(&ctx, &mut attention, &[kv_len - 1], "decode").await;
                }
            }
        }
    }
}

gpu_test! {
    async fn every_adapter_class_variant_matches_cpu() {
        // The auto plan of every adapter class, with and without subgroups where the adapter has
        // them (natively lavapipe: subgroups of 8; in Chromium none): workgroups of 8, 64 and 128
        // combining their splits in registers, through records (one per subgroup, or per
        // invocation without subgroups), or both; past 8,192 keys the real-GPU classes switch to
        // splits and a reduce. SmolLM2's heads, and Gemma 3's (sliced,
        // a local layer's window) natively.
        let shapes: &[((u32, u32, u32), u32)] =
            if cfg!(target_arch = "wasm32") { &[((9, 3, 64), 0)] } else { &[((9, 3, 64), 0), ((4, 1, 256), 40)] };
        for ctx in variant_contexts().await {
            for (i, &(heads, window)) in shapes.iter().enumerate() {
                let mut one = paged(1, heads, 9000, 16);
                one.pool.window = window;
                let decode = Inputs::new(&ctx, one, 500 + i as u64, 1.0);
                let mut attention = decode.attention(&ctx, None);
                for kv_len in [9000u32, 1, 17, 300, 2048, 2049, 8192, 8193] {
                    decode.check(&ctx, &mut attention, &[kv_len - 1], &format!("{} decode", ctx.variant_name())).await;
                }
                // A short prefill chunk (split-K up to 16 rows), lanes of 4 rows at their own positions.
                let mut chunk = paged(7, heads, 3000, 16);
                chunk.pool.window = window;
                let prefill = Inputs::new(&ctx, chunk, 600 + i as u64, 1.0);
                let mut attention = prefill.attention(&ctx, None);
                for start in [0u32, 2900] {
                    let positions: Vec<u32> = (start..start + 7).collect();
                    prefill.check(&ctx, &mut attention, &positions, &format!("{} prefill", ctx.variant_name())).await;
                }
            }
        }
    }
}

gpu_test! {
    async fn prefill_matches_cpu_from_zero_and_after_history() {
        let ctx = gpu().await;
        for (i, &(n_heads, n_kv_heads, head_dim)) in HEAD_SHAPES.iter().enumerate() {
            for (n_tokens, block_size) in [(1u32, 16u32), (7, 1), (7, 160), (64, 32), (100, 16), (100, 64), (33, 160)] {
                // max_len past the last position: random keys there must stay masked.
                let shape = paged(n_tokens, (n_heads, n_kv_heads, head_dim), 160, block_size);
                let inputs = Inputs::new(&ctx, shape, 100 + i as u64 * 7 + n_tokens as u64 + block_size as u64, 1.0);
                // Auto (split-K up to 16 tokens, else one pass), many passes, many splits.
                let plans = [None, plan(AttentionPath::Passes, 32), plan(AttentionPath::SplitK, 32)];
                for plan in plans {
                    let mut attention = inputs.attention(&ctx, plan);
                    for start in [0u32, 15, 16, 17, 37] {
                        let positions: Vec<u32> = (start..start + n_tokens).collect();
                        inputs.check(&ctx, &mut attention, &positions, "prefill").await;
                    }
                }
            }
        }
    }
}

gpu_test! {
    async fn passes_sharing_key_loads_over_subgroups_match_cpu() {
        // Passes with `subgroups` (natively lavapipe, subgroups of 8): the invocations of a
        // subgroup walk the union of their keys and 8 lanes share each key's loads. Every head
        // width (4, 8, 16, 32 vec4: fewer vec4 than lanes, one to four loads per lane), row counts
        // that leave the last workgroup of a KV head part empty, several passes, a sliding window
        // (lanes with different first keys), and the auto plan, which shares where it can. In
        // Chromium (no subgroups through wgpu) the plan is refused with its reason.
        let ctx = gpu().await;
        let shared = |chunk, workgroup_size| {
            Some(AttentionPlan { path: AttentionPath::Passes, chunk, workgroup_size, one_dispatch_max_keys: 0, subgroups: true })
        };
        if !ctx.has_subgroups(8) {
            let inputs = Inputs::new(&ctx, paged(20, (9, 3, 64), 160, 16), 3, 1.0);
            let err = Attention::new(&ctx, &inputs.buffers(&inputs.out_buf), inputs.shape.pool, 20, shared(32, 8))
                .err()
                .expect("passes with subgroups on a device without them must be refused");
            assert!(err.to_string().contains("subgroups"), "{err}");
            return;
        }
        assert!(AttentionPlan::auto(&ctx, 100, &paged(100, (9, 3, 64), 160, 16).pool).subgroups, "auto passes share loads");
        for (i, &heads) in HEAD_SHAPES.iter().enumerate() {
            for (n_tokens, block_size, window) in [(17u32, 16u32, 0u32), (100, 32, 0), (33, 1, 0), (61, 16, 23)] {
                let mut shape = paged(n_tokens, heads, 200, block_size);
                shape.pool.window = window;
                let inputs = Inputs::new(&ctx, shape, 900 + i as u64 * 5 + n_tokens as u64, 1.0);
                for plan in [None, shared(32, 8), shared(8192, 16)] {
                    let mut attention = inputs.attention(&ctx, plan);
                    for start in [0u32, 5, 99] {
                        let positions: Vec<u32> = (start..start + n_tokens).collect();
                        inputs.check(&ctx, &mut attention, &positions, "shared loads").await;
                    }
                }
            }
        }
        let inputs = Inputs::new(&ctx, paged(20, (9, 3, 64), 160, 16), 3, 1.0);
        let err = Attention::new(&ctx, &inputs.buffers(&inputs.out_buf), inputs.shape.pool, 20, shared(32, 12))
            .err()
            .expect("a workgroup that is not whole 8s must be refused");
        assert!(err.to_string().contains("whole 8s"), "{err}");
    }
}

gpu_test! {
    async fn large_scores_stay_stable() {
        let ctx = gpu().await;
        // q and k in ±5.5: scores with a standard deviation near 10, extremes near ±30 and beyond.
        let shape = paged(7, (9, 3, 64), 1100, 16);
        let inputs = Inputs::new(&ctx, shape, 7, 5.5);
        let scores_max = {
            let (q, k) = (&inputs.qkv[..64], &inputs.k_pool[..64 * 1000]);
            k.chunks(64).map(|row| row.iter().zip(q).map(|(a, b)| a * b).sum::<f32>().abs() / 8.0).fold(0f32, f32::max)
        };
        assert!(scores_max > 25.0, "the data must reach large scores, max |score| is {scores_max}");
        for plan in [None, plan(AttentionPath::Passes, 32), plan(AttentionPath::SplitK, 32)] {
            let mut attention = inputs.attention(&ctx, plan);
            for start in [0u32, 37, 993] {
                let positions: Vec<u32> = (start..start + 7).collect();
                inputs.check(&ctx, &mut attention, &positions, "large scores").await;
            }
        }
    }
}

gpu_test! {
    async fn shape_contract_errors() {
        let ctx = gpu().await;
        let shape = paged(2, (9, 3, 64), 100, 100);
        assert_eq!(shape.pool.n_blocks, 3);
        let inputs = Inputs::new(&ctx, shape, 1, 1.0);
        let (p, o) = (&inputs.pos_buf, &inputs.out_buf);
        let make = |n_tokens, n_heads, n_kv, hd, bs, n_blocks, out: &wgpu::Buffer| {
            let pool = PoolShape { n_heads, n_kv_heads: n_kv, head_dim: hd, block_size: bs, n_blocks, ..shape.pool };
            Attention::new(&ctx, &inputs.buffers(out), pool, n_tokens, None)
        };
        let expect = |r: Result<Attention, pagedlm::gpu::GpuError>, needle: &str| {
            let err = r.err().unwrap_or_else(|| panic!("expected an error mentioning {needle:?}"));
            assert!(err.to_string().contains(needle), "{err}");
        };

        let mut attention = make(2, 9, 3, 64, 100, 3, o).unwrap();
        let err = attention.set_kv_len(101).expect_err("kv_len past max_len must be refused");
        assert!(err.to_string().contains("kv_len 101"), "{err}");
        assert!(attention.set_kv_len(0).is_err(), "kv_len 0 must be refused");
        attention.set_kv_len(100).unwrap();

        expect(make(2, 9, 2, 64, 100, 3, o), "does not divide");
        expect(make(2, 9, 0, 64, 100, 3, o), "empty shape");
        expect(make(2, 9, 3, 64, 0, 3, o), "empty shape");
        expect(make(2, 9, 3, 64, 100, 0, o), "empty shape");
        expect(make(2, 9, 3, 62, 100, 3, o), "multiple of 4");
        expect(make(2, 9, 3, 260, 100, 3, o), "multiple of 4");
        expect(make(3, 9, 3, 64, 100, 3, o), "qkv needs");
        expect(make(2, 9, 3, 64, 101, 3, o), "k_pool needs");
        expect(make(2, 9, 3, 64, 100, 4, o), "k_pool needs");
        expect(make(2, 12, 3, 64, 100, 3, o), "qkv needs");
        expect(make(2, 9, 3, 64, 100, 3, p), "out needs");
        for (bad, needle) in [
            (plan(AttentionPath::SplitK, 0), "chunk 0"),
            (plan(AttentionPath::Passes, MAX_CHUNK + 1), "lavapipe's loop budget"),
            (
                Some(AttentionPlan { path: AttentionPath::SplitK, chunk: 64, workgroup_size: 0, one_dispatch_max_keys: 0, subgroups: false }),
                "workgroup size 0",
            ),
        ] {
            expect(Attention::new(&ctx, &inputs.buffers(o), shape.pool, shape.n_tokens, bad), needle);
        }
    }
}

gpu_test! {
    async fn unmapped_blocks_are_masked_not_read() {
        let ctx = gpu().await;
        // 100 keys in blocks of 16: logical block 2 maps past the pool, and the table ends after
        // logical block 4, so keys 32..48 and 80.. are skipped by kernels and reference alike.
        let shape = paged(3, (9, 3, 64), 100, 16);
        let table_base = 2;
        let mut table = vec![0u32; table_base as usize];
        table.extend([6, 3, shape.pool.n_blocks + 5, 0, 7]);
        let inputs = Inputs::with_table(&ctx, shape, 77, 1.0, table, table_base);
        for plan in [None, plan(AttentionPath::Passes, 16), plan(AttentionPath::SplitK, 32)] {
            let mut attention = inputs.attention(&ctx, plan);
            inputs.check(&ctx, &mut attention, &[97, 98, 99], "unmapped").await;
            inputs.check(&ctx, &mut attention, &[20, 50, 70], "unmapped").await;
        }
    }
}

gpu_test! {
    async fn sliding_window_matches_cpu() {
        let ctx = gpu().await;
        // Gemma 3's heads (4 query heads over 1 KV head of 256) and SmolLM2's; windows smaller
        // than a block, equal to one and spanning several, in blocks of 16.
        let cases: [((u32, u32, u32), u32); 4] = [((4, 1, 256), 1), ((4, 1, 256), 16), ((4, 1, 256), 40), ((9, 3, 64), 5)];
        for (i, &(head, window)) in cases.iter().enumerate() {
            {
                let mut shape = paged(7, head, 300, 16);
                shape.pool.window = window;
                let inputs = Inputs::new(&ctx, shape, 300 + i as u64 * 11 + window as u64, 1.0);
                let plans = [None, plan(AttentionPath::Passes, 32), plan(AttentionPath::SplitK, 32)];
                for plan in plans {
                    let mut attention = inputs.attention(&ctx, plan);
                    for start in [0u32, 15, 41, 290] {
                        let positions: Vec<u32> = (start..start + 7).collect();
                        inputs.check(&ctx, &mut attention, &positions, "window prefill").await;
                    }
                }
                // Decode at many lengths through the split-K plan (one token, a window of keys).
                let mut one = paged(1, head, 300, 16);
                one.pool.window = window;
                let decode = Inputs::new(&ctx, one, 400 + window as u64, 1.0);
                for plan in [None, plan(AttentionPath::SplitK, 32)] {
                    let mut attention = decode.attention(&ctx, plan);
                    for kv_len in [300u32, 1, 17, 41, 129] {
                        decode.check(&ctx, &mut attention, &[kv_len - 1], "window decode").await;
                    }
                }
            }
        }
    }
}

gpu_test! {
    async fn soft_capped_scores_match_cpu() {
        // Gemma 2's soft-cap on the scores, with a window and without, in prefill and decode
        // through each plan; q and k scaled so that the scores reach past the cap.
        let ctx = gpu().await;
        for (i, &(head, window, cap)) in [((8u32, 4u32, 256u32), 40u32, 3.0f32), ((9, 3, 64), 0, 1.5)].iter().enumerate() {
            let mut shape = paged(7, head, 300, 16);
            shape.pool.window = window;
            shape.pool.softcap = cap;
            let inputs = Inputs::new(&ctx, shape, 500 + i as u64, 3.0);
            for plan in [None, plan(AttentionPath::SplitK, 32)] {
                let mut attention = inputs.attention(&ctx, plan);
                for start in [0u32, 290] {
                    let positions: Vec<u32> = (start..start + 7).collect();
                    inputs.check(&ctx, &mut attention, &positions, "soft-capped prefill").await;
                }
            }
            let mut one = paged(1, head, 300, 16);
            one.pool = PoolShape { window, softcap: cap, ..one.pool };
            let decode = Inputs::new(&ctx, one, 600 + i as u64, 3.0);
            for plan in [None, plan(AttentionPath::SplitK, 32)] {
                let mut attention = decode.attention(&ctx, plan);
                for kv_len in [300u32, 17] {
                    decode.check(&ctx, &mut attention, &[kv_len - 1], "soft-capped decode").await;
                }
            }
        }
        // A negative or infinite cap is refused.
        let mut bad = paged(1, (9, 3, 64), 300, 16);
        bad.pool.softcap = -1.0;
        let inputs = Inputs::new(&ctx, paged(1, (9, 3, 64), 300, 16), 7, 1.0);
        let err = Attention::new(&ctx, &inputs.buffers(&inputs.out_buf), bad.pool, 1, None).err().expect("a negative cap");
        assert!(err.to_string().contains("softcap"), "{err}");
    }
}

gpu_test! {
    async fn blocks_before_the_window_are_never_read() {
        let ctx = gpu().await;
        // The KV cache frees a local layer's blocks once every query is past them and marks their
        // table slots u32::MAX: with a window of 20, keys 0..64 (blocks 0-3) are out of every
        // query's window from position 84 on.
        let mut shape = paged(3, (4, 1, 256), 160, 16);
        shape.pool.window = 20;
        let table_base = 1;
        let mut table = vec![0u32; table_base as usize];
        table.extend([u32::MAX, u32::MAX, u32::MAX, u32::MAX, 6, 3, 0, 7, 2, 8]);
        let inputs = Inputs::with_table(&ctx, shape, 78, 1.0, table, table_base);
        for plan in [None, plan(AttentionPath::Passes, 16), plan(AttentionPath::SplitK, 16)] {
            let mut attention = inputs.attention(&ctx, plan);
            inputs.check(&ctx, &mut attention, &[84, 85, 86], "freed blocks").await;
            inputs.check(&ctx, &mut attention, &[157, 158, 159], "freed blocks").await;
        }
    }
}

/// Attention time per layer for SmolLM2's shapes, natively (lavapipe):
/// `XDG_RUNTIME_DIR=/tmp cargo test --test kernels_attention -- --ignored --nocapture`,
/// and in the browser (SwiftShader): `wasm-pack test --headless --chrome -- --test kernels_attention
/// -- --include-ignored` (with the environment of the other browser runs).
async fn bench_attention_body() {
    let ctx = gpu().await;
    report(&format!("adapter: {}", ctx.adapter_name()));
    for block_size in [16u32, 8192] {
        let decode = paged(1, (9, 3, 64), 8192, block_size);
        let inputs = Inputs::new(&ctx, decode, 3, 1.0);
        let wg = AttentionPlan::auto(&ctx, 1, &decode.pool).workgroup_size;
        let records = Some(AttentionPlan { path: AttentionPath::SplitK, chunk: 128, workgroup_size: wg, one_dispatch_max_keys: 8192, subgroups: false });
        let plans = [
            ("auto (one dispatch on CPU adapters)", None),
            ("one dispatch, records, no subgroups", records),
            ("split-K 128 + reduce", plan(AttentionPath::SplitK, 128)),
            ("split-K 256 + reduce", plan(AttentionPath::SplitK, 256)),
            ("one invocation per KV head (baseline)", plan(AttentionPath::Passes, 8192)),
        ];
        let mut attentions: Vec<Attention> = plans.iter().map(|(_, plan)| inputs.attention(&ctx, *plan)).collect();
        for kv_len in [128u32, 512, 2048, 8000] {
            ctx.queue.write_buffer(&inputs.pos_buf, 0, bytemuck::bytes_of(&(kv_len - 1)));
            for ((name, _), attention) in plans.iter().zip(attentions.iter_mut()) {
                attention.set_kv_len(kv_len).unwrap();
                let (first_ms, us) = time_us(&ctx, attention, &inputs.out_buf, 50).await;
                let first = if kv_len == 128 { format!("  (first call {first_ms:.0} ms)") } else { String::new() };
                report(&format!("decode 9q/3kv hd64 block {block_size:4} kv_len {kv_len:5} {name:40} {us:9.1} µs{first}"));
            }
        }
    }

    let prefill = paged(512, (9, 3, 64), 512, 16);
    let inputs = Inputs::new(&ctx, prefill, 4, 1.0);
    let positions: Vec<u32> = (0..512).collect();
    ctx.queue.write_buffer(&inputs.pos_buf, 0, bytemuck::cast_slice(&positions));
    for (name, plan) in
        [("one pass (auto)", None), ("passes of 128 keys", plan(AttentionPath::Passes, 128)), ("split-K, 128-key splits", plan(AttentionPath::SplitK, 128))]
    {
        let attention = inputs.attention(&ctx, plan);
        let (first_ms, us) = time_us(&ctx, &attention, &inputs.out_buf, 3).await;
        report(&format!("prefill 512 tokens from 0, 9q/3kv hd64 {name:28} {us:9.1} µs  (first call {first_ms:.0} ms)"));
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore = "benchmark"]
fn bench_attention() {
    pollster::block_on(bench_attention_body());
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen_test::wasm_bindgen_test]
#[ignore = "benchmark"]
async fn bench_attention() {
    bench_attention_body().await;
}

/// Wall time of one call: `reps` calls recorded into one submission, waited for by a 4-byte
/// readback whose own cost (about 2 ms in Chromium) is measured and subtracted; the best of 3
/// such runs (the machines are shared), after a warm-up. Returns the warm-up's wall time in ms
/// (with the adapter's pipeline compilation when the pipelines are new) and the µs per call.
async fn time_us(ctx: &Context, attention: &Attention, out: &wgpu::Buffer, reps: u32) -> (f64, f64) {
    let run = |n: u32| {
        let mut rec = Recorder::new(ctx, "bench");
        for _ in 0..n {
            for kernel in attention.kernels() {
                rec.dispatch(kernel);
            }
        }
        rec.submit();
    };
    let start = now_ms();
    run(1);
    ctx.read_f32(out, 0, 1).await.unwrap();
    let first_ms = now_ms() - start;
    let (mut readback, mut best) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        let start = now_ms();
        ctx.read_f32(out, 0, 1).await.unwrap();
        readback = readback.min(now_ms() - start);
        let start = now_ms();
        run(reps);
        ctx.read_f32(out, 0, 1).await.unwrap();
        best = best.min(now_ms() - start);
    }
    (first_ms, (best - readback).max(0.0) * 1e3 / reps as f64)
}
