//! The layer plan on the GPU: each block's ops ([`Op`]) become the graph's kernels, consecutive
//! ops fused where a kernel can do them in one pass (the arithmetic unchanged):
//! - a `Norm` then the `Matmul` reading h: the norm runs in the matmul's prologue where that
//!   pays ([`matmul::norm_prologue_pays`]) and the matmul reads f32 activations, else as a
//!   dispatch of its own (which also writes int8 blocks for matmuls with int8 activations);
//! - a `Matmul` then a `Residual`: the add is the matmul's accumulating epilogue (`x += a ·
//!   Woᵀ`); with a post-norm the matmul stores its output and one kernel norms it, adds it, and
//!   (when the next block's pre-norm and the matmul it feeds follow) writes that next h
//!   ([`norm::residual_norm`]);
//! - a `Bias` after the q|k|v `Matmul`: a kernel adding the stacked biases to every row;
//! - `HeadNorm` (where there is one), `Rope` (where there is one), `Attention`: one kernel norms
//!   the heads, ropes them and writes the step's K/V (`qkv_heads`), then attention (soft-capping
//!   its scores where the layer says), which in a decode step ropes and writes the heads itself
//!   where it can (not with head norms, nor a RoPE beyond base and pairing:
//!   [`Attention::appending_heads`]);
//! - the gate/up `Matmul` then `Glu`: the activation is the matmul's gated epilogue when gate
//!   and up share a type, else a kernel of its own.
//!
//! Any other sequence of ops is a plan this backend cannot run, refused by name when the graph
//! is built.

use crate::error::EngineError;
use crate::gpu::ops::act;
use crate::gpu::ops::attention::{Attention, AttentionBatch, AttentionBuffers, BatchBuffers, BatchPlan, BatchStep};
use crate::gpu::ops::elementwise;
use crate::gpu::ops::kv_write::KvWriteBuffers;
use crate::gpu::ops::matmul::{self, Epilogue, Input, MatmulConfig, QuantMatrix};
use crate::gpu::ops::norm::{self, NormOut};
use crate::gpu::ops::pool::{PoolBuffers, PoolShape};
use crate::gpu::ops::qkv_heads::{self, HeadsRope, QkNorm};
use crate::gpu::{Context, Kernel};
use crate::kv::KvCache;
use crate::model::{ModelConfig, ModelError, Op, Plan, Proj, RopePairing};

use super::Weights;

/// Which attention a graph's layers run (see `graph.rs`'s module documentation): over
/// consecutive rows of one sequence, or over rows of any sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Consecutive rows of one sequence.
    Sequence,
    /// Rows of any sequences.
    Batch,
}

/// One node of a step's recording: a kernel, a run of kernels, or a layer's attention (whose
/// dispatches depend on the step's sizes).
pub(super) enum Node {
    Kernel(Kernel),
    Kernels(Vec<Kernel>),
    /// Index into `ForwardGraph::attention`.
    Attention(usize),
}

pub(super) enum LayerAttention {
    Sequence(Attention),
    Batch(AttentionBatch),
}

impl LayerAttention {
    pub fn kernels(&self) -> &[Kernel] {
        match self {
            LayerAttention::Sequence(a) => a.kernels(),
            LayerAttention::Batch(a) => a.kernels(),
        }
    }
}

/// A layer's qkv_heads kernel and its attention, which may do the heads' work itself.
pub(super) struct AttentionNode {
    pub heads: Kernel,
    pub attention: LayerAttention,
}

/// The dispatches of one node of a step: a kernel, then a run of kernels.
pub(super) type NodeKernels<'a> = std::iter::Chain<std::option::IntoIter<&'a Kernel>, std::slice::Iter<'a, Kernel>>;

