//! The forward pass over a batch of rows from several sequences (continuous batching): every
//! row is a token at a position of its own sequence. Matmuls, norms, RoPE and the MLP run over
//! all rows at once (the weights are read once per step, whatever the batch); the KV write puts
//! each row's K/V through its own sequence's block table; attention is the batched kernel
//! ([`AttentionBatch`]), where each row reads its own sequence's keys (`kv_len = position + 1`).
//!
//! A graph is built for a capacity of `max_rows` rows and `max_logits` logit rows; a step may use
//! fewer (the rest are padding: position `u32::MAX`, which the KV write skips, and `kv_len` 0,
//! which attention skips). The logit rows are gathered from any rows of the step by copies.

use crate::gpu::ops::attention::{AttentionBatch, BatchBuffers, BatchPlan, BatchRow, BatchStep};
use crate::gpu::ops::kv_write::KvWriteBuffers;
use crate::gpu::ops::pool::{PoolBuffers, PoolShape};
use crate::gpu::ops::rope::RopeShape;
use crate::gpu::ops::{act, argmax, elementwise, embed, kv_write, matmul, norm, rope};
use crate::gpu::{Context, Kernel, Recorder};
use crate::kv::KvCache;

use super::{Logits, ModelConfig, ModelError, Weights};

enum Node {
    Kernel(Kernel),
    Kernels(Vec<Kernel>),
    Attention(usize),
}

/// One row of a batched step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    pub token: u32,
    /// Absolute position in its sequence.
    pub position: u32,
    /// The sequence's row in the block-table buffer ([`KvCache::table_base`]).
    pub table_base: u32,
}

pub struct BatchGraph {
    pub max_rows: u32,
    pub max_logits: u32,
    vocab: u32,
    hidden: u32,
    ids: wgpu::Buffer,
    positions: wgpu::Buffer,
    /// [max_rows] u32: each row's table base, read by the KV write.
    row_tables: wgpu::Buffer,
    /// The attention's batch buffer (rows' table bases, kv_len, split offsets).
    batch: wgpu::Buffer,
    x: wgpu::Buffer,
    x_last: wgpu::Buffer,
    argmax_out: wgpu::Buffer,
    logits: wgpu::Buffer,
    staging: wgpu::Buffer,
    nodes: Vec<Node>,
    head: Vec<Node>,
    attention: Vec<AttentionBatch>,
}

