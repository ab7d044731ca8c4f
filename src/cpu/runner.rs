//! The CPU backend behind the engine's [`Backend`] interface: runs a step's rows through the
//! forward pass ([`forward`]) when it is submitted (there is no device to run behind the CPU, so
//! its outputs are ready at once), and keeps what steps hand to each other as the GPU keeps it
//! in its buffers: the token each sequence slot's last step chose ([`StepRow::FED`]) and the
//! sampler's penalty rings. Sampling is [`sample_cpu`], the GPU sampler's CPU twin, so a seeded
//! request draws the same tokens on either backend from the same logits.

use crate::backend::{Backend, Choice, LargestSteps, LocalFuture, Pending, StepRows};
use crate::error::EngineError;
use crate::kv::{CacheConfig, KvCache, KvShape, SeqId};
use crate::model::{Choose, Logits, ModelConfig, ModelError, RowOutput, StepRow};
use crate::sampler::{sample_cpu, SampleShape, MAX_REPETITION_WINDOW};

use super::forward::{forward, HostRow};
use super::kernels;
use super::weights::HostModel;

/// The model in CPU memory, with what its steps hand to each other.
pub struct CpuBackend {
    model: HostModel,
    /// Most rows of one prefill pass outside the scheduler.
    prefill_chunk: u32,
    /// Per sequence slot, the token its last step with a logit row chose ([`StepRow::FED`]).
    feed: Vec<u32>,
    /// Per slot, a ring of [`MAX_REPETITION_WINDOW`] tokens: the sampler's penalty windows.
    history: Vec<u32>,
    /// The logits of the step whose forward pass ran and whose tokens are not chosen yet
    /// ([`Backend::submit_forward`]), `[logit rows][vocab]`.
    logits: Option<Vec<f32>>,
}

impl CpuBackend {
    /// `max_seqs`: the KV cache's sequence slots (the rows' `slot`s are below it).
    pub fn new(model: HostModel, (prefill_chunk, max_seqs): (u32, u32)) -> Result<CpuBackend, EngineError> {
        if prefill_chunk == 0 {
            return Err(ModelError::Format("prefill_chunk must be at least 1".into()).into());
        }
        Ok(CpuBackend {
            model,
            prefill_chunk,
            feed: vec![0; max_seqs as usize],
            history: vec![0; max_seqs as usize * MAX_REPETITION_WINDOW as usize],
            logits: None,
        })
    }

    /// The rows as the forward pass takes them, [`StepRow::FED`] tokens taken from the feed.
    fn host_rows(&self, rows: &[StepRow]) -> Result<Vec<HostRow>, EngineError> {
        rows.iter()
            .map(|r| {
                let token = match r.token {
                    StepRow::FED => *self.feed.get(r.slot as usize).ok_or_else(|| ModelError::Format(format!("sequence slot {}", r.slot)))?,
                    token => token,
                };
                Ok(HostRow { token, position: r.position, seq: SeqId(r.slot) })
            })
            .collect()
    }