impl AttentionNode {
    /// The step's dispatches: qkv_heads, unless attention ropes and writes the heads itself at
    /// this step ([`Attention::fuses_heads`]), then attention's.
    pub fn kernels(&self) -> NodeKernels<'_> {
        let fused = match &self.attention {
            LayerAttention::Sequence(a) => a.fuses_heads(),
            LayerAttention::Batch(a) => a.fuses_heads(),
        };
        (!fused).then_some(&self.heads).into_iter().chain(self.attention.kernels())
    }
}

/// The activation buffers of a graph, `rows` rows each.
pub(super) struct Activations {
    pub x: wgpu::Buffer,
    h: wgpu::Buffer,
    qkv: wgpu::Buffer,
    attn: wgpu::Buffer,
    /// The stacked gate/up matmul's output (a placeholder when every layer's is gated).
    gate_up: wgpu::Buffer,
    act: wgpu::Buffer,
    /// The post-norms' output (models with `post_norms` only; else a placeholder).
    post: wgpu::Buffer,
    /// h, attn and act as int8 blocks for matmuls with int8 activations (placeholders without):
    /// h quantized by the norm that writes it, attn and act by a quantize dispatch of their own.
    hq: wgpu::Buffer,
    attn_q: wgpu::Buffer,
    act_q: wgpu::Buffer,
    /// The matmuls' kernel variant for this many rows.
    matmul: MatmulConfig,
    /// The pre-norms before the qkv and gate/up matmuls run in their prologue where they read f32
    /// ([`matmul::norm_prologue_pays`]).
    prologue: bool,
}

impl Activations {
    /// `gated`: every layer's FFN activation runs in its gate/up matmul (no `gate_up` needed);
    /// `post`: some residual has a post-norm (the `post` buffer is needed).
    pub fn new(ctx: &Context, cfg: &ModelConfig, rows: u32, (gated, post): (bool, bool)) -> Activations {
        let (f, n) = (4u64, rows as u64);
        let matmul = MatmulConfig::for_device(ctx, rows);
        let int8 = |label, cols| ctx.storage_zeroed(label, if matmul.int8_activations { matmul::int8_bytes(rows, cols) } else { 48 });
        Activations {
            x: ctx.storage_zeroed("graph.x", n * cfg.hidden as u64 * f),
            h: ctx.storage_zeroed("graph.h", n * cfg.hidden as u64 * f),
            qkv: ctx.storage_zeroed("graph.qkv", n * cfg.qkv_width() as u64 * f),
            attn: ctx.storage_zeroed("graph.attn", n * cfg.q_width() as u64 * f),
            gate_up: ctx.storage_zeroed("graph.gate_up", if gated { 4 } else { n * 2 * cfg.ffn as u64 * f }),
            act: ctx.storage_zeroed("graph.act", n * cfg.ffn as u64 * f),
            post: ctx.storage_zeroed("graph.post", if post { n * cfg.hidden as u64 * f } else { 4 }),
            hq: int8("graph.hq", cfg.hidden),
            attn_q: int8("graph.attn_q", cfg.q_width()),
            act_q: int8("graph.act_q", cfg.ffn),
            prologue: matmul::norm_prologue_pays(ctx, &matmul),
            matmul,
        }
    }

