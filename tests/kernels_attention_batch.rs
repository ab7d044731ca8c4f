//! Batched decode attention (rows of different sequences in one dispatch) against the f64 CPU
//! reference and against the single-sequence `Attention`, natively and in the browser.
//! The whole pool is random and every sequence's blocks are shuffled, so a key read from a wrong
//! block, past a row's kv_len or from another row's sequence shows up. Two sequences share their
//! first blocks (a common prefix), one has an unmapped block, one row's table runs off the end of
//! the table buffer, and padding rows (kv_len 0) sit between real ones. INT8 pools are checked
//! against the same reference over their dequantized values and against the single-sequence
//! `Attention` over the same INT8 buffers.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{assert_close, gpu, now_ms, report, variant_contexts};
use pagedlm::gpu::ops::attention::{attention_batch_cpu, Attention, AttentionBatch, AttentionBuffers, BatchBuffers, BatchPlan, BatchRow, BatchStep};
use pagedlm::gpu::ops::pool::{PoolBuffers, PoolShape};
use pagedlm::gpu::{Context, GpuError, Recorder};
use pagedlm::kv::KvDtype;
use pagedlm::quant::kv_int8::{dequantize_pool, quantize_pool, Int8Layout};
use pagedlm::rng::Rng;

/// Tolerance against the f64 reference: |got - want| <= TOL * max|v| + TOL * |want|. An output is
/// a weighted mean of v rows spanning four orders of magnitude and both signs that can cancel to
/// near 0, so its error scales with max|v| (as in kernels_attention.rs).
const TOL: f32 = 1e-5;

/// Values spanning four orders of magnitude, so that small contributions must survive the sum.
fn varied(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0) * scale * 10f32.powf(rng.uniform(-2.0, 2.0))).collect()
}

fn shuffle(rng: &mut Rng, v: &mut [u32]) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

/// A pool of random K/V and a block table holding `n_seqs` sequences of up to max_len keys, each
/// on shuffled physical blocks. Sequence 1 shares its first `shared_blocks` blocks with sequence 0
/// (a forked prefix); sequence `n_seqs - 1` has logical block 2 unmapped (a block id past the
/// pool). The table starts and ends with 3 entries of no sequence (valid blocks).
struct Pool {
    shape: PoolShape,
    /// Rows of the batches over this pool.
    max_rows: u32,
    /// The pools' values as f32 (for INT8: the dequantized codes, which the kernel must read).
    k: Vec<f32>,
    v: Vec<f32>,
    table: Vec<u32>,
    /// table_base of each sequence.
    seqs: Vec<u32>,
    k_buf: wgpu::Buffer,
    v_buf: wgpu::Buffer,
    table_buf: wgpu::Buffer,
}

/// What [`Pool::new`] builds.
struct PoolSpec {
    /// (n_heads, n_kv_heads, head_dim).
    heads: (u32, u32, u32),
    block_size: u32,
    max_len: u32,
    max_rows: u32,
    n_seqs: u32,
    shared_blocks: u32,
}

