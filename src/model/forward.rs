//! The llama forward pass as a graph of kernels built once per step shape and recorded into one
//! submission per step.
//!
//! For each layer (pre-norm residual blocks):
//! ```text
//! h    = rms_norm(x) · attn_norm
//! qkv  = h · Wqkvᵀ                  (q, k, v heads in one row)
//! rope(q, k at absolute positions); write k, v into the cache at those positions
//! x   += attention(q, K, V) · Woᵀ
//! h    = rms_norm(x) · ffn_norm
//! x   += (silu(h · Wgateᵀ) ⊙ (h · Wupᵀ)) · Wdownᵀ
//! ```
//! then `logits = rms_norm(x_last) · output_norm · Wembᵀ` for the rows the caller wants.
//! Prefill builds the graph for a batch of prompt rows (tiled matmuls); decode for one row
//! (memory-bound matvecs). Nothing is read back between layers: a step ends with the argmax (and,
//! when asked, the logits) copied into one staging buffer.

use crate::gpu::ops::attention::{Attention, AttentionBuffers};
use crate::gpu::ops::kv_write::KvWriteBuffers;
use crate::gpu::ops::pool::{PoolBuffers, PoolShape};
use crate::gpu::ops::rope::RopeShape;
use crate::gpu::ops::{act, argmax, elementwise, embed, kv_write, matmul, norm, rope};
use crate::gpu::{Context, Kernel, Recorder};
use crate::kv::KvCache;

use super::{ModelConfig, ModelError, Weights};

enum Node {
    Kernel(Kernel),
    Kernels(Vec<Kernel>),
    /// Index into `StepGraph::attention`.
    Attention(usize),
    Copy { src: usize, src_offset: u64, dst: usize, size: u64 },
}

/// What a step reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the argmax token of each logit row.
    Argmax,
    /// The argmax and the full logits of each logit row.
    Full,
}

/// The kernels of one forward step over `n_tokens` new tokens of one sequence, producing logits
/// for the last `logit_rows` of them.
pub struct StepGraph {
    pub n_tokens: u32,
    pub logit_rows: u32,
    vocab: u32,
    /// [n_tokens] u32 token ids, written before each step.
    ids: wgpu::Buffer,
    /// [n_tokens] u32 absolute positions, written before each step.
    positions: wgpu::Buffer,
    /// Buffers the copies refer to by index: 0 = x, 1 = x_last, 2 = argmax out, 3 = logits.
    copy_buffers: Vec<wgpu::Buffer>,
    staging: wgpu::Buffer,
    nodes: Vec<Node>,
    attention: Vec<Attention>,
    /// Uniform holding the sequence's `table_base` (its row in the cache's block-table buffer),
    /// written before each step.
    step: wgpu::Buffer,
    /// [n_tokens] u32: the same `table_base` per row, for the KV write (which also serves rows of
    /// several sequences, see [`super::batch`]).
    row_tables: wgpu::Buffer,
}

const X: usize = 0;
const X_LAST: usize = 1;
const ARGMAX: usize = 2;
const LOGITS: usize = 3;