    /// What a norm writing h for the matmul over `w` writes: f32 rows where some part of `w`
    /// reads them, int8 blocks where some part takes int8 activations.
    fn h_out(&self, w: &QuantMatrix) -> NormOut<'_> {
        NormOut { f32: w.needs_f32(&self.matmul).then_some(&self.h), int8: w.reads_int8(&self.matmul).then_some(&self.hq) }
    }

    /// The input of the matmul over `w` reading h (as [`Activations::h_out`] wrote it).
    fn h_in(&self, w: &QuantMatrix) -> Input<'_> {
        match self.h_out(w) {
            NormOut { int8: Some(q), f32, .. } => Input::Int8 { q, f32 },
            _ => Input::F32(&self.h),
        }
    }

    /// Whether the matmul over `w` takes a pre-norm of x in its prologue ([`Input::Norm`]) rather
    /// than h from a norm dispatch: where that pays on this adapter and it reads f32 activations
    /// (a norm that quantizes stays a dispatch of its own).
    fn normalizes(&self, w: &QuantMatrix) -> bool {
        self.prologue && !w.reads_int8(&self.matmul)
    }

    /// The input of the matmul over `w` after the pre-norm `rms_norm(x) · weight`: x normalized in
    /// its prologue, or h (which a norm dispatch then writes: see [`Activations::normalizes`]).
    fn normed_in<'b>(&'b self, w: &QuantMatrix, weight: &'b wgpu::Buffer, eps: f32) -> Input<'b> {
        if self.normalizes(w) {
            Input::Norm { x: &self.x, weight, eps }
        } else {
            self.h_in(w)
        }
    }

    /// The matmul over `w` reading the f32 `x` (attn or act, `w.cols` wide): with int8
    /// activations, a quantize dispatch into `xq` first.
    fn quantized_matmul(
        &self,
        ctx: &Context,
        w: &QuantMatrix,
        (x, xq, y): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        n: u32,
        epilogue: Epilogue,
    ) -> Result<Vec<Kernel>, EngineError> {
        if !w.reads_int8(&self.matmul) {
            return Ok(matmul::matmul_input(ctx, w, (Input::F32(x), y), n, self.matmul, epilogue)?);
        }
        let mut kernels = vec![matmul::quantize(ctx, x, xq, n, w.cols)?];
        let f32 = w.needs_f32(&self.matmul).then_some(x);
        kernels.extend(matmul::matmul_input(ctx, w, (Input::Int8 { q: xq, f32 }, y), n, self.matmul, epilogue)?);
        Ok(kernels)
    }
}

/// The buffers one layer's attention binds.
struct LayerBuffers<'a> {
    qkv: &'a wgpu::Buffer,
    pool: PoolBuffers<'a>,
    positions: &'a wgpu::Buffer,
    /// The step buffer ([`AttentionBuilder::step_buffer`]).
    step: &'a wgpu::Buffer,
    out: &'a wgpu::Buffer,
}

/// Builds each layer's attention of one kind over the pool: for the batch kind, with the plan
/// and the split scratch every layer shares (layers run one after the other).
pub(super) enum AttentionBuilder {
    Sequence(PoolShape),
    Batch { pool: PoolShape, plan: BatchPlan, scratch: wgpu::Buffer },
}

impl AttentionBuilder {
    pub fn new(ctx: &Context, cfg: &ModelConfig, kv: &KvCache, kind: AttentionKind, max_rows: u32) -> AttentionBuilder {
        let pool = PoolShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            max_len: kv.max_seq_len,
            block_size: kv.block_size(),
            // Layer 0's group; each layer takes its own group's count and window (`Layers::attention`).
            n_blocks: kv.layer_blocks(0),
            dtype: kv.dtype(),
            window: 0,
            softcap: 0.0,
        };
        match kind {
            AttentionKind::Sequence => AttentionBuilder::Sequence(pool),
            AttentionKind::Batch => {
                let plan = BatchPlan::auto(ctx, &pool);
                let scratch = ctx.storage_zeroed("graph.attention_scratch", AttentionBatch::scratch_bytes(ctx, &pool, max_rows, &plan));
                AttentionBuilder::Batch { pool, plan, scratch }
            }
        }
    }

    fn pool(&self) -> &PoolShape {
        match self {
            AttentionBuilder::Sequence(pool) | AttentionBuilder::Batch { pool, .. } => pool,
        }
    }

    /// The buffer attention reads a step's rows from.
    pub fn step_buffer(&self, ctx: &Context, max_rows: u32) -> wgpu::Buffer {
        match self {
            AttentionBuilder::Sequence(_) => ctx.uniform_init("graph.step", bytemuck::bytes_of(&0u32)),
            AttentionBuilder::Batch { .. } => ctx.storage_zeroed("graph.batch", BatchStep::buffer_bytes(max_rows)),
        }
    }

    /// One layer's attention over `pool` (the builder's, with the layer's window); with `fresh`
    /// (the layer's rope) it ropes and writes the heads where it can
    /// ([`Attention::appending_heads`], [`AttentionBatch::appending_heads`]).
    fn layer(
        &self,
        ctx: &Context,
        b: &LayerBuffers<'_>,
        pool: &PoolShape,
        rows: u32,
        fresh: Option<(f32, RopePairing)>,
    ) -> Result<LayerAttention, EngineError> {
        Ok(match self {
            AttentionBuilder::Sequence(_) => {
                let buffers = AttentionBuffers { qkv: b.qkv, pool: b.pool, positions: b.positions, step: b.step, out: b.out };
                LayerAttention::Sequence(match fresh {
                    Some(rope) => Attention::appending_heads(ctx, &buffers, *pool, rows, None, rope)?,
                    None => Attention::new(ctx, &buffers, *pool, rows, None)?,
                })
            }
            AttentionBuilder::Batch { plan, scratch, .. } => {
                let buffers = BatchBuffers { qkv: b.qkv, pool: b.pool, batch: b.step, out: b.out, scratch: Some(scratch) };
                LayerAttention::Batch(match fresh {
                    Some(rope) => AttentionBatch::appending_heads(ctx, &buffers, *pool, rows, Some(*plan), rope)?,
                    None => AttentionBatch::new(ctx, &buffers, *pool, rows, Some(*plan))?,
                })
            }
        })
    }
}