impl Pool {
    fn new(ctx: &Context, spec: PoolSpec, seed: u64, q_k_scale: f32) -> Pool {
        let PoolSpec { heads: (n_heads, n_kv_heads, head_dim), block_size, max_len, max_rows, n_seqs, shared_blocks } = spec;
        let mut rng = Rng::new(seed);
        let row_len = max_len.div_ceil(block_size);
        let n_blocks = n_seqs * row_len + 2;
        let shape = PoolShape { n_heads, n_kv_heads, head_dim, max_len, block_size, n_blocks, dtype: KvDtype::F32, window: 0, softcap: 0.0 };
        let mut perm: Vec<u32> = (0..n_blocks).collect();
        shuffle(&mut rng, &mut perm);
        let junk = |rng: &mut Rng| (0..3).map(|_| rng.below(n_blocks as u64) as u32).collect::<Vec<u32>>();
        let mut table = junk(&mut rng);
        let mut seqs = Vec::new();
        for s in 0..n_seqs {
            seqs.push(table.len() as u32);
            let mut row = perm[(s * row_len) as usize..][..row_len as usize].to_vec();
            if s == 1 {
                row[..shared_blocks as usize].copy_from_slice(&table[seqs[0] as usize..][..shared_blocks as usize]);
            }
            if s == n_seqs - 1 && row_len > 2 {
                row[2] = n_blocks + 5;
            }
            table.extend(row);
        }
        table.extend(junk(&mut rng));
        let len = shape.pool_len() as usize;
        let k = rng.vec_uniform(len, -q_k_scale, q_k_scale);
        let v = varied(&mut rng, len, 1.0);
        Pool {
            k_buf: ctx.storage_init("k_pool", bytemuck::cast_slice(&k)),
            v_buf: ctx.storage_init("v_pool", bytemuck::cast_slice(&v)),
            table_buf: ctx.storage_init("block_table", bytemuck::cast_slice(&table)),
            shape,
            max_rows,
            k,
            v,
            table,
            seqs,
        }
    }

    /// The same pool quantized to INT8 (crate::quant::kv_int8's CPU quantizer): the buffers hold codes
    /// and scales, `k` / `v` their dequantized values.
    fn int8(self, ctx: &Context) -> Pool {
        let s = self.shape;
        let layout = Int8Layout::new(s.n_blocks, s.n_kv_heads, s.block_size, s.head_dim).unwrap();
        let k_words = quantize_pool(&layout, &self.k).unwrap();
        let v_words = quantize_pool(&layout, &self.v).unwrap();
        Pool {
            shape: PoolShape { dtype: KvDtype::Int8, ..s },
            k: dequantize_pool(&layout, &k_words).unwrap(),
            v: dequantize_pool(&layout, &v_words).unwrap(),
            k_buf: ctx.storage_init("k_pool.int8", bytemuck::cast_slice(&k_words)),
            v_buf: ctx.storage_init("v_pool.int8", bytemuck::cast_slice(&v_words)),
            ..self
        }
    }

    fn v_max(&self) -> f32 {
        self.v.iter().fold(0f32, |m, v| m.max(v.abs()))
    }

    fn buffers(&self) -> PoolBuffers<'_> {
        PoolBuffers { k: &self.k_buf, v: &self.v_buf, block_table: &self.table_buf }
    }
}

/// The per-step inputs and outputs of a batch of `pool.max_rows` rows over a pool.
struct Batch {
    qkv: Vec<f32>,
    qkv_buf: wgpu::Buffer,
    batch_buf: wgpu::Buffer,
    out_buf: wgpu::Buffer,
}

impl Batch {
    fn new(ctx: &Context, pool: &Pool, seed: u64, q_k_scale: f32) -> Batch {
        let (s, max_rows) = (pool.shape, pool.max_rows);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let qkv = rng.vec_uniform(max_rows as usize * s.qkv_row() as usize, -q_k_scale, q_k_scale);
        Batch {
            qkv_buf: ctx.storage_init("qkv", bytemuck::cast_slice(&qkv)),
            batch_buf: ctx.storage_zeroed("batch", BatchStep::buffer_bytes(max_rows)),
            out_buf: ctx.storage_zeroed("out", max_rows as u64 * s.out_row() * 4),
            qkv,
        }
    }

    fn buffers<'a>(&'a self, pool: &'a Pool) -> BatchBuffers<'a> {
        BatchBuffers { qkv: &self.qkv_buf, pool: pool.buffers(), batch: &self.batch_buf, out: &self.out_buf, scratch: None }
    }

    fn attention(&self, ctx: &Context, pool: &Pool, plan: Option<BatchPlan>) -> AttentionBatch {
        AttentionBatch::new(ctx, &self.buffers(pool), pool.shape, pool.max_rows, plan).unwrap_or_else(|e| panic!("{:?} {plan:?}: {e}", pool.shape))
    }

