//! Runs rows through the model on the GPU: picks (and caches) the forward graph for a step's
//! shape, and holds what steps hand to each other on the GPU (the feed of tokens and the
//! sampler's penalty rings).
//!
//! A step whose rows are consecutive positions of one sequence (a prefill chunk, or a lone
//! decode token) takes a [`AttentionKind::Sequence`] graph built for exactly its row count,
//! whose prefill attention shares each key among the rows of the chunk; any other step takes
//! one [`AttentionKind::Batch`] forward over all its rows (the weights are read once for the
//! whole batch), built for power-of-two row and logit-row capacities.

use std::collections::HashMap;

use crate::backend::{Choice, LargestSteps, StepRows};
use crate::error::EngineError;
use crate::gpu::{Context, GpuError};
use crate::kv::KvCache;
use crate::model::{ModelConfig, ModelError, StepRow};
use crate::sampler::MAX_REPETITION_WINDOW;

use super::graph::{Feed, ForwardGraph, PendingStep};
use super::plan::AttentionKind;
use super::Weights;

/// The loaded model: its configuration and its weights on the device.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
}

/// Graphs by (rows, logit rows), dropped all at once when `cap` shapes are held (prompts of
/// many lengths would otherwise keep a graph each).
struct GraphCache {
    kind: AttentionKind,
    cap: usize,
    graphs: HashMap<(u32, u32), ForwardGraph>,
}

impl GraphCache {
    fn new(kind: AttentionKind, cap: usize) -> GraphCache {
        GraphCache { kind, cap, graphs: HashMap::new() }
    }

    fn get(&mut self, ctx: &Context, model: &Model, kv: &KvCache, rows: u32, logits: u32) -> Result<&mut ForwardGraph, EngineError> {
        let key = (rows, logits);
        if !self.graphs.contains_key(&key) {
            if self.graphs.len() >= self.cap {
                self.graphs.clear();
            }
            let graph = ForwardGraph::build(ctx, (&model.config, &model.weights), kv, self.kind, rows, logits)?;
            self.graphs.insert(key, graph);
        }
        Ok(self.graphs.get_mut(&key).expect("inserted above"))
    }

    fn bytes(&self) -> u64 {
        self.graphs.values().map(ForwardGraph::bytes).sum()
    }

    fn budget_bytes(&self) -> u64 {
        self.graphs.values().map(ForwardGraph::budget_bytes).sum()
    }
}

/// With a memory cap ([`Runner::set_budget`]): what the graphs may hold, and the cap it comes
/// from (for the error's message).
#[derive(Clone, Copy, Debug)]
pub struct GraphBudget {
    /// Bytes the graphs may hold together: the cap less the weights, the KV cache and the rings.
    pub graphs: u64,
    /// The engine's cap (`max_memory_bytes`).
    pub cap: u64,
}

/// The graph caches, picked by a step's shape.
struct Graphs {
    /// The one-row decode graph, kept whatever else is built.
    decode: GraphCache,
    sequence: GraphCache,
    batch: GraphCache,
    budget: Option<GraphBudget>,
}

impl Graphs {
    fn bytes(&self) -> u64 {
        self.decode.bytes() + self.sequence.bytes() + self.batch.bytes()
    }

    /// What the graphs may come to hold with their steps in flight ([`ForwardGraph::budget_bytes`]).
    fn budget_bytes(&self) -> u64 {
        self.decode.budget_bytes() + self.sequence.budget_bytes() + self.batch.budget_bytes()
    }

    /// The graph for `rows` with `n_logits` logit rows, built on first use. Under a budget, a new
    /// graph that takes the caches past it makes them drop every other graph (the decode one
    /// stays unless it alone is too much), and one that is past it alone is refused as
    /// [`GpuError::OutOfMemory`].
    fn get(&mut self, (ctx, model, kv): (&Context, &Model, &KvCache), rows: &[StepRow], n_logits: usize) -> Result<&mut ForwardGraph, EngineError> {
        let first = rows[0];
        let one_sequence = rows.iter().enumerate().all(|(i, r)| r.table_base == first.table_base && r.position == first.position + i as u32);
        let n = rows.len() as u32;
        let (which, key) = if one_sequence && n == 1 && n_logits <= 1 {
            (0, (1, 1))
        } else if one_sequence {
            (1, (n, (n_logits as u32).max(1)))
        } else {
            let capacity = n.next_power_of_two();
            (2, (capacity, (n_logits as u32).max(1).next_power_of_two().min(capacity)))
        };
        let fresh = !self.cache(which).graphs.contains_key(&key);
        self.cache(which).get(ctx, model, kv, key.0, key.1)?;
        if let (true, Some(budget)) = (fresh, self.budget) {
            self.fit(which, key, budget)?;
        }
        Ok(self.cache(which).graphs.get_mut(&key).expect("built above"))
    }