/// What a graph's layers are built with.
pub(super) struct Layers<'a> {
    pub ctx: &'a Context,
    pub cfg: &'a ModelConfig,
    pub weights: &'a Weights,
    pub kv: &'a KvCache,
    pub a: &'a Activations,
    pub attention: &'a AttentionBuilder,
    /// The step's `[rows]` absolute positions and table bases, and what attention reads of the
    /// step ([`AttentionBuilder::step_buffer`]).
    pub positions: &'a wgpu::Buffer,
    pub row_tables: &'a wgpu::Buffer,
    pub step: &'a wgpu::Buffer,
    /// Rows of the graph.
    pub n: u32,
}

/// The nodes of a graph's layers, and the attention nodes they index.
#[derive(Default)]
pub(super) struct Built {
    pub nodes: Vec<Node>,
    pub attention: Vec<AttentionNode>,
}

/// The plan's ops of every layer in order, each with its layer.
type Ops<'p> = [(usize, &'p Op)];

/// A plan this backend cannot run.
fn unsupported(ops: &Ops<'_>) -> EngineError {
    let what: Vec<String> = ops.iter().take(3).map(|(l, op)| format!("{op:?} (layer {l})")).collect();
    ModelError::Unsupported(format!("on the WebGPU backend, a layer plan going {}", what.join(", "))).into()
}