    /// Runs one step of `rows` with out poisoned by NaN; returns all max_rows output rows.
    async fn run(&self, ctx: &Context, attention: &mut AttentionBatch, rows: &[BatchRow]) -> Vec<f32> {
        let out_len = (attention.max_rows() as u64 * attention.pool().out_row()) as usize;
        ctx.queue.write_buffer(&self.out_buf, 0, bytemuck::cast_slice(&vec![f32::NAN; out_len]));
        let step = attention.step(rows).unwrap();
        ctx.queue.write_buffer(&self.batch_buf, 0, step.bytes());
        attention.set_step(&step).unwrap();
        let mut rec = Recorder::new(ctx, "attention_batch test");
        rec.dispatch_all(attention.kernels());
        rec.submit();
        ctx.read_f32(&self.out_buf, 0, out_len as u64).await.unwrap()
    }

    /// Runs one step and compares its rows with the reference; rows past the step stay untouched.
    async fn check(&self, ctx: &Context, pool: &Pool, attention: &mut AttentionBatch, rows: &[BatchRow], what: &str) {
        let got = self.run(ctx, attention, rows).await;
        let s = pool.shape;
        let used = rows.len() * s.out_row() as usize;
        let want = attention_batch_cpu(&s, &self.qkv, &pool.k, &pool.v, &pool.table, rows).unwrap();
        let label = format!("{what} {s:?} {:?} rows {rows:?}", attention.plan());
        assert_close(&label, &got[..used], &want, TOL * pool.v_max(), TOL);
        assert!(got[used..].iter().all(|x| x.is_nan()), "{label}: an output row past the step was written");
        for (r, row) in rows.iter().enumerate() {
            if row.kv_len == 0 {
                let out = &got[r * s.out_row() as usize..][..s.out_row() as usize];
                assert!(out.iter().all(|&x| x == 0.0), "{label}: padding row {r} is not zeros");
            }
        }
    }
}

/// A [`PoolSpec`]: heads, block_size, max_len, max_rows, n_seqs, shared_blocks.
fn spec(heads: (u32, u32, u32), block_size: u32, max_len: u32, max_rows: u32, n_seqs: u32, shared_blocks: u32) -> PoolSpec {
    PoolSpec { heads, block_size, max_len, max_rows, n_seqs, shared_blocks }
}

fn row(table_base: u32, kv_len: u32) -> BatchRow {
    BatchRow { table_base, kv_len }
}

/// SmolLM2's heads and a small GQA.
const HEAD_SHAPES: [(u32, u32, u32); 2] = [(9, 3, 64), (4, 2, 16)];

fn plans() -> Vec<Option<BatchPlan>> {
    let mut plans = vec![
        // Auto: one dispatch of workgroup splits at every length on CPU adapters.
        None,
        // Small splits, GPU-sized workgroups, always split.
        Some(BatchPlan { chunk: 32, workgroup_size: 64, one_dispatch_max_keys: 0, subgroups: false }),
    ];
    if !cfg!(target_arch = "wasm32") {
        // One dispatch up to 2048 keys, and odd-sized splits in small workgroups.
        plans.push(Some(BatchPlan { chunk: 128, workgroup_size: 8, one_dispatch_max_keys: 2048, subgroups: false }));
        plans.push(Some(BatchPlan { chunk: 100, workgroup_size: 4, one_dispatch_max_keys: 100, subgroups: false }));
    }
    plans
}