    fn cache(&mut self, which: usize) -> &mut GraphCache {
        match which {
            0 => &mut self.decode,
            1 => &mut self.sequence,
            _ => &mut self.batch,
        }
    }

    /// Brings the graphs within `budget` after graph `key` of cache `which` was built.
    fn fit(&mut self, which: usize, key: (u32, u32), budget: GraphBudget) -> Result<(), EngineError> {
        for drop_decode in [false, true] {
            if self.budget_bytes() <= budget.graphs {
                return Ok(());
            }
            for w in 0..3 {
                if w == which {
                    self.cache(w).graphs.retain(|k, _| *k == key);
                } else if w != 0 || drop_decode {
                    self.cache(w).graphs.clear();
                }
            }
        }
        if self.budget_bytes() <= budget.graphs {
            return Ok(());
        }
        let need = self.cache(which).graphs.remove(&key).map_or(0, |g| g.budget_bytes());
        Err(EngineError::Gpu(GpuError::OutOfMemory(format!(
            "a step of {} rows needs {need} bytes of activations, but the {}-byte memory cap leaves {} for them after the weights and the KV cache \
             (raise maxMemoryBytes, or lower prefillChunk/stepTokens)",
            key.0, budget.cap, budget.graphs
        ))))
    }
}

/// Owns the forward graphs of one engine.
pub struct Runner {
    /// Most rows of one prefill pass outside the scheduler.
    prefill_chunk: u32,
    graphs: Graphs,
    /// The tokens steps hand to each other on the GPU, one per sequence slot ([`Feed`]).
    feed: wgpu::Buffer,
    /// The sampler's penalty windows: a ring of [`MAX_REPETITION_WINDOW`] tokens per slot.
    history: wgpu::Buffer,
}

impl Runner {
    /// `max_seqs`: the KV cache's sequence slots (the rows' `slot`s are below it).
    pub fn new(ctx: &Context, prefill_chunk: u32, max_seqs: u32) -> Result<Runner, EngineError> {
        if prefill_chunk == 0 {
            return Err(ModelError::Format("prefill_chunk must be at least 1".into()).into());
        }
        Ok(Runner {
            prefill_chunk,
            graphs: Graphs {
                decode: GraphCache::new(AttentionKind::Sequence, 1),
                sequence: GraphCache::new(AttentionKind::Sequence, 4),
                batch: GraphCache::new(AttentionKind::Batch, 6),
                budget: None,
            },
            feed: ctx.storage_zeroed("runner.feed", max_seqs as u64 * 4),
            history: ctx.storage_zeroed("runner.history", max_seqs as u64 * MAX_REPETITION_WINDOW as u64 * 4),
        })
    }

    /// Device bytes the runner holds now: its graphs (activations, scratch, sampler, staging)
    /// and the feed and penalty rings. Graphs come and go with the step shapes asked for.
    pub fn bytes(&self) -> u64 {
        self.graphs.bytes() + self.feed.size() + self.history.size()
    }

    /// What the runner may come to hold with its steps in flight: [`Runner::bytes`] with every
    /// graph's staging buffers ([`ForwardGraph::budget_bytes`]).
    pub fn budget_bytes(&self) -> u64 {
        self.graphs.budget_bytes() + self.feed.size() + self.history.size()
    }

    /// Keeps the graphs within `budget` from now on (see `Graphs::get`).
    pub fn set_budget(&mut self, budget: GraphBudget) {
        self.graphs.budget = Some(budget);
    }