impl StepGraph {
    /// Builds the graph. `logit_rows` ≤ `n_tokens`; the logits are those of the last rows.
    pub fn build(
        ctx: &Context,
        cfg: &ModelConfig,
        weights: &Weights,
        kv: &KvCache,
        n_tokens: u32,
        logit_rows: u32,
    ) -> Result<StepGraph, ModelError> {
        if n_tokens == 0 || logit_rows == 0 || logit_rows > n_tokens {
            return Err(ModelError::Format(format!("a step of {n_tokens} tokens cannot give {logit_rows} logit rows")));
        }
        let n = n_tokens as u64;
        let f = 4u64;
        let hidden = cfg.hidden;
        let ids = ctx.storage_zeroed("ids", n * 4);
        let positions = ctx.storage_zeroed("positions", n * 4);
        let x = ctx.storage_zeroed("x", n * hidden as u64 * f);
        let h = ctx.storage_zeroed("h", n * hidden as u64 * f);
        let qkv = ctx.storage_zeroed("qkv", n * cfg.qkv_width() as u64 * f);
        let attn = ctx.storage_zeroed("attn", n * cfg.q_width() as u64 * f);
        let gu = ctx.storage_zeroed("gate_up", n * 2 * cfg.ffn as u64 * f);
        let act_buf = ctx.storage_zeroed("act", n * cfg.ffn as u64 * f);
        let rows = logit_rows as u64;
        let x_last = ctx.storage_zeroed("x_last", rows * hidden as u64 * f);
        let h_last = ctx.storage_zeroed("h_last", rows * hidden as u64 * f);
        let logits = ctx.storage_zeroed("logits", rows * cfg.vocab as u64 * f);
        let argmax_out = ctx.storage_zeroed("argmax", rows * 4);

        let block_table = &kv.table_buffer;
        let pool = PoolShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            max_len: kv.max_seq_len,
            block_size: kv.pool.block_size,
            n_blocks: kv.pool.n_blocks,
            dtype: kv.pool.dtype,
        };
        let step = ctx.uniform_init("step", bytemuck::bytes_of(&0u32));
        let row_tables = ctx.storage_zeroed("row_tables", n * 4);
        let mut nodes = Vec::new();
        let mut attention = Vec::new();
        nodes.push(Node::Kernel(embed::embedding(ctx, &weights.token_embd, &ids, &x, n_tokens)?));
        for (l, lw) in weights.layers.iter().enumerate() {
            nodes.push(Node::Kernel(norm::rms_norm(ctx, &x, &lw.attn_norm, &h, n_tokens, hidden, cfg.rms_eps)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.wqkv, &h, &qkv, n_tokens)?));
            let rope_shape = RopeShape::fused_qkv(&pool, n_tokens, cfg.rope_base);
            nodes.push(Node::Kernel(rope::rope(ctx, &qkv, &positions, &rope_shape)?));
            // The pool's dtype picks the kernels' variant: INT8 quantizes here and is
            // dequantized inside attention.
            let pool_buffers = PoolBuffers { k: &kv.pool.k[l], v: &kv.pool.v[l], block_table };
            let kv_buffers = KvWriteBuffers { qkv: &qkv, pool: pool_buffers, positions: &positions, row_tables: &row_tables };
            nodes.push(Node::Kernel(kv_write::write_paged(ctx, &kv_buffers, &pool, n_tokens)?));
            let buffers =
                AttentionBuffers { qkv: &qkv, pool: pool_buffers, positions: &positions, step: &step, out: &attn };
            attention.push(Attention::new(ctx, &buffers, pool, n_tokens, None)?);
            nodes.push(Node::Attention(attention.len() - 1));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.wo, &attn, &h, n_tokens)?));
            nodes.push(Node::Kernel(elementwise::add(ctx, &x, &h, n_tokens * hidden)?));
            nodes.push(Node::Kernel(norm::rms_norm(ctx, &x, &lw.ffn_norm, &h, n_tokens, hidden, cfg.rms_eps)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.w_gate_up, &h, &gu, n_tokens)?));
            nodes.push(Node::Kernel(act::silu_mul(ctx, &gu, &act_buf, n_tokens, cfg.ffn)?));
            nodes.push(Node::Kernels(matmul::matmul(ctx, &lw.w_down, &act_buf, &h, n_tokens)?));
            nodes.push(Node::Kernel(elementwise::add(ctx, &x, &h, n_tokens * hidden)?));
        }
        let row_bytes = hidden as u64 * f;
        nodes.push(Node::Copy { src: X, src_offset: (n - rows) * row_bytes, dst: X_LAST, size: rows * row_bytes });
        nodes.push(Node::Kernel(norm::rms_norm(ctx, &x_last, &weights.output_norm, &h_last, logit_rows, hidden, cfg.rms_eps)?));
        nodes.push(Node::Kernels(matmul::matmul(ctx, weights.lm_head(), &h_last, &logits, logit_rows)?));
        nodes.push(Node::Kernels(argmax::argmax(ctx, &logits, &argmax_out, logit_rows, cfg.vocab)?));

        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step.staging"),
            size: rows * 4 + rows * cfg.vocab as u64 * f,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(StepGraph {
            n_tokens,
            logit_rows,
            vocab: cfg.vocab,
            ids,
            positions,
            copy_buffers: vec![x, x_last, argmax_out, logits],
            staging,
            nodes,
            attention,
            step,
            row_tables,
        })
    }

    /// Runs one step: `tokens` at absolute positions `start..start + n_tokens`. Returns the argmax
    /// of each logit row and, with [`Logits::Full`], the logits (row-major `[logit_rows, vocab]`).
    pub async fn run(
        &mut self,
        ctx: &Context,
        tokens: &[u32],
        start: u32,
        table_base: u32,
        read: Logits,
    ) -> Result<(Vec<u32>, Option<Vec<f32>>), ModelError> {
        if tokens.len() != self.n_tokens as usize {
            return Err(ModelError::Format(format!("a graph for {} tokens was given {}", self.n_tokens, tokens.len())));
        }
        let positions: Vec<u32> = (start..start + self.n_tokens).collect();
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        ctx.queue.write_buffer(&self.positions, 0, bytemuck::cast_slice(&positions));
        ctx.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&table_base));
        ctx.queue.write_buffer(&self.row_tables, 0, bytemuck::cast_slice(&vec![table_base; self.n_tokens as usize]));
        let kv_len = start + self.n_tokens;
        for a in &mut self.attention {
            a.set_kv_len(kv_len)?;
        }
        let mut rec = Recorder::new(ctx, "step");
        for node in &self.nodes {
            match node {
                Node::Kernel(k) => rec.dispatch(k),
                Node::Kernels(ks) => ks.iter().for_each(|k| rec.dispatch(k)),
                Node::Attention(i) => self.attention[*i].kernels().iter().for_each(|k| rec.dispatch(k)),
                Node::Copy { src, src_offset, dst, size } => {
                    rec.copy(&self.copy_buffers[*src], *src_offset, &self.copy_buffers[*dst], 0, *size)
                }
            }
        }
        let rows = self.logit_rows as u64;
        rec.copy(&self.copy_buffers[ARGMAX], 0, &self.staging, 0, rows * 4);
        let logit_bytes = rows * self.vocab as u64 * 4;
        if read == Logits::Full {
            rec.copy(&self.copy_buffers[LOGITS], 0, &self.staging, rows * 4, logit_bytes);
        }
        rec.submit();
        let bytes = ctx.map_staging_range(&self.staging, if read == Logits::Full { rows * 4 + logit_bytes } else { rows * 4 }).await?;
        let ids: Vec<u32> = bytemuck::cast_slice(&bytes[..rows as usize * 4]).to_vec();
        let logits = (read == Logits::Full).then(|| bytemuck::cast_slice(&bytes[rows as usize * 4..]).to_vec());
        Ok((ids, logits))
    }

    /// Runs one step submitting every node on its own and waiting for it, and returns the GPU
    /// time spent per kernel name (milliseconds, summed over layers). For finding where a step's
    /// time goes; the results of the step are discarded.
    pub async fn profile(&mut self, ctx: &Context, tokens: &[u32], start: u32, table_base: u32) -> Result<Vec<(String, f64)>, ModelError> {
        let positions: Vec<u32> = (start..start + self.n_tokens).collect();
        ctx.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&table_base));
        ctx.queue.write_buffer(&self.row_tables, 0, bytemuck::cast_slice(&vec![table_base; self.n_tokens as usize]));
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(tokens));
        ctx.queue.write_buffer(&self.positions, 0, bytemuck::cast_slice(&positions));
        for a in &mut self.attention {
            a.set_kv_len(start + self.n_tokens)?;
        }
        let mut totals: Vec<(String, f64)> = Vec::new();
        let mut add = |name: &str, ms: f64| match totals.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 += ms,
            None => totals.push((name.to_string(), ms)),
        };
        for node in &self.nodes {
            let kernels: Vec<&Kernel> = match node {
                Node::Kernel(k) => vec![k],
                Node::Kernels(ks) => ks.iter().collect(),
                Node::Attention(i) => self.attention[*i].kernels().iter().collect(),
                Node::Copy { .. } => continue,
            };
            for k in kernels {
                let t0 = crate::time::now_ms();
                let mut rec = Recorder::new(ctx, "profile");
                rec.dispatch(k);
                rec.submit();
                ctx.read_bytes(&self.copy_buffers[ARGMAX], 0, 4).await?;
                add(k.name, crate::time::now_ms() - t0);
            }
        }
        Ok(totals)
    }

    /// Number of dispatches one step records (with the current kv length).
    pub fn dispatch_count(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match n {
                Node::Kernel(_) => 1,
                Node::Kernels(k) => k.len(),
                Node::Attention(i) => self.attention[*i].kernels().len(),
                Node::Copy { .. } => 0,
            })
            .sum()
    }
}