/// The mixed steps over a pool built by [`Pool::new`] with 10 rows and 5 sequences.
fn mixed_steps(pool: &Pool) -> [Vec<BatchRow>; 5] {
    let max_len = pool.shape.max_len;
    let block_size = pool.shape.block_size;
    let seq = &pool.seqs;
    let past_end = pool.table.len() as u32 - 2;
    [
        // Very different lengths, a padding row, the same sequence twice (like prefill rows),
        // the shared prefix, a split boundary, an unmapped block, a table row that runs past the
        // table's end.
        vec![
            row(seq[0], 2000),
            row(seq[1], 300),
            row(seq[2], 1),
            row(seq[3], 17),
            row(0, 0),
            row(seq[0], 1500),
            row(seq[4], 300),
            row(seq[1], 129),
            row(past_end, 3 * block_size),
        ],
        // Short rows only (the single pass under the auto plan).
        vec![row(seq[2], 256), row(0, 0), row(seq[3], 5), row(seq[1], 112)],
        // One long row, max_len keys.
        vec![row(seq[4], max_len)],
        // The full batch.
        (0..10).map(|r| row(seq[r % 5], 1 + (r as u32 * 211) % max_len)).collect(),
        // Padding only.
        vec![row(0, 0), row(seq[0], 0)],
    ]
}

/// Every head shape, block size and plan over the mixed steps, against the CPU reference.
async fn mixed_rows(dtype: KvDtype, block_sizes: &[u32]) {
    let ctx = gpu().await;
    let max_len = 2048;
    for (i, &heads) in HEAD_SHAPES.iter().enumerate() {
        for &block_size in block_sizes {
            // Sequences 0 and 1 share their first 100-odd keys.
            let shared = 112u32.div_ceil(block_size);
            let mut pool = Pool::new(&ctx, spec(heads, block_size, max_len, 10, 5, shared), 10 + i as u64 * 31 + block_size as u64, 1.0);
            if dtype == KvDtype::Int8 {
                pool = pool.int8(&ctx);
            }
            let batch = Batch::new(&ctx, &pool, 7 + block_size as u64, 1.0);
            let steps = mixed_steps(&pool);
            for plan in plans() {
                let mut attention = batch.attention(&ctx, &pool, plan);
                // The same object across steps: stale split states must not leak.
                for rows in &steps {
                    batch.check(&ctx, &pool, &mut attention, rows, "mixed").await;
                }
            }
        }
    }
}

gpu_test! {
    async fn mixed_rows_match_cpu() {
        mixed_rows(KvDtype::F32, &[1, 16, 7]).await;
    }
}

gpu_test! {
    async fn int8_mixed_rows_match_cpu() {
        mixed_rows(KvDtype::Int8, &[16, 7]).await;
    }
}

gpu_test! {
    async fn every_adapter_class_variant_matches_cpu() {
        // The auto plan of every adapter class, with and without subgroups where the adapter has
        // them: one dispatch of workgroup splits (8, 64 or 128 invocations), and for the real-GPU
        // classes splits and a reduce once a row passes 8,192 keys (the max_len row of the mixed
        // steps). f32 and INT8 (natively) over SmolLM2's heads.
        let dtypes: &[KvDtype] = if cfg!(target_arch = "wasm32") { &[KvDtype::F32] } else { &[KvDtype::F32, KvDtype::Int8] };
        for ctx in variant_contexts().await {
            for &dtype in dtypes {
                let shared = 112u32.div_ceil(16);
                let mut pool = Pool::new(&ctx, spec((9, 3, 64), 16, 9000, 10, 5, shared), 71, 1.0);
                if dtype == KvDtype::Int8 {
                    pool = pool.int8(&ctx);
                }
                let batch = Batch::new(&ctx, &pool, 72, 1.0);
                let mut attention = batch.attention(&ctx, &pool, None);
                for rows in &mixed_steps(&pool) {
                    batch.check(&ctx, &pool, &mut attention, rows, &format!("{} {dtype:?}", ctx.variant_name())).await;
                }
            }
        }
    }
}

