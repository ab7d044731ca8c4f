//! The forward pass as a graph of kernels, built once per step shape and recorded into one
//! submission per step, whether the step holds one sequence's rows or a batch of sequences.
//! The model's layer plan ([`crate::model::Plan`]: llama's, Gemma 3's) chooses the nodes
//! (`plan.rs`); one graph serves every architecture.
//!
//! `x = embed(ids) · embedding_scale`, then each layer's ops (for llama and Gemma 3: pre-norm
//! residual blocks; the bracketed ops only where the plan has them):
//! ```text
//! h    = rms_norm(x) · attn_norm
//! qkv  = h · Wqkvᵀ                  (q, k, v heads in one row)
//! [q, k = rms_norm per head · q_norm, k_norm]
//! rope(q, k at absolute positions, the layer's base and pairing); write k, v into the cache
//! a    = attention(q, K, V over the layer's window) · Woᵀ
//! x   += a                          [x += rms_norm(a) · post_attention_norm]
//! h    = rms_norm(x) · ffn_norm
//! f    = (act(h · Wgateᵀ) ⊙ (h · Wupᵀ)) · Wdownᵀ     (act: silu or gelu_tanh)
//! x   += f                          [x += rms_norm(f) · post_ffw_norm]
//! ```
//! then `logits = rms_norm(x_row) · output_norm · Wembᵀ` for the rows the caller wants. Nothing is
//! read back between layers: a step ends with the argmax (and, when asked, the logits) copied
//! into one staging buffer.
//!
//! Consecutive ops are fused where the arithmetic allows it unchanged (`plan.rs` says
//! which). A llama layer is 6 dispatches (qkv, qkv_heads, attention (+ its reduce on long
//! contexts), wo, gate/up, down), and 5 in a decode step whose attention can rope and write the
//! heads itself (where one workgroup owns each KV head of a row and each sequence has one row:
//! `Attention::appending_heads`, `AttentionBatch::appending_heads`; not with head norms).
//! The head keeps its norm as a dispatch: it runs once per step over few rows, while in the
//! prologue of the vocabulary-wide matmul every invocation would load the norm weight again.
//! With int8 activations (`MatmulConfig::int8_activations`, opt-in) the norms before the qkv,
//! gate/up and output matmuls write their rows as int8 blocks in the same pass (and as f32
//! where a part of the matrix has no int8 body; these norms stay dispatches of their own), and
//! the attention output and the FFN activation are quantized by a dispatch of their own before
//! the matmuls that read them.
//!
//! Every row is a token at an absolute position of a sequence, found through that sequence's
//! row of the block-table buffer. Matmuls, norms, RoPE and the MLP run over all rows at once
//! (the weights are read once per step, whatever the batch) and the KV write puts each row's K/V
//! through its own table. Only attention depends on what the rows are ([`AttentionKind`]):
//! - [`AttentionKind::Sequence`]: the rows are consecutive positions of ONE sequence (a prefill
//!   chunk, or one decode token). Attention shares each key load among 4 rows and splits long
//!   contexts (split-K). The graph is built for exactly `max_rows` rows.
//! - [`AttentionKind::Batch`]: each row may belong to another sequence (continuous batching).
//!   Each row reads its own sequence's keys (`kv_len = position + 1`). A step may use fewer rows
//!   than the graph holds; the rest are padding (position `u32::MAX`, which the KV write skips,
//!   and `kv_len` 0, which attention skips).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{Choice, StepRows};
use crate::error::EngineError;
use crate::gpu::ops::attention::BatchRow;
use crate::gpu::ops::matmul::{Epilogue, Input, MatmulConfig};
use crate::gpu::ops::norm::NormOut;
use crate::gpu::ops::sample::{self, SampleBuffers};
use crate::gpu::ops::{argmax, elementwise, embed, matmul, norm};
use crate::gpu::{Context, Kernel, Recorder};
use crate::kv::KvCache;
use crate::model::{Choose, Logits, ModelConfig, ModelError, Op, Proj, RowOutput, StepRow};
use crate::sampler::{RowParams, SampleShape};

use super::plan::{Activations, AttentionBuilder, AttentionKind, AttentionNode, LayerAttention, Layers, Node, NodeKernels};
use super::Weights;