    /// The tokens of the logit rows chosen from `logits` as `choose` says: the argmax, or
    /// sampled with each row's parameters and penalty ring (and masked), as the GPU's sampler
    /// does.
    fn choose(&mut self, mut logits: Vec<f32>, m: usize, choose: Choose<'_>) -> Result<Vec<u32>, EngineError> {
        let vocab = logits.len().checked_div(m).unwrap_or(0);
        let (params, masks) = match choose {
            Choose::Argmax => return Ok(logits.chunks(vocab.max(1)).take(m).map(crate::sampler::argmax).collect()),
            Choose::Sample(params, masks) => (params, masks),
        };
        if params.len() != m {
            return Err(ModelError::Format(format!("{} sampler rows for {m} logit rows", params.len())).into());
        }
        let words = vocab.div_ceil(32);
        let mut mask = vec![u32::MAX; m * words];
        for &(row, bits) in masks {
            let at = row as usize * words;
            let to = mask.get_mut(at..at + words).ok_or_else(|| ModelError::Format(format!("a mask for logit row {row} of {m}")))?;
            to.copy_from_slice(bits.get(..words).ok_or_else(|| ModelError::Format("a short token mask".into()))?);
        }
        let shape = SampleShape {
            n_rows: m as u32,
            vocab: vocab as u32,
            history_capacity: MAX_REPETITION_WINDOW,
            n_rings: self.feed.len() as u32,
            out_offset: 0,
            out_stride: 1,
        };
        Ok(sample_cpu(&mut logits, params, &mut self.history, &mask, &shape).into_iter().map(|t| t.unwrap_or(0)).collect())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn adapter_name(&self) -> String {
        format!("CPU backend ({} threads)", kernels::threads())
    }

    /// `"cpu"`, with `+simd128` when the wasm build has SIMD, `+relaxed-simd` when it has relaxed
    /// SIMD too, and `+int8-activations` when the matmuls use them.
    fn variant_name(&self) -> String {
        let mut name = String::from("cpu");
        if cfg!(target_feature = "simd128") {
            name += "+simd128";
        }
        if cfg!(target_feature = "relaxed-simd") {
            name += "+relaxed-simd";
        }
        if self.model.int8_activations {
            name += "+int8-activations";
        }
        name
    }

    fn weights_bytes(&self) -> u64 {
        self.model.bytes()
    }

    fn runner_bytes(&self) -> u64 {
        (self.feed.len() + self.history.len()) as u64 * 4
    }

    fn prefill_chunk(&self) -> u32 {
        self.prefill_chunk
    }

    fn largest_steps_bytes(&self, _: &KvShape, _: &CacheConfig, _: LargestSteps) -> Result<u64, EngineError> {
        Ok(0)
    }

    fn submit(&mut self, kv: &KvCache, step: StepRows<'_>, how: Choice<'_>) -> Result<Pending, EngineError> {
        self.submit_forward(kv, step)?;
        self.submit_choice(kv, step, how)
    }

    fn submit_forward(&mut self, kv: &KvCache, (rows, logit_rows): StepRows<'_>) -> Result<(), EngineError> {
        if self.logits.is_some() {
            return Err(ModelError::Format("a step was submitted while another waits for its choice".into()).into());
        }
        let logits = forward(&self.model, kv, &self.host_rows(rows)?, logit_rows)?;
        self.logits = Some(logits);
        Ok(())
    }

    fn submit_choice(&mut self, _: &KvCache, (rows, logit_rows): StepRows<'_>, (read, choose): Choice<'_>) -> Result<Pending, EngineError> {
        let logits = self.logits.take().ok_or_else(|| ModelError::Format("no step's forward pass waits for its choice".into()))?;
        let m = logit_rows.len();
        let vocab = logits.len().checked_div(m).unwrap_or(0);
        let kept = (read == Logits::Full).then(|| logits.clone());
        let tokens = self.choose(logits, m, choose)?;
        for (&r, &t) in logit_rows.iter().zip(&tokens) {
            if let Some(slot) = rows.get(r as usize).and_then(|row| self.feed.get_mut(row.slot as usize)) {
                *slot = t;
            }
        }
        let outputs: Vec<RowOutput> = tokens.into_iter().enumerate().map(|(i, t)| (t, kept.as_ref().map(|l| l[i * vocab..(i + 1) * vocab].to_vec()))).collect();
        Ok(Pending::ready(outputs))
    }

    fn write_history(&mut self, slot: u32, tokens: &[u32]) -> Result<(), EngineError> {
        let cap = MAX_REPETITION_WINDOW as usize;
        if tokens.len() > cap || slot as usize >= self.feed.len() {
            return Err(ModelError::Format(format!("a penalty ring of {} tokens for slot {slot}", tokens.len())).into());
        }
        self.history[slot as usize * cap..slot as usize * cap + tokens.len()].copy_from_slice(tokens);
        Ok(())
    }

    fn time_kernels<'a>(&'a mut self, kv: &'a KvCache, rows: &'a [StepRow]) -> LocalFuture<'a, Result<Vec<(&'static str, f64)>, EngineError>> {
        let mut times = Vec::new();
        let timed = rows.chunks(self.prefill_chunk as usize).try_for_each(|piece| {
            let t0 = crate::time::now_ms();
            forward(&self.model, kv, &self.host_rows(piece)?, &[piece.len() as u32 - 1])?;
            times.push(("cpu.forward", crate::time::now_ms() - t0));
            Ok(())
        });
        Box::pin(std::future::ready(timed.map(|()| times)))
    }
}