gpu_test! {
    async fn sliding_window_rows_match_cpu() {
        let ctx = gpu().await;
        // Gemma 3's heads (4 query heads over 1 KV head of 256); windows smaller than a block,
        // equal to one and spanning several; f32, and INT8 for one of them.
        for (window, dtype) in [(5u32, KvDtype::F32), (16, KvDtype::F32), (40, KvDtype::F32), (40, KvDtype::Int8)] {
            let mut pool = Pool::new(&ctx, spec((4, 1, 256), 16, 2048, 10, 5, 7), 50 + window as u64, 1.0);
            if dtype == KvDtype::Int8 {
                pool = pool.int8(&ctx);
            }
            pool.shape.window = window;
            let batch = Batch::new(&ctx, &pool, 9 + window as u64, 1.0);
            let steps = mixed_steps(&pool);
            for plan in plans().into_iter().take(2) {
                let mut attention = batch.attention(&ctx, &pool, plan);
                for rows in &steps {
                    batch.check(&ctx, &pool, &mut attention, rows, &format!("window {window} {dtype:?}")).await;
                }
            }
        }
    }
}

/// Each row of a batch against the same row run alone through `Attention` (a
/// one-token decode step of its sequence) over the same pool buffers.
async fn equals_single_sequence(dtype: KvDtype) {
    let ctx = gpu().await;
    for (i, &heads) in HEAD_SHAPES.iter().enumerate() {
        for block_size in [16u32, 7] {
            let mut pool = Pool::new(&ctx, spec(heads, block_size, 2048, 6, 4, 3), 50 + i as u64 + block_size as u64, 1.0);
            if dtype == KvDtype::Int8 {
                pool = pool.int8(&ctx);
            }
            let batch = Batch::new(&ctx, &pool, 60 + block_size as u64, 1.0);
            let seq = &pool.seqs;
            let rows = [row(seq[0], 2000), row(seq[1], 300), row(seq[2], 1), row(seq[3], 17), row(seq[1], 129), row(seq[0], 200)];
            let mut attention = batch.attention(&ctx, &pool, None);
            let got = batch.run(&ctx, &mut attention, &rows).await;
            let s = pool.shape;
            let (qkv_row, out_row) = (s.qkv_row() as usize, s.out_row() as usize);
            let mut worst = 0f32;
            for (r, br) in rows.iter().enumerate() {
                let qkv = ctx.storage_init("qkv1", bytemuck::cast_slice(&batch.qkv[r * qkv_row..][..qkv_row]));
                let positions = ctx.storage_init("pos1", bytemuck::bytes_of(&(br.kv_len - 1)));
                let step = ctx.uniform_init("step1", bytemuck::bytes_of(&br.table_base));
                let out = ctx.storage_zeroed("out1", out_row as u64 * 4);
                let buffers = AttentionBuffers { qkv: &qkv, pool: pool.buffers(), positions: &positions, step: &step, out: &out };
                let mut one = Attention::new(&ctx, &buffers, s, 1, None).unwrap();
                one.set_kv_len(br.kv_len).unwrap();
                let mut rec = Recorder::new(&ctx, "single");
                rec.dispatch_all(one.kernels());
                rec.submit();
                let want = ctx.read_f32(&out, 0, out_row as u64).await.unwrap();
                let got_row = &got[r * out_row..][..out_row];
                let label = format!("row {r} {br:?} {s:?} vs Attention");
                // Same f32 arithmetic in the same key order, up to the compiler's fusing:
                // measured 1e-6 to 2e-6 at max|v| near 100 on lavapipe.
                assert_close(&label, got_row, &want, 1e-5, 1e-5);
                worst = got_row.iter().zip(&want).fold(worst, |m, (a, b)| m.max((a - b).abs()));
            }
            report(&format!("{} {heads:?} block {block_size}: max |batched - Attention| = {worst:e}", dtype.name()));
        }
    }
}

gpu_test! {
    async fn equals_single_sequence_attention() {
        equals_single_sequence(KvDtype::F32).await;
    }
}