impl Layers<'_> {
    /// The kernels of every layer of `plan`, ops matched from the first (see the module
    /// documentation).
    pub fn build(&self, plan: &Plan) -> Result<Built, EngineError> {
        let ops: Vec<(usize, &Op)> = plan.layers.iter().enumerate().flat_map(|(l, ops)| ops.iter().map(move |op| (l, op))).collect();
        let mut built = Built::default();
        // Whether a post-normed residual wrote the next pre-norm's h already.
        let mut h_written = false;
        let mut i = 0;
        while i < ops.len() {
            let rest = &ops[i..];
            i += match (rest[0].1, rest.get(1).map(|o| o.1)) {
                (Op::Norm(_), Some(Op::Matmul { .. })) => self.normed_matmul(rest, std::mem::take(&mut h_written), &mut built)?,
                (Op::HeadNorm { .. } | Op::Rope(_) | Op::Attention(_), _) => self.attention(rest, &mut built)?,
                (Op::Matmul { .. }, Some(Op::Residual { .. })) => {
                    let (taken, wrote_h) = self.residual(rest, &mut built)?;
                    h_written = wrote_h;
                    taken
                }
                _ => return Err(unsupported(rest)),
            };
        }
        Ok(built)
    }

    /// `Norm`, the `Matmul` reading its h (and the gate/up matmul's `Glu`): the norm in the
    /// matmul's prologue, as a dispatch before it, or already written (`h_written`). Returns
    /// the ops taken.
    fn normed_matmul(&self, ops: &Ops<'_>, h_written: bool, built: &mut Built) -> Result<usize, EngineError> {
        let (Op::Norm(role), (l, Op::Matmul { proj, .. })) = (ops[0].1, ops[1]) else { return Err(unsupported(ops)) };
        let (a, n, eps) = (self.a, self.n, self.cfg.rms_eps);
        let lw = &self.weights.layers[l];
        let (w, norm_weight) = (lw.matrix(*proj)?, lw.norm(*role)?);
        if !h_written && !a.normalizes(w) {
            built.nodes.push(Node::Kernel(norm::rms_norm_to(self.ctx, &a.x, norm_weight, a.h_out(w), n, self.cfg.hidden, eps)?));
        }
        let input = if h_written { a.h_in(w) } else { a.normed_in(w, norm_weight, eps) };
        let kernels = |out, epilogue| matmul::matmul_input(self.ctx, w, (input, out), n, a.matmul, epilogue);
        match (proj, ops.get(2).map(|o| o.1)) {
            // With its biases added to every row (stacked q|k|v, one buffer).
            (Proj::Qkv, Some(&Op::Bias { proj: Proj::Qkv, biases })) => {
                built.nodes.push(Node::Kernels(kernels(&a.qkv, Epilogue::Store)?));
                let width = self.cfg.qkv_width();
                built.nodes.push(Node::Kernel(elementwise::add_rows(self.ctx, &a.qkv, lw.norm(biases[0])?, n * width, width)?));
                Ok(3)
            }
            (Proj::Qkv, _) => {
                built.nodes.push(Node::Kernels(kernels(&a.qkv, Epilogue::Store)?));
                Ok(2)
            }
            (Proj::GateUp, Some(&Op::Glu(activation))) if w.gated => {
                built.nodes.push(Node::Kernels(kernels(&a.act, Epilogue::Gated(activation))?));
                Ok(3)
            }
            (Proj::GateUp, Some(&Op::Glu(activation))) => {
                built.nodes.push(Node::Kernels(kernels(&a.gate_up, Epilogue::Store)?));
                built.nodes.push(Node::Kernel(act::glu(self.ctx, (&a.gate_up, &a.act), n, self.cfg.ffn, activation)?));
                Ok(3)
            }
            _ => Err(unsupported(ops)),
        }
    }

    /// [`Op::HeadNorm`] (where there is one), `Rope` (where there is one: not in a NoPE layer) and
    /// `Attention`: the qkv_heads kernel and the layer's attention, which may do the heads' work
    /// itself. Returns the ops taken.
    fn attention(&self, ops: &Ops<'_>, built: &mut Built) -> Result<usize, EngineError> {
        let (l, a) = (ops[0].0, self.a);
        let head_norm = match ops[0].1 {
            Op::HeadNorm { q, .. } => Some(self.weights.layers[l].norm(*q)?),
            _ => None,
        };
        let mut at = usize::from(head_norm.is_some());
        let rope = match ops.get(at).map(|o| o.1) {
            Some(Op::Rope(rope)) => {
                at += 1;
                Some(*rope)
            }
            _ => None,
        };
        let Some(Op::Attention(attend)) = ops.get(at).map(|o| o.1) else {
            return Err(unsupported(ops));
        };
        let factors = match rope {
            Some(r) if r.factors => Some(self.cfg.rope_factors.as_deref().ok_or_else(|| ModelError::Format("RoPE factors the model lacks".into()))?),
            _ => None,
        };
        // A NoPE layer: no dimension turns.
        let heads_rope = match rope {
            Some(r) => HeadsRope { base: r.base, pairing: r.pairing, dims: Some(r.dims), factors, scale: r.scale },
            None => HeadsRope { base: self.cfg.rope_base, pairing: self.cfg.rope_pairing, dims: Some(0), factors: None, scale: 1.0 },
        };
        // The layer's window and its block group's size (local layers hold fewer blocks).
        let pool = PoolShape {
            window: attend.window.unwrap_or(0),
            n_blocks: self.kv.layer_blocks(l),
            softcap: attend.softcap.unwrap_or(0.0),
            ..*self.attention.pool()
        };
        // One kernel for the q/k norms, RoPE and the KV write. The pool's dtype picks its
        // variant: INT8 quantizes here and is dequantized inside attention.
        let qk_norm = head_norm.map(|weights| QkNorm { weights, eps: self.cfg.rms_eps });
        let pool_buffers = self.kv.layer_buffers(l);
        let write = KvWriteBuffers { qkv: &a.qkv, pool: pool_buffers, positions: self.positions, row_tables: self.row_tables };
        let heads = qkv_heads::qkv_heads(self.ctx, &write, qk_norm, &pool, self.n, heads_rope)?;
        // Decode attention does the heads' work itself where it can (not with head norms, nor
        // with a RoPE beyond base and pairing): one dispatch fewer per layer.
        let fresh = (qk_norm.is_none() && rope.is_some() && heads_rope.is_plain(self.cfg.head_dim)).then_some((heads_rope.base, heads_rope.pairing));
        let layer = LayerBuffers { qkv: &a.qkv, pool: pool_buffers, positions: self.positions, step: self.step, out: &a.attn };
        built.attention.push(AttentionNode { heads, attention: self.attention.layer(self.ctx, &layer, &pool, self.n, fresh)? });
        built.nodes.push(Node::Attention(built.attention.len() - 1));
        Ok(at + 1)
    }

    /// A `Matmul` of the attention output or the FFN activation and its `Residual`: the add as
    /// the matmul's epilogue, or with a post-norm one kernel that also writes the next block's
    /// h when its pre-norm and matmul follow. Returns the ops taken and whether it wrote that h.
    fn residual(&self, ops: &Ops<'_>, built: &mut Built) -> Result<(usize, bool), EngineError> {
        let ((l, Op::Matmul { proj, .. }), Op::Residual { post_norm }) = (ops[0], ops[1].1) else { return Err(unsupported(ops)) };
        let (a, n) = (self.a, self.n);
        let lw = &self.weights.layers[l];
        let w = lw.matrix(*proj)?;
        let (x, xq) = match proj {
            Proj::Out => (&a.attn, &a.attn_q),
            Proj::Down => (&a.act, &a.act_q),
            _ => return Err(unsupported(ops)),
        };
        let Some(post) = post_norm else {
            built.nodes.push(Node::Kernels(a.quantized_matmul(self.ctx, w, (x, xq, &a.x), n, Epilogue::Accumulate)?));
            return Ok((2, false));
        };
        built.nodes.push(Node::Kernels(a.quantized_matmul(self.ctx, w, (x, xq, &a.post), n, Epilogue::Store)?));
        // The next pre-norm, and the matrix its output feeds (whose types say whether it writes
        // f32, int8 or both), when they follow.
        let next = match (ops.get(2), ops.get(3)) {
            (Some(&(nl, Op::Norm(role))), Some(&(_, Op::Matmul { proj, .. }))) => {
                let next = &self.weights.layers[nl];
                Some((next.norm(*role)?, a.h_out(next.matrix(*proj)?)))
            }
            _ => None,
        };
        let wrote_h = next.is_some();
        built.nodes.push(Node::Kernel(norm::residual_norm(self.ctx, (&a.x, &a.post), lw.norm(*post)?, next, (n, self.cfg.hidden, self.cfg.rms_eps))?));
        Ok((2, wrote_h))
    }
}