impl BatchGraph {
    pub fn build(ctx: &Context, cfg: &ModelConfig, weights: &Weights, kv: &KvCache, max_rows: u32, max_logits: u32) -> Result<BatchGraph, ModelError> {
        if max_rows == 0 || max_logits == 0 || max_logits > max_rows {
            return Err(ModelError::Format(format!("a batch of {max_rows} rows cannot give {max_logits} logit rows")));
        }
        let n = max_rows as u64;
        let f = 4u64;
        let hidden = cfg.hidden;
        let ids = ctx.storage_zeroed("batch.ids", n * 4);
        let positions = ctx.storage_zeroed("batch.positions", n * 4);
        let row_tables = ctx.storage_zeroed("batch.row_tables", n * 4);
        let x = ctx.storage_zeroed("batch.x", n * hidden as u64 * f);
        let h = ctx.storage_zeroed("batch.h", n * hidden as u64 * f);
        let qkv = ctx.storage_zeroed("batch.qkv", n * cfg.qkv_width() as u64 * f);
        let attn = ctx.storage_zeroed("batch.attn", n * cfg.q_width() as u64 * f);
        let gu = ctx.storage_zeroed("batch.gate_up", n * 2 * cfg.ffn as u64 * f);
        let act_buf = ctx.storage_zeroed("batch.act", n * cfg.ffn as u64 * f);
        let rows = max_logits as u64;
        let x_last = ctx.storage_zeroed("batch.x_last", rows * hidden as u64 * f);
        let h_last = ctx.storage_zeroed("batch.h_last", rows * hidden as u64 * f);
        let logits = ctx.storage_zeroed("batch.logits", rows * cfg.vocab as u64 * f);
        let argmax_out = ctx.storage_zeroed("batch.argmax", rows * 4);
        let pool = PoolShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            max_len: kv.max_seq_len,
            block_size: kv.pool.block_size,
            n_blocks: kv.pool.n_blocks,
            dtype: kv.pool.dtype,
        };
        let batch = ctx.storage_zeroed("batch.rows", BatchStep::buffer_bytes(max_rows));
        let mut nodes = Vec::new();
        let mut attention = Vec::new();
        // Every layer shares one split scratch: layers run one after the other.
        let plan = BatchPlan::auto(ctx);
        let scratch =
            Some(ctx.storage_zeroed("batch.attention_scratch", AttentionBatch::scratch_bytes(&pool, max_rows, &plan)));
        nodes.push(Node::Kernel(embed::embedding(ctx, &weights.token_embd, &ids, &x, max_rows)?));
        for (l, lw) in weights.layers.iter().enumerate() {
            nodes.push(Node::Kernel(norm::rms_norm(ctx, &x, &lw.attn_norm, &h, max_rows, hidden, cfg.rms_eps)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.wqkv, &h, &qkv, max_rows)?));
            let rope_shape = RopeShape::fused_qkv(&pool, max_rows, cfg.rope_base);
            nodes.push(Node::Kernel(rope::rope(ctx, &qkv, &positions, &rope_shape)?));
            let pool_buffers = PoolBuffers { k: &kv.pool.k[l], v: &kv.pool.v[l], block_table: &kv.table_buffer };
            let kv_buffers = KvWriteBuffers { qkv: &qkv, pool: pool_buffers, positions: &positions, row_tables: &row_tables };
            nodes.push(Node::Kernel(kv_write::write_paged(ctx, &kv_buffers, &pool, max_rows)?));
            let buffers =
                BatchBuffers { qkv: &qkv, pool: pool_buffers, batch: &batch, out: &attn, scratch: scratch.as_ref() };
            attention.push(AttentionBatch::new(ctx, &buffers, pool, max_rows, Some(plan))?);
            nodes.push(Node::Attention(attention.len() - 1));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.wo, &attn, &h, max_rows)?));
            nodes.push(Node::Kernel(elementwise::add(ctx, &x, &h, max_rows * hidden)?));
            nodes.push(Node::Kernel(norm::rms_norm(ctx, &x, &lw.ffn_norm, &h, max_rows, hidden, cfg.rms_eps)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.w_gate_up, &h, &gu, max_rows)?));
            nodes.push(Node::Kernel(act::silu_mul(ctx, &gu, &act_buf, max_rows, cfg.ffn)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.w_down, &act_buf, &h, max_rows)?));
            nodes.push(Node::Kernel(elementwise::add(ctx, &x, &h, max_rows * hidden)?));
        }
        let head = vec![
            Node::Kernel(norm::rms_norm(ctx, &x_last, &weights.output_norm, &h_last, max_logits, hidden, cfg.rms_eps)?),
            Node::Kernels(matmul::matmul(ctx, weights.lm_head(), &h_last, &logits, max_logits)?),
            Node::Kernels(argmax::argmax(ctx, &logits, &argmax_out, max_logits, cfg.vocab)?),
        ];
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch.staging"),
            size: rows * 4 + rows * cfg.vocab as u64 * f,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(BatchGraph {
            max_rows,
            max_logits,
            vocab: cfg.vocab,
            hidden,
            ids,
            positions,
            row_tables,
            batch,
            x,
            x_last,
            argmax_out,
            logits,
            staging,
            nodes,
            head,
            attention,
        })
    }

    /// Runs one step over `rows` (at most `max_rows`) and returns, for each index in
    /// `logit_rows` (at most `max_logits`, each < rows.len()), the argmax and, with
    /// [`Logits::Full`], the logits (row-major `[logit_rows.len(), vocab]`).
    pub async fn run(&mut self, ctx: &Context, rows: &[StepRow], logit_rows: &[u32], read: Logits) -> Result<(Vec<u32>, Option<Vec<f32>>), ModelError> {
        let n = rows.len();
        if n == 0 || n > self.max_rows as usize || logit_rows.is_empty() || logit_rows.len() > self.max_logits as usize {
            return Err(ModelError::Format(format!(
                "a batch graph for {} rows and {} logit rows was given {n} rows and {} logit rows",
                self.max_rows,
                self.max_logits,
                logit_rows.len()
            )));
        }
        if let Some(&r) = logit_rows.iter().find(|&&r| r as usize >= n) {
            return Err(ModelError::Format(format!("logit row {r} of a step of {n} rows")));
        }
        let pad = self.max_rows as usize - n;
        let ids: Vec<u32> = rows.iter().map(|r| r.token).chain(std::iter::repeat(0).take(pad)).collect();
        let positions: Vec<u32> = rows.iter().map(|r| r.position).chain(std::iter::repeat(u32::MAX).take(pad)).collect();
        let tables: Vec<u32> = rows.iter().map(|r| r.table_base).chain(std::iter::repeat(0).take(pad)).collect();
        let batch_rows: Vec<BatchRow> = rows.iter().map(|r| BatchRow { table_base: r.table_base, kv_len: r.position + 1 }).collect();
        let step = self.attention[0].step(&batch_rows)?;
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(&ids));
        ctx.queue.write_buffer(&self.positions, 0, bytemuck::cast_slice(&positions));
        ctx.queue.write_buffer(&self.row_tables, 0, bytemuck::cast_slice(&tables));
        ctx.queue.write_buffer(&self.batch, 0, step.bytes());
        for a in &mut self.attention {
            a.set_step(&step)?;
        }
        let mut rec = Recorder::new(ctx, "batch_step");
        let record = |rec: &mut Recorder, nodes: &[Node], attention: &[AttentionBatch]| {
            for node in nodes {
                match node {
                    Node::Kernel(k) => rec.dispatch(k),
                    Node::Kernels(ks) => ks.iter().for_each(|k| rec.dispatch(k)),
                    Node::Attention(i) => attention[*i].kernels().iter().for_each(|k| rec.dispatch(k)),
                }
            }
        };
        record(&mut rec, &self.nodes, &self.attention);
        let row_bytes = self.hidden as u64 * 4;
        for (k, &r) in logit_rows.iter().enumerate() {
            rec.copy(&self.x, r as u64 * row_bytes, &self.x_last, k as u64 * row_bytes, row_bytes);
        }
        record(&mut rec, &self.head, &self.attention);
        let m = logit_rows.len() as u64;
        rec.copy(&self.argmax_out, 0, &self.staging, 0, m * 4);
        let logit_bytes = m * self.vocab as u64 * 4;
        let full = read == Logits::Full;
        if full {
            rec.copy(&self.logits, 0, &self.staging, m * 4, logit_bytes);
        }
        rec.submit();
        let bytes = ctx.map_staging_range(&self.staging, if full { m * 4 + logit_bytes } else { m * 4 }).await?;
        let ids: Vec<u32> = bytemuck::cast_slice(&bytes[..m as usize * 4]).to_vec();
        let logits = full.then(|| bytemuck::cast_slice(&bytes[m as usize * 4..]).to_vec());
        Ok((ids, logits))
    }
}