gpu_test! {
    async fn int8_equals_single_sequence_attention() {
        equals_single_sequence(KvDtype::Int8).await;
    }
}

gpu_test! {
    async fn large_scores_stay_stable() {
        let ctx = gpu().await;
        // q and k in ±5.5: scores with a standard deviation near 10, extremes past ±30.
        let pool = Pool::new(&ctx, spec((9, 3, 64), 16, 1100, 4, 3, 2), 9, 5.5);
        let batch = Batch::new(&ctx, &pool, 9, 5.5);
        let seq = &pool.seqs;
        let rows = [row(seq[0], 1100), row(seq[1], 37), row(seq[2], 600), row(seq[0], 993)];
        let plans = [None, Some(BatchPlan { chunk: 32, workgroup_size: 8, one_dispatch_max_keys: 0, subgroups: false })];
        for plan in plans {
            let mut attention = batch.attention(&ctx, &pool, plan);
            batch.check(&ctx, &pool, &mut attention, &rows, "large scores").await;
        }
        // The same values as INT8: the key scale multiplies scores after the dot product.
        let pool = pool.int8(&ctx);
        for plan in plans {
            let mut attention = batch.attention(&ctx, &pool, plan);
            batch.check(&ctx, &pool, &mut attention, &rows, "large scores, INT8").await;
        }
    }
}

gpu_test! {
    async fn shape_and_step_contract_errors() {
        let ctx = gpu().await;
        let pool = Pool::new(&ctx, spec((9, 3, 64), 16, 100, 3, 2, 1), 1, 1.0);
        let batch = Batch::new(&ctx, &pool, 1, 1.0);
        let expect = |r: Result<AttentionBatch, GpuError>, needle: &str| {
            let err = r.err().unwrap_or_else(|| panic!("expected an error mentioning {needle:?}"));
            assert!(err.to_string().contains(needle), "{err}");
        };
        let (s, max_rows) = (pool.shape, pool.max_rows);
        let b = batch.buffers(&pool);
        let make =
            |shape: PoolShape, max_rows: u32, plan: Option<BatchPlan>| AttentionBatch::new(&ctx, &b, shape, max_rows, plan);
        expect(make(s, 4, None), "qkv needs");
        expect(make(PoolShape { n_kv_heads: 2, ..s }, max_rows, None), "does not divide");
        expect(make(PoolShape { head_dim: 62, ..s }, max_rows, None), "multiple of 4");
        expect(make(s, 0, None), "empty shape");
        expect(make(PoolShape { n_blocks: s.n_blocks + 1, ..s }, max_rows, None), "k_pool needs");
        expect(make(PoolShape { head_dim: 60, dtype: KvDtype::Int8, ..s }, max_rows, None), "multiple of 16");
        expect(make(s, max_rows, Some(BatchPlan { chunk: 0, workgroup_size: 8, one_dispatch_max_keys: 0, subgroups: false })), "chunk 0");
        expect(make(s, max_rows, Some(BatchPlan { chunk: 70_000, workgroup_size: 8, one_dispatch_max_keys: 0, subgroups: false })), "loop budget");
        let small_batch = ctx.storage_zeroed("batch", 16);
        let small = BatchBuffers { batch: &small_batch, ..batch.buffers(&pool) };
        expect(AttentionBatch::new(&ctx, &small, s, max_rows, None), "batch needs");
        let small_scratch = ctx.storage_zeroed("scratch", 16);
        let small = BatchBuffers { scratch: Some(&small_scratch), ..batch.buffers(&pool) };
        expect(AttentionBatch::new(&ctx, &small, s, max_rows, None), "scratch needs");

        let mut attention = make(s, max_rows, None).unwrap();
        assert!(attention.kernels().is_empty(), "no step, no dispatch");
        let err = attention.step(&[row(0, 101)]).expect_err("kv_len past max_len");
        assert!(err.to_string().contains("kv_len 101"), "{err}");
        let err = attention.step(&[row(0, 1); 4]).expect_err("4 rows in a batch of 3");
        assert!(err.to_string().contains("4 rows"), "{err}");
        let other = make(s, max_rows, Some(BatchPlan { chunk: 32, workgroup_size: 8, one_dispatch_max_keys: 0, subgroups: false })).unwrap();
        let foreign = other.step(&[row(0, 50)]).unwrap();
        assert!(attention.set_step(&foreign).is_err(), "a step encoded for another chunk must be refused");

        // The encoding itself: header (n_rows, total_splits, one row per sequence, 0), then
        // (table_base, kv_len, first_split, 0) per row. A padding row (kv_len 0) shares no
        // sequence; two rows with keys and one table_base do.
        let step = other.step(&[row(3, 70), row(9, 0), row(5, 33)]).unwrap();
        let words: &[u32] = bytemuck::cast_slice(step.bytes());
        assert_eq!(words, &[3, 3 + 2, 1, 0, 3, 70, 0, 0, 9, 0, 3, 0, 5, 33, 3, 0]);
        let padded = other.step(&[row(3, 70), row(3, 0)]).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, u32>(padded.bytes())[2], 1);
        let shared = other.step(&[row(3, 70), row(5, 9), row(3, 71)]).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, u32>(shared.bytes())[..4], [3, 3 + 1 + 3, 0, 0]);
        assert_eq!((step.n_rows(), step.total_splits(), step.max_kv_len()), (3, 5, 70));
        attention.set_step(&attention.step(&[]).unwrap()).unwrap();
        assert!(attention.kernels().is_empty(), "an empty step records nothing");

        // An INT8 pool's buffers are about a quarter of an f32 pool's: an f32 shape refuses them.
        let int8 = Pool::new(&ctx, spec((9, 3, 64), 16, 100, 3, 2, 1), 1, 1.0).int8(&ctx);
        let int8_buffers = batch.buffers(&int8);
        AttentionBatch::new(&ctx, &int8_buffers, int8.shape, max_rows, None).unwrap();
        let as_f32 = PoolShape { dtype: KvDtype::F32, ..int8.shape };
        expect(AttentionBatch::new(&ctx, &int8_buffers, as_f32, max_rows, None), "k_pool needs");
    }
}