/// The tokens steps hand to each other on the GPU: `[n_slots] u32`, entry `slot` the token
/// the last step with a logit row of that sequence produced (its argmax). A step copies the
/// entries of its [`StepRow::FED`] rows into its inputs before it runs and its logit rows'
/// tokens into the entries after; copies, not kernels, ordered with the steps on the queue.
///
/// `history` holds the sampler's penalty windows, a ring of `history_capacity` tokens per slot
/// ([`crate::gpu::ops::sample`]): a sampled step reads its rows' rings and appends their tokens.
pub struct Feed<'a> {
    pub tokens: &'a wgpu::Buffer,
    pub history: &'a wgpu::Buffer,
    pub history_capacity: u32,
}

/// A submitted step whose outputs are still on their way back ([`ForwardGraph::submit`]);
/// [`PendingStep::read`] waits for them. Dropped unread, its staging buffer is simply not reused.
pub struct PendingStep {
    mapping: crate::gpu::Mapping,
    staging: wgpu::Buffer,
    free: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// Logit rows read, and whether the caller asked for none (the step's end only).
    rows: usize,
    none_asked: bool,
    full: bool,
    vocab: usize,
}

impl PendingStep {
    /// Waits for the step and returns, for each logit row, its argmax and (with
    /// [`Logits::Full`]) its logits.
    pub async fn read(self, ctx: &Context) -> Result<Vec<RowOutput>, EngineError> {
        let bytes = self.mapping.bytes(ctx).await?;
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.staging);
        if self.none_asked {
            return Ok(Vec::new());
        }
        let m = self.rows;
        let ids: &[u32] = bytemuck::cast_slice(&bytes[..m * 4]);
        let vocab = self.vocab;
        let logits: Option<&[f32]> = self.full.then(|| bytemuck::cast_slice(&bytes[m * 4..]));
        Ok(ids.iter().enumerate().map(|(k, &id)| (id, logits.map(|l| l[k * vocab..(k + 1) * vocab].to_vec()))).collect())
    }
}

/// The kernels of one forward step over up to `max_rows` rows, giving logits for up to
/// `max_logits` of them.
pub struct ForwardGraph {
    pub kind: AttentionKind,
    pub max_rows: u32,
    pub max_logits: u32,
    vocab: u32,
    hidden: u32,
    /// [max_rows] u32 token ids, written before each step.
    ids: wgpu::Buffer,
    /// [max_rows] u32 absolute positions, written before each step.
    positions: wgpu::Buffer,
    /// [max_rows] u32: each row's table base, read by the KV write.
    row_tables: wgpu::Buffer,
    /// What attention reads of the step, written before each step. Sequence: a uniform holding
    /// the sequence's table base; Batch: the batch buffer ([`AttentionBatch::step`]).
    step: wgpu::Buffer,
    x: wgpu::Buffer,
    /// [max_logits, hidden]: the logit rows gathered from `x`.
    x_last: wgpu::Buffer,
    argmax_out: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// Staging buffers not in use by a [`PendingStep`]: as many as steps were ever in flight at
    /// once, then reused (no buffer is created per step in steady state).
    staging: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// Bytes of one staging buffer: the argmaxes and the logits of every logit row.
    staging_bytes: u64,
    /// The sampling head ([`Choose::Sample`]), built at the first sampled step: its kernels,
    /// the [max_logits] RowParams they read and the [max_logits, ceil(vocab / 32)] masks, both
    /// written per step (masks only for masked rows).
    sampler: Option<(Vec<Kernel>, wgpu::Buffer, wgpu::Buffer)>,
    argmax: Vec<Kernel>,
    layers: Vec<Node>,
    head: Vec<Node>,
    attention: Vec<AttentionNode>,
    /// Device bytes of the buffers this graph created at build and for its sampler since, less
    /// its staging buffers ([`ForwardGraph::bytes`]).
    bytes: Arc<AtomicU64>,
    /// Staging buffers created so far (each of `staging_bytes`).
    staging_made: Arc<AtomicU64>,
}

/// Steps of one graph in flight at once at most (the engine reads a step while the next one
/// runs): the staging buffers a graph's budget leaves room for ([`ForwardGraph::budget_bytes`]).
pub const STEPS_IN_FLIGHT: u64 = 2;