    /// Builds the graphs a generation's steps take at most: one decode row, a single sequence's
    /// chunk of `chunk_rows` rows, and (when `batch` sequences may run together) a batch step of
    /// `step_rows` rows with `batch` logit rows. With a memory cap, the engine measures them this
    /// way to size its KV pool.
    pub fn build_largest(&mut self, ctx: &Context, model: &Model, kv: &KvCache, steps: LargestSteps) -> Result<(), EngineError> {
        let LargestSteps { chunk_rows, step_rows, batch } = steps;
        let row = |i: u32, table_base: u32| StepRow { token: 0, position: i, table_base, slot: 0 };
        let mut shapes: Vec<(Vec<StepRow>, usize)> = vec![(vec![row(0, 0)], 1), ((0..chunk_rows.max(1)).map(|i| row(i, 0)).collect(), 1)];
        if batch > 1 {
            // Rows of different tables: a batch of sequences.
            shapes.push(((0..step_rows.max(2)).map(|i| row(0, i)).collect(), batch as usize));
        }
        for (rows, logits) in &shapes {
            self.graphs.get((ctx, model, kv), rows, *logits)?;
        }
        Ok(())
    }

    /// The graph of `step`'s shape (built on first use) and the feed and rings it reads and
    /// writes on the GPU.
    fn graph_for(&mut self, (ctx, model, kv): (&Context, &Model, &KvCache), step: StepRows<'_>) -> Result<(&mut ForwardGraph, Feed<'_>), EngineError> {
        let feed = Feed { tokens: &self.feed, history: &self.history, history_capacity: MAX_REPETITION_WINDOW };
        let graph = self.graphs.get((ctx, model, kv), step.0, step.1.len())?;
        Ok((graph, feed))
    }

    /// Submits one step (`Backend::submit` in `src/backend.rs`) on the graph of its shape.
    pub fn submit(&mut self, at: (&Context, &Model, &KvCache), step: StepRows<'_>, how: Choice<'_>) -> Result<PendingStep, EngineError> {
        let (graph, feed) = self.graph_for(at, step)?;
        graph.submit(at.0, step, how, Some(&feed))
    }

    /// The forward pass of a step alone (`Backend::submit_forward`).
    pub fn submit_forward(&mut self, at: (&Context, &Model, &KvCache), step: StepRows<'_>) -> Result<(), EngineError> {
        let (graph, feed) = self.graph_for(at, step)?;
        graph.submit_forward(at.0, step, Some(&feed))
    }

    /// Chooses the tokens of the step [`Runner::submit_forward`] submitted with these rows and
    /// queues them for reading (`Backend::submit_choice`).
    pub fn submit_choice(&mut self, at: (&Context, &Model, &KvCache), step: StepRows<'_>, how: Choice<'_>) -> Result<PendingStep, EngineError> {
        let (graph, feed) = self.graph_for(at, step)?;
        graph.submit_choice(at.0, step, how, Some(&feed))
    }

    /// Most rows of one prefill pass outside the scheduler.
    pub fn prefill_chunk(&self) -> u32 {
        self.prefill_chunk
    }

    /// Writes slot `slot`'s penalty ring (`Backend::write_history`), queued behind the steps
    /// already submitted.
    pub fn write_history(&self, ctx: &Context, slot: u32, tokens: &[u32]) -> Result<(), EngineError> {
        if tokens.len() > MAX_REPETITION_WINDOW as usize || slot as u64 >= self.feed.size() / 4 {
            return Err(ModelError::Format(format!("a penalty ring of {} tokens for slot {slot}", tokens.len())).into());
        }
        if !tokens.is_empty() {
            ctx.queue.write_buffer(&self.history, slot as u64 * MAX_REPETITION_WINDOW as u64 * 4, bytemuck::cast_slice(tokens));
        }
        Ok(())
    }

    /// Host-clock times of every dispatch (see [`ForwardGraph::profile`]) of the prefill steps
    /// over `rows` (`Backend::time_kernels`), each on the graph its step takes.
    pub async fn time_kernels(&mut self, ctx: &Context, model: &Model, kv: &KvCache, rows: &[StepRow]) -> Result<Vec<(&'static str, f64)>, EngineError> {
        let mut times = Vec::new();
        for piece in rows.chunks(self.prefill_chunk as usize) {
            let graph = self.graphs.get((ctx, model, kv), piece, 1)?;
            times.extend(graph.profile(ctx, piece).await?);
        }
        Ok(times)
    }
}