/// Wall time per call of `record` (all its dispatches): `reps` calls in one submission, waited
/// for by a 4-byte readback whose own cost is measured and subtracted; the best of 7 short runs
/// after a warm-up (the machines are shared: contention only ever adds time). Returns µs per call.
async fn time_us(ctx: &Context, out: &wgpu::Buffer, reps: u32, record: &dyn Fn(&mut Recorder)) -> f64 {
    let run = |n: u32| {
        let mut rec = Recorder::new(ctx, "bench");
        for _ in 0..n {
            record(&mut rec);
        }
        rec.submit();
    };
    run(1);
    ctx.read_f32(out, 0, 1).await.unwrap();
    let (mut readback, mut best) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        let start = now_ms();
        ctx.read_f32(out, 0, 1).await.unwrap();
        readback = readback.min(now_ms() - start);
        let start = now_ms();
        run(reps);
        ctx.read_f32(out, 0, 1).await.unwrap();
        best = best.min(now_ms() - start);
    }
    (best - readback).max(0.0) * 1e3 / reps as f64
}

/// One layer's batched decode attention for SmolLM2's shapes (9 q / 3 kv heads, head_dim 64,
/// blocks of 16), against the same rows run as one single-sequence `Attention` decode per sequence.
/// Natively: `XDG_RUNTIME_DIR=/tmp cargo test --test kernels_attention_batch --
/// --ignored --nocapture`; in the browser: `wasm-pack test --headless --chrome -- --test
/// kernels_attention_batch -- --include-ignored`.
async fn bench_body() {
    let ctx = gpu().await;
    report(&format!("adapter: {}", ctx.adapter_name()));
    let max_len = 4096;
    let pool = Pool::new(&ctx, spec((9, 3, 64), 16, max_len, 16, 16, 0), 3, 1.0);
    let batch = Batch::new(&ctx, &pool, 3, 1.0);
    let s = pool.shape;
    let wg = BatchPlan::auto(&ctx, &s).workgroup_size;
    let plan = |chunk, single_pass_max_keys| Some(BatchPlan { chunk, workgroup_size: wg, one_dispatch_max_keys: single_pass_max_keys, subgroups: false });
    let mut batched: Vec<(&str, AttentionBatch)> =
        [("auto", None), ("split 64", plan(64, 256)), ("split 256", plan(256, 256)), ("one pass", plan(128, max_len))]
            .into_iter()
            .map(|(name, plan)| (name, batch.attention(&ctx, &pool, plan)))
            .collect();
    // One single-sequence attention per row, as a step without batching would record them:
    // (attention, its positions buffer).
    let qkv_row = s.qkv_row() as usize;
    let mut singles: Vec<(Attention, wgpu::Buffer)> = (0..pool.max_rows as usize)
        .map(|r| {
            let qkv = ctx.storage_init("qkv1", bytemuck::cast_slice(&batch.qkv[r * qkv_row..][..qkv_row]));
            let positions = ctx.storage_zeroed("pos1", 4);
            let step = ctx.uniform_init("step1", bytemuck::bytes_of(&pool.seqs[r]));
            let out = ctx.storage_zeroed("out1", s.out_row() * 4);
            let buffers = AttentionBuffers { qkv: &qkv, pool: pool.buffers(), positions: &positions, step: &step, out: &out };
            let attention = Attention::new(&ctx, &buffers, s, 1, None).unwrap();
            (attention, positions)
        })
        .collect();
    let cases: Vec<(String, Vec<u32>)> = [1usize, 2, 4, 8, 16]
        .iter()
        .map(|&n| (format!("{n:2} rows x 512 keys"), vec![512; n]))
        .chain([
            ("16 rows x 100 keys".to_string(), vec![100; 16]),
            ("1 row x 4000 keys".to_string(), vec![4000]),
            ("1 x 4000 + 15 x 100 keys".to_string(), [4000].into_iter().chain([100; 15]).collect()),
        ])
        .collect();
    for (name, lens) in &cases {
        let rows: Vec<BatchRow> = lens.iter().enumerate().map(|(r, &kv)| row(pool.seqs[r], kv)).collect();
        let mut batched_us = Vec::new();
        for (plan_name, attention) in batched.iter_mut() {
            // Every plan here shares the batch buffer; the step is encoded for its chunk.
            let step = attention.step(&rows).unwrap();
            ctx.queue.write_buffer(&batch.batch_buf, 0, step.bytes());
            attention.set_step(&step).unwrap();
            let us = time_us(&ctx, &batch.out_buf, 20, &|rec| rec.dispatch_all(attention.kernels())).await;
            batched_us.push(format!("{plan_name} {us:7.1}"));
        }
        for ((attention, positions), &kv) in singles.iter_mut().zip(lens) {
            ctx.queue.write_buffer(positions, 0, bytemuck::bytes_of(&(kv - 1)));
            attention.set_kv_len(kv).unwrap();
        }
        let used = &singles[..lens.len()];
        let us_single = time_us(&ctx, &batch.out_buf, 20, &|rec| {
            for (attention, _) in used {
                rec.dispatch_all(attention.kernels());
            }
        })
        .await;
        report(&format!("{name:26} batched (µs): {}   {:2} x Attention {us_single:8.1} µs", batched_us.join(", "), lens.len()));
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
#[ignore = "benchmark"]
fn bench_attention_batch() {
    pollster::block_on(bench_body());
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen_test::wasm_bindgen_test]
#[ignore = "benchmark"]
async fn bench_attention_batch() {
    bench_body().await;
}