impl ForwardGraph {
    /// Builds the graph for `kind`, `max_rows` rows and `max_logits` ≤ `max_rows` logit rows.
    pub fn build(
        ctx: &Context,
        model: (&ModelConfig, &Weights),
        kv: &KvCache,
        kind: AttentionKind,
        max_rows: u32,
        max_logits: u32,
    ) -> Result<ForwardGraph, EngineError> {
        let (graph, bytes) = Context::tally(|| Self::build_uncounted(ctx, model, kv, kind, max_rows, max_logits));
        let graph = graph?;
        graph.bytes.store(bytes, Ordering::Relaxed);
        Ok(graph)
    }

    /// Device bytes this graph holds: its activations, scratch, sampler and staging buffers.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed) + self.staging_made.load(Ordering::Relaxed) * self.staging_bytes
    }

    /// What this graph may come to hold: [`ForwardGraph::bytes`] with a staging buffer for each
    /// of [`STEPS_IN_FLIGHT`] steps (they are made as steps go in flight, so a memory budget
    /// counts them from the start).
    pub fn budget_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed) + self.staging_made.load(Ordering::Relaxed).max(STEPS_IN_FLIGHT) * self.staging_bytes
    }

    fn build_uncounted(
        ctx: &Context,
        (cfg, weights): (&ModelConfig, &Weights),
        kv: &KvCache,
        kind: AttentionKind,
        max_rows: u32,
        max_logits: u32,
    ) -> Result<ForwardGraph, EngineError> {
        if max_rows == 0 || max_logits == 0 || max_logits > max_rows {
            return Err(ModelError::Format(format!("a step of {max_rows} rows cannot give {max_logits} logit rows")).into());
        }
        let (n, rows, f) = (max_rows as u64, max_logits as u64, 4u64);
        let ids = ctx.storage_zeroed("graph.ids", n * 4);
        let positions = ctx.storage_zeroed("graph.positions", n * 4);
        let row_tables = ctx.storage_zeroed("graph.row_tables", n * 4);
        let plan = cfg.plan();
        let gated = weights.layers.iter().all(|l| l.matrix(Proj::GateUp).is_ok_and(|m| m.gated));
        let post = plan.layers.iter().flatten().any(|op| matches!(op, Op::Residual { post_norm: Some(_) }));
        let a = Activations::new(ctx, cfg, max_rows, (gated, post));
        let x_last = ctx.storage_zeroed("graph.x_last", rows * cfg.hidden as u64 * f);
        let h_last = ctx.storage_zeroed("graph.h_last", rows * cfg.hidden as u64 * f);
        // The head's norm quantizes for the output matmul as a layer's norm does for its matmuls.
        let head = MatmulConfig::for_device(ctx, max_logits);
        let lm_head = weights.lm_head();
        let h_last_q = ctx.storage_zeroed("graph.h_last_q", if lm_head.reads_int8(&head) { matmul::int8_bytes(max_logits, cfg.hidden) } else { 48 });
        let head_out = NormOut { f32: lm_head.needs_f32(&head).then_some(&h_last), int8: lm_head.reads_int8(&head).then_some(&h_last_q) };
        let head_in = match head_out {
            NormOut { int8: Some(q), f32 } => Input::Int8 { q, f32 },
            _ => Input::F32(&h_last),
        };
        let logits = ctx.storage_zeroed("graph.logits", rows * cfg.vocab as u64 * f);
        let argmax_out = ctx.storage_zeroed("graph.argmax", rows * 4);
        let attention = AttentionBuilder::new(ctx, cfg, kv, kind, max_rows);
        let step = attention.step_buffer(ctx, max_rows);
        let mut graph = ForwardGraph {
            kind,
            max_rows,
            max_logits,
            vocab: cfg.vocab,
            hidden: cfg.hidden,
            staging: Arc::new(Mutex::new(Vec::new())),
            staging_bytes: rows * 4 + rows * cfg.vocab as u64 * f,
            layers: vec![Node::Kernels(embed::embedding(ctx, &weights.token_embd, (&ids, &a.x), max_rows, plan.embedding_scale)?)],
            head: vec![
                Node::Kernel(norm::rms_norm_to(ctx, &x_last, &weights.output_norm, head_out, max_logits, cfg.hidden, plan.rms_eps)?),
                Node::Kernels(matmul::matmul_input(ctx, lm_head, (head_in, &logits), max_logits, head, Epilogue::Store)?),
            ],
            argmax: argmax::argmax(ctx, &logits, &argmax_out, max_logits, cfg.vocab)?,
            sampler: None,
            attention: Vec::new(),
            bytes: Arc::new(AtomicU64::new(0)),
            staging_made: Arc::new(AtomicU64::new(0)),
            ids,
            positions,
            row_tables,
            step,
            x: a.x.clone(),
            x_last,
            argmax_out,
            logits,
        };
        let layers = Layers {
            ctx,
            cfg,
            weights,
            kv,
            a: &a,
            attention: &attention,
            positions: &graph.positions,
            row_tables: &graph.row_tables,
            step: &graph.step,
            n: max_rows,
        };
        let softcap = plan.final_softcap.map(|cap| elementwise::softcap(ctx, &graph.logits, max_logits * cfg.vocab, cap)).transpose()?;
        graph.head.extend(softcap.map(Node::Kernel));
        let built = layers.build(&plan)?;
        graph.layers.extend(built.nodes);
        graph.attention = built.attention;
        Ok(graph)
    }

    /// Checks `rows` and `logit_rows` against the graph's contract: 1..=max_rows rows (exactly
    /// max_rows, all of one sequence at consecutive positions, for [`AttentionKind::Sequence`]),
    /// at most max_logits logit rows, each an index into `rows`.
    fn check(&self, rows: &[StepRow], logit_rows: &[u32], feed: Option<&Feed<'_>>) -> Result<(), EngineError> {
        let n = rows.len();
        let slots = feed.map_or(0, |f| f.tokens.size() / 4);
        if let Some(r) = rows.iter().find(|r| (r.token == StepRow::FED || feed.is_some()) && r.slot as u64 >= slots) {
            return Err(ModelError::Format(format!("row of slot {} (token {}) needs a feed of more than {slots} entries", r.slot, r.token)).into());
        }
        let bad = |what: String| {
            Err(ModelError::Format(format!("a {:?} graph of {} rows and {} logit rows {what}", self.kind, self.max_rows, self.max_logits)).into())
        };
        if n == 0 || n > self.max_rows as usize || logit_rows.len() > self.max_logits as usize {
            return bad(format!("was given {n} rows and {} logit rows", logit_rows.len()));
        }
        if let Some(&r) = logit_rows.iter().find(|&&r| r as usize >= n) {
            return bad(format!("was given logit row {r} of a step of {n} rows"));
        }
        if self.kind == AttentionKind::Sequence {
            let one_sequence = rows.iter().enumerate().all(|(i, r)| r.table_base == rows[0].table_base && r.position == rows[0].position + i as u32);
            if n != self.max_rows as usize || !one_sequence {
                return bad(format!("was given {n} rows that are not all consecutive positions of one sequence"));
            }
        }
        Ok(())
    }

    /// Writes a step's inputs and sizes the attention dispatches for it (`rows` checked).
    fn prepare(&mut self, ctx: &Context, rows: &[StepRow]) -> Result<(), EngineError> {
        let pad = self.max_rows as usize - rows.len();
        let column = |f: fn(&StepRow) -> u32, fill: u32| -> Vec<u32> { rows.iter().map(f).chain(std::iter::repeat_n(fill, pad)).collect() };
        ctx.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(&column(|r| r.token, 0)));
        ctx.queue.write_buffer(&self.positions, 0, bytemuck::cast_slice(&column(|r| r.position, u32::MAX)));
        ctx.queue.write_buffer(&self.row_tables, 0, bytemuck::cast_slice(&column(|r| r.table_base, 0)));
        match self.kind {
            AttentionKind::Sequence => {
                ctx.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&rows[0].table_base));
                let kv_len = rows[rows.len() - 1].position + 1;
                for a in &mut self.attention {
                    if let LayerAttention::Sequence(a) = &mut a.attention {
                        a.set_kv_len(kv_len)?;
                    }
                }
            }
            AttentionKind::Batch => {
                let batch_rows: Vec<BatchRow> = rows.iter().map(|r| BatchRow { table_base: r.table_base, kv_len: r.position + 1 }).collect();
                let mut step = None;
                for a in &mut self.attention {
                    if let LayerAttention::Batch(a) = &mut a.attention {
                        let s = match step.take() {
                            Some(s) => s,
                            None => a.step(&batch_rows)?,
                        };
                        a.set_step(&s)?;
                        step = Some(s);
                    }
                }
                if let Some(s) = step {
                    ctx.queue.write_buffer(&self.step, 0, s.bytes());
                }
            }
        }
        Ok(())
    }

    /// Builds the sampling head over `feed`'s rings at its first use.
    fn build_sampler(&mut self, ctx: &Context, feed: &Feed<'_>) -> Result<(), EngineError> {
        if self.sampler.is_none() {
            let (sampler, bytes) = Context::tally(|| self.sampler_kernels(ctx, feed));
            self.sampler = Some(sampler?);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The sampling head's kernels, the [max_logits] RowParams and the masks they read.
    fn sampler_kernels(&self, ctx: &Context, feed: &Feed<'_>) -> Result<(Vec<Kernel>, wgpu::Buffer, wgpu::Buffer), EngineError> {
        let params = ctx.storage_zeroed("graph.sample_params", self.max_logits as u64 * std::mem::size_of::<RowParams>() as u64);
        let n_rings = (feed.tokens.size() / 4) as u32;
        let shape = SampleShape { n_rows: self.max_logits, vocab: self.vocab, history_capacity: feed.history_capacity, n_rings, out_offset: 0, out_stride: 1 };
        let mask = ctx.storage_zeroed("graph.sample_mask", self.max_logits as u64 * self.vocab.div_ceil(32) as u64 * 4);
        let buffers = SampleBuffers { logits: &self.logits, params: &params, history: feed.history, out: &self.argmax_out, mask: &mask };
        Ok((sample::sample(ctx, buffers, shape)?, params, mask))
    }

    fn record(&self, rec: &mut Recorder, nodes: &[Node]) {
        for node in nodes {
            match node {
                Node::Kernel(k) => rec.dispatch(k),
                Node::Kernels(ks) => ks.iter().for_each(|k| rec.dispatch(k)),
                Node::Attention(i) => self.attention[*i].kernels().for_each(|k| rec.dispatch(k)),
            }
        }
    }

    /// Runs one step over `rows` and returns, for each index in `logit_rows`, the argmax and,
    /// with [`Logits::Full`], the logits predicting the next position. With no logit rows
    /// (a prefill chunk that does not end its prompt) nothing is read but the step's end.
    pub async fn run(&mut self, ctx: &Context, rows: &[StepRow], logit_rows: &[u32], read: Logits) -> Result<Vec<RowOutput>, EngineError> {
        self.submit(ctx, (rows, logit_rows), (read, Choose::Argmax), None)?.read(ctx).await
    }

    /// Records and submits one step ([`ForwardGraph::run`]) without waiting for it: its outputs
    /// come back through the returned [`PendingStep`], while later steps may already be
    /// submitted behind it. With a `feed`, [`StepRow::FED`] rows take their tokens from it and
    /// the logit rows' tokens go into it (see [`Feed`]). With [`Choose::Sample`] (which needs
    /// the feed's rings) the tokens returned as each row's "argmax" are the sampled ones.
    pub fn submit(
        &mut self,
        ctx: &Context,
        (rows, logit_rows): StepRows<'_>,
        (read, choose): Choice<'_>,
        feed: Option<&Feed<'_>>,
    ) -> Result<PendingStep, EngineError> {
        self.check(rows, logit_rows, feed)?;
        self.check_choice(ctx, logit_rows, choose, feed)?;
        let rec = self.record_forward(ctx, (rows, logit_rows), feed)?;
        Ok(self.record_choice(ctx, rec, (rows, logit_rows), (read, choose), feed))
    }

    /// The first half of [`ForwardGraph::submit`], submitted on its own: the step's forward pass
    /// up to its logits. Its tokens are chosen by [`ForwardGraph::submit_choice`] with the same
    /// rows, which must come before anything else is submitted on this graph (the logits are
    /// the step's until then): a constrained row's mask can be computed while this runs.
    pub fn submit_forward(&mut self, ctx: &Context, (rows, logit_rows): StepRows<'_>, feed: Option<&Feed<'_>>) -> Result<(), EngineError> {
        self.check(rows, logit_rows, feed)?;
        self.record_forward(ctx, (rows, logit_rows), feed)?.submit();
        Ok(())
    }

    /// The second half of [`ForwardGraph::submit`] after [`ForwardGraph::submit_forward`] of
    /// the same rows: chooses the logit rows' tokens and queues them for reading.
    pub fn submit_choice(
        &mut self,
        ctx: &Context,
        (rows, logit_rows): StepRows<'_>,
        (read, choose): Choice<'_>,
        feed: Option<&Feed<'_>>,
    ) -> Result<PendingStep, EngineError> {
        self.check(rows, logit_rows, feed)?;
        self.check_choice(ctx, logit_rows, choose, feed)?;
        let rec = Recorder::new(ctx, "step.choice");
        Ok(self.record_choice(ctx, rec, (rows, logit_rows), (read, choose), feed))
    }

    /// Checks a sampled step's parameters and masks against its logit rows and builds the
    /// sampler at its first use.
    fn check_choice(&mut self, ctx: &Context, logit_rows: &[u32], choose: Choose<'_>, feed: Option<&Feed<'_>>) -> Result<(), EngineError> {
        let Choose::Sample(params, masks) = choose else { return Ok(()) };
        match feed {
            Some(feed) if params.len() == logit_rows.len() => self.build_sampler(ctx, feed)?,
            _ => {
                return Err(ModelError::Format(format!(
                    "a sampled step needs a feed and one RowParams per logit row ({} for {})",
                    params.len(),
                    logit_rows.len()
                ))
                .into())
            }
        }
        let words = self.vocab.div_ceil(32) as usize;
        if let Some((k, m)) = masks.iter().find(|(k, m)| *k as usize >= params.len() || m.len() != words) {
            return Err(ModelError::Format(format!(
                "a token mask of {} words for logit row {k} (a step of {} rows, masks of {words} words)",
                m.len(),
                params.len()
            ))
            .into());
        }
        Ok(())
    }

    /// Records a step's inputs, its layers and its head (`rows` checked).
    fn record_forward<'c>(&mut self, ctx: &'c Context, (rows, logit_rows): StepRows<'_>, feed: Option<&Feed<'_>>) -> Result<Recorder<'c>, EngineError> {
        self.prepare(ctx, rows)?;
        // The head needs a row: with none asked for, the last one stands in and is not returned.
        let stand_in = [rows.len() as u32 - 1];
        let gather = if logit_rows.is_empty() { &stand_in[..] } else { logit_rows };
        let mut rec = Recorder::new(ctx, "step");
        if let Some(feed) = feed {
            for (r, row) in rows.iter().enumerate().filter(|(_, row)| row.token == StepRow::FED) {
                rec.copy(feed.tokens, row.slot as u64 * 4, &self.ids, r as u64 * 4, 4);
            }
        }
        self.record(&mut rec, &self.layers);
        let row_bytes = self.hidden as u64 * 4;
        // Runs of consecutive rows (a prefill chunk's last rows) gather in one copy.
        let mut k = 0;
        while k < gather.len() {
            let run = (1..gather.len() - k).take_while(|&j| gather[k + j] == gather[k] + j as u32).count() + 1;
            rec.copy(&self.x, gather[k] as u64 * row_bytes, &self.x_last, k as u64 * row_bytes, run as u64 * row_bytes);
            k += run;
        }
        self.record(&mut rec, &self.head);
        Ok(rec)
    }

    /// Records the choice of a step's tokens (the argmax, or the sampler with its parameters and
    /// masks written), their hand-over to the feed and their readback, after the head on `rec`,
    /// and submits it (`choose` checked by [`ForwardGraph::check_choice`]).
    fn record_choice(
        &self,
        ctx: &Context,
        mut rec: Recorder<'_>,
        (rows, logit_rows): StepRows<'_>,
        (read, choose): Choice<'_>,
        feed: Option<&Feed<'_>>,
    ) -> PendingStep {
        // With no logit rows the stand-in's argmax is read (the step's end), not returned.
        let (m, read) = if logit_rows.is_empty() { (1, Logits::Argmax) } else { (logit_rows.len() as u64, read) };
        match (choose, feed, self.sampler.as_ref()) {
            (Choose::Sample(params, masks), Some(_), Some((kernels, params_buffer, mask_buffer))) => {
                let mut all = vec![RowParams::INACTIVE; self.max_logits as usize];
                all[..params.len()].copy_from_slice(params);
                ctx.queue.write_buffer(params_buffer, 0, bytemuck::cast_slice(&all));
                for &(k, mask) in masks {
                    ctx.queue.write_buffer(mask_buffer, k as u64 * self.vocab.div_ceil(32) as u64 * 4, bytemuck::cast_slice(mask));
                }
                sample::kernels_for(kernels, params).for_each(|k| rec.dispatch(k));
            }
            _ => rec.dispatch_all(&self.argmax),
        }
        if let (Some(feed), false) = (feed, logit_rows.is_empty()) {
            for (k, &r) in logit_rows.iter().enumerate() {
                rec.copy(&self.argmax_out, k as u64 * 4, feed.tokens, rows[r as usize].slot as u64 * 4, 4);
            }
        }
        let staging = self.staging.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_else(|| {
            // One more step in flight than ever before: a staging buffer the graph keeps.
            self.staging_made.fetch_add(1, Ordering::Relaxed);
            ctx.staging("graph.staging", self.staging_bytes)
        });
        rec.copy(&self.argmax_out, 0, &staging, 0, m * 4);
        let logit_bytes = m * self.vocab as u64 * 4;
        let full = read == Logits::Full;
        if full {
            rec.copy(&self.logits, 0, &staging, m * 4, logit_bytes);
        }
        let index = rec.submit();
        let mapping = ctx.map_after(&staging, if full { m * 4 + logit_bytes } else { m * 4 }, Some(index));
        PendingStep { mapping, staging, free: self.staging.clone(), rows: m as usize, none_asked: logit_rows.is_empty(), full, vocab: self.vocab as usize }
    }

    /// Runs one step submitting every kernel on its own and waiting for it (a 4-byte readback
    /// after each), and returns each dispatch's kernel name and host-clock time in milliseconds,
    /// in order: the per-kernel profile of a device without timestamp queries (each time
    /// includes a submit and a wait). The results of the step are discarded.
    pub async fn profile(&mut self, ctx: &Context, rows: &[StepRow]) -> Result<Vec<(&'static str, f64)>, EngineError> {
        self.check(rows, &[], None)?;
        self.prepare(ctx, rows)?;
        let mut times = Vec::with_capacity(self.dispatch_count());
        for k in self.kernels() {
            let t0 = crate::time::now_ms();
            let mut rec = Recorder::new(ctx, "profile");
            rec.dispatch(k);
            rec.submit();
            ctx.read_bytes(&self.argmax_out, 0, 4).await?;
            times.push((k.name, crate::time::now_ms() - t0));
        }
        Ok(times)
    }

    /// Every dispatch of one greedy step in order (with the current step's attention sizes; a
    /// sampled step runs the sampler's kernels instead of the argmax).
    fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        let nodes = self.layers.iter().chain(&self.head).flat_map(|node| -> NodeKernels<'_> {
            match node {
                Node::Kernel(k) => Some(k).into_iter().chain(&[]),
                Node::Kernels(ks) => None.into_iter().chain(ks),
                Node::Attention(i) => self.attention[*i].kernels(),
            }
        });
        nodes.chain(self.argmax.iter())
    }

    /// The kernel name of every dispatch one step records, in order (with the current step's
    /// attention sizes): what a profile of the step must account for.
    pub fn kernel_names(&self) -> Vec<&'static str> {
        self.kernels().map(|k| k.name).collect()
    }

    /// Number of dispatches one greedy step records (with the current step's attention sizes),
    /// its argmax included; a sampled step records the sampler's kernels instead of the argmax.
    pub fn dispatch_count(&self) -> usize {
        self.kernels().count()
    }
}
