//! Token sampling: greedy, temperature, top-k, top-p and repetition penalty, with seeded
//! counter-based draws. The definition below is the one both implementations follow: this
//! module on the CPU ([`sample_row`]) and `shaders/sample.wgsl` on the GPU (the GPU layer's
//! sample op, which imports this module's types), so that a sequence samples the same tokens
//! wherever it runs.
//!
//! For one row of logits, the tokens of the penalty window, and a counter (the position being
//! predicted):
//! 1. **Penalty**: each distinct window token `t < vocab` once: `l[t] *= 1/penalty` if `l[t] > 0`,
//!    else `l[t] *= penalty` (in place; `1/penalty` is one f32 reciprocal, so this is the division
//!    up to one rounding, and the same bits on both implementations).
//! 2. **Ranking**: tokens ordered by [`order_key`] descending (the float order, NaN below
//!    everything, -0 == +0), ties by lower id. NaNs are never chosen. The first is the argmax;
//!    `temperature == 0` returns it (0 for a row of NaNs).
//! 3. **Weights**: `x = (l[t] - l_max) * (1/temperature)` in f32 (0 for a token whose key equals
//!    the maximum's, which also covers infinite maxima; excluded for `-inf` logits or a `+inf`
//!    maximum otherwise). Candidates are the tokens with `x >= -27.5`, a prefix of the ranking;
//!    their weight is `q = floor(m * 2^40)` with `m = exp(x)` in f32 (`m = 1` for `x = 0`), an
//!    integer from 1 to 2^40 (e^-27.5 > 2^-40), so every sum below is an exact integer. A
//!    non-candidate's probability under the full softmax is below 2^-39.7 (V·e^-27.5 < 3e-7 in all
//!    for a 262,144 vocabulary); it is never drawn.
//! 4. **top-k** (`k >= 1`): K is the first `k` candidates in the ranking (all when `k = 0` or
//!    `k >= ` their number).
//! 5. **top-p**: with `P = floor(top_p * 2^24)` and `Z_K` the weight of K, N is the shortest
//!    prefix of K whose weight reaches `max(1, floor(Z_K * P / 2^24))` (N = K when `top_p = 1`).
//! 6. **Draw**: with `u = counter_u24(seed, counter)` ([`crate::rng::counter_u24`]) and `Z_N` the
//!    weight of N, the token is the first of N in the ranking whose cumulative weight reaches
//!    `floor(Z_N * u / 2^24) + 1`: token t is drawn with probability `q_t / Z_N` up to the 2^-24
//!    resolution of u.
//!
//! Float rounding enters only through `exp` (the GPU's is a few ulp from the CPU's), so the two
//! implementations can differ only where a cumulative weight lies within that rounding of the
//! draw's target or of a top-p target.

use crate::rng::counter_u24;
/// The longest repetition window: the GPU keeps each sequence's last tokens in a ring this long.
pub const MAX_REPETITION_WINDOW: u32 = 1024;

/// Sampling parameters. `temperature == 0` means greedy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = no limit).
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches top_p (1 = no limit).
    pub top_p: f32,
    /// Divide positive logits (multiply negative ones) of already-seen tokens by this (1 = off).
    pub repetition_penalty: f32,
    /// How many of the last tokens the repetition penalty looks at.
    pub repetition_window: u32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, repetition_window: 64, seed: 0 }
    }
}

/// An invalid sampling parameter, with what is allowed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0 (0 = greedy), got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("repetition_penalty must be a finite number > 0 (1 = off), got {0}")]
    RepetitionPenalty(f32),
    #[error("repetition_window must be at most {MAX_REPETITION_WINDOW} tokens, got {0}")]
    RepetitionWindow(u32),
}

impl SamplingParams {
    pub fn greedy() -> SamplingParams {
        SamplingParams::default()
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        if self.repetition_window > MAX_REPETITION_WINDOW {
            return Err(SamplingError::RepetitionWindow(self.repetition_window));
        }
        Ok(())
    }

    /// True when the GPU's argmax is the whole decision (no logits need to be read back).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }
}

/// A sampler for one sequence: its validated parameters. Stateless: a draw is a function of
/// the seed and the counter passed to [`Sampler::sample`].
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler { params })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token from one row of logits (penalized in place). `history` is the
    /// sequence so far (prompt and generated tokens), whose last `repetition_window` tokens the
    /// penalty looks at; `counter` numbers the draw, by convention the position being predicted
    /// (`history.len()`), so that predicting a position again draws the same token.
    pub fn sample(&self, logits: &mut [f32], history: &[u32], counter: u32) -> u32 {
        let start = history.len().saturating_sub(self.params.repetition_window as usize);
        sample_row(&self.params, logits, &history[start..], counter)
    }
}

/// The lower bound of a candidate's scaled gap `x` (module docs, step 3).
pub const X_MIN: f32 = -27.5;
/// A candidate's weight is `floor(exp(x) * 2^WEIGHT_BITS)`.
pub const WEIGHT_BITS: u32 = 40;

/// A u32 whose order is the float order: NaN -> 0 (below everything), both zeros -> one key,
/// negatives bit-inverted (larger magnitude, smaller key), positives above them. The same
/// function as `order_key` in `shaders/order_key.wgsl`.
pub fn order_key(v: f32) -> u32 {
    let bits = v.to_bits();
    let magnitude = bits & 0x7fff_ffff;
    if magnitude > 0x7f80_0000 {
        0
    } else if magnitude == 0 {
        0x8000_0000
    } else if bits >= 0x8000_0000 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// `top_p` as the 24-bit fraction of step 5; 2^24 (no cut) for `top_p >= 1`.
pub fn top_p_fraction(top_p: f32) -> u32 {
    ((top_p.clamp(0.0, 1.0) * (1u32 << 24) as f32) as u32).min(1 << 24)
}

/// The scaled gap of step 3 (`-inf` for a token excluded outright).
pub fn scaled_gap(v: f32, max: f32, inv_temperature: f32) -> f32 {
    if order_key(v) == order_key(max) {
        0.0
    } else if v == f32::NEG_INFINITY || max == f32::INFINITY {
        f32::NEG_INFINITY
    } else {
        (v - max) * inv_temperature
    }
}

/// The integer weight of a candidate with scaled gap `x >= X_MIN` (step 3).
pub fn weight(x: f32) -> u64 {
    let m = if x == 0.0 { 1.0f32 } else { x.exp() };
    (m as f64 * (1u64 << WEIGHT_BITS) as f64) as u64
}

/// `floor(a * b / 2^24)` without overflow.
fn scale24(a: u64, b: u32) -> u64 {
    ((a as u128 * b as u128) >> 24) as u64
}

/// Index of the first entry whose running total of `weights` reaches `target` (>= 1).
fn first_reaching(weights: impl Iterator<Item = u64>, target: u64) -> Option<usize> {
    let mut cum = 0u64;
    for (i, w) in weights.enumerate() {
        cum += w;
        if cum >= target {
            return Some(i);
        }
    }
    None
}

/// The token the definition (module docs) chooses from `logits`, penalized in place for the
/// distinct tokens of `window` (the last `repetition_window` tokens of the history, in any
/// order). Exact integer sums; candidates sorted, so O(V log V) in the worst case.
pub fn sample_row(params: &SamplingParams, logits: &mut [f32], window: &[u32], counter: u32) -> u32 {
    if params.repetition_penalty != 1.0 {
        let inv_penalty = 1.0 / params.repetition_penalty;
        let mut seen = window.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for &t in &seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l *= if *l > 0.0 { inv_penalty } else { params.repetition_penalty };
            }
        }
    }
    // The argmax by key: the first strictly larger key wins, so ties keep the lowest id.
    let mut top = 0usize;
    let mut key_max = 0u32;
    for (i, &v) in logits.iter().enumerate() {
        let key = order_key(v);
        if key > key_max {
            top = i;
            key_max = key;
        }
    }
    if params.temperature == 0.0 || key_max == 0 {
        return top as u32;
    }
    let max = logits[top];
    let inv_temperature = 1.0 / params.temperature;
    // (key, id, weight) of every candidate, then in ranking order.
    let mut ranked: Vec<(u32, u32, u64)> = logits
        .iter()
        .enumerate()
        .filter_map(|(i, &v)| {
            let x = scaled_gap(v, max, inv_temperature);
            (!v.is_nan() && x >= X_MIN).then(|| (order_key(v), i as u32, weight(x)))
        })
        .collect();
    let rank = |a: &(u32, u32, u64), b: &(u32, u32, u64)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    let k = params.top_k as usize;
    if k > 0 && k < ranked.len() {
        ranked.select_nth_unstable_by(k - 1, rank);
        ranked.truncate(k);
    }
    ranked.sort_unstable_by(rank);
    let p = top_p_fraction(params.top_p);
    if p < 1 << 24 {
        let z_k: u64 = ranked.iter().map(|c| c.2).sum();
        let target = scale24(z_k, p).max(1);
        let keep = first_reaching(ranked.iter().map(|c| c.2), target).map_or(ranked.len(), |i| i + 1);
        ranked.truncate(keep);
    }
    let z_n: u64 = ranked.iter().map(|c| c.2).sum();
    let target = scale24(z_n, counter_u24(params.seed, counter)) + 1;
    let chosen = first_reaching(ranked.iter().map(|c| c.2), target).unwrap_or(ranked.len() - 1);
    ranked[chosen].1
}

/// Index of the largest value (lowest index on ties; NaN never wins).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// The `k` largest (id, logit) pairs, highest first.
pub fn top_k(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..values.len() as u32).filter(|&i| !values[i as usize].is_nan()).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| values[b as usize].total_cmp(&values[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable_by(|&a, &b| values[b as usize].total_cmp(&values[a as usize]).then(a.cmp(&b)));
    idx.into_iter().map(|i| (i, values[i as usize])).collect()
}

/// One row's sampling request for a step, as the GPU's sampling op (`shaders/sample.wgsl`) reads it (64 bytes).
/// Build it with [`RowParams::new`] or [`RowParams::INACTIVE`]: the reciprocals must be the
/// same f32 values the CPU definition computes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowParams {
    pub flags: u32,
    pub temperature: f32,
    pub inv_temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub penalty: f32,
    pub inv_penalty: f32,
    pub window: u32,
    pub history_head: u32,
    pub history_len: u32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub counter: u32,
    /// The ring of `history` this row's penalty window lives in ([`HistoryRing::ring`]).
    pub history_ring: u32,
    pub _pad: [u32; 2],
}

/// Where a row's history ring stands: the slot the next token goes to, and how many tokens it
/// holds (at most the ring's capacity).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HistoryRing {
    pub head: u32,
    pub len: u32,
    /// Which ring of the `history` buffer (below [`SampleShape::n_rings`]): a sequence keeps its
    /// ring whatever row it takes in a step.
    pub ring: u32,
}

impl RowParams {
    /// `flags` bit of a row to sample.
    pub const ACTIVE: u32 = 1;
    /// `flags` bit of a row whose token is also written to its history ring at `history_head`.
    pub const APPEND_HISTORY: u32 = 2;
    /// `flags` bit of a row that chooses among the tokens its row of `mask` allows.
    pub const MASKED: u32 = 4;
    /// A row not sampled this step: its `out` slot is left alone.
    pub const INACTIVE: RowParams = RowParams {
        flags: 0,
        temperature: 0.0,
        inv_temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        penalty: 1.0,
        inv_penalty: 1.0,
        window: 0,
        history_head: 0,
        history_len: 0,
        seed_lo: 0,
        seed_hi: 0,
        counter: 0,
        history_ring: 0,
        _pad: [0; 2],
    };

    /// The row of a sequence sampling with `sampling`, drawing number `counter` (by convention
    /// the position being predicted), its penalty window in the ring `history`.
    pub fn new(sampling: &SamplingParams, counter: u32, history: HistoryRing) -> Result<RowParams, SamplingError> {
        sampling.validate()?;
        let inv = |v: f32| if v == 0.0 { 0.0 } else { 1.0 / v };
        Ok(RowParams {
            flags: Self::ACTIVE,
            temperature: sampling.temperature,
            inv_temperature: inv(sampling.temperature),
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            penalty: sampling.repetition_penalty,
            inv_penalty: inv(sampling.repetition_penalty),
            window: sampling.repetition_window,
            history_head: history.head,
            history_len: history.len,
            seed_lo: sampling.seed as u32,
            seed_hi: (sampling.seed >> 32) as u32,
            counter,
            history_ring: history.ring,
            _pad: [0; 2],
        })
    }
}

/// The sizes of a sampling op, fixed when it is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleShape {
    /// Logit rows (the graph's `max_logits`); rows are switched on per step by their params.
    pub n_rows: u32,
    pub vocab: u32,
    /// Tokens of each history ring (the longest penalty window it can serve; 0: none).
    pub history_capacity: u32,
    /// Rings in `history` (one per sequence slot, say); a row names its own.
    pub n_rings: u32,
    /// Row r's token goes to `out[out_offset + r * out_stride]`.
    pub out_offset: u32,
    pub out_stride: u32,
}

/// The CPU twin of the GPU's sampling op (`gpu::ops::sample`, whose reference it is) and the CPU
/// backend's sampler: [`sample_row`] on each active row with its
/// window decoded from the ring, penalizing `logits` in place and appending to the rings of
/// [`RowParams::APPEND_HISTORY`] rows as the GPU does, and setting the logits a
/// [`RowParams::MASKED`] row's mask clears to `-inf` first. Returns each row's token (`None` for
/// an inactive row). logits: [n_rows, vocab], history: [n_rows, history_capacity],
/// mask: [n_rows, ceil(vocab / 32)] (may be empty when no row is masked).
pub fn sample_cpu(logits: &mut [f32], params: &[RowParams], history: &mut [u32], mask: &[u32], shape: &SampleShape) -> Vec<Option<u32>> {
    let (vocab, cap) = (shape.vocab as usize, shape.history_capacity);
    let words = vocab.div_ceil(32);
    (0..shape.n_rows as usize)
        .map(|r| {
            let p = &params[r];
            if p.flags & RowParams::ACTIVE == 0 {
                return None;
            }
            if p.flags & RowParams::MASKED != 0 {
                for (t, l) in logits[r * vocab..(r + 1) * vocab].iter_mut().enumerate() {
                    if mask[r * words + t / 32] >> (t % 32) & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let has_ring = p.history_ring < shape.n_rings;
            let ring = p.history_ring as usize * cap as usize;
            let n = if has_ring { p.window.min(p.history_len.min(cap)) } else { 0 };
            let window: Vec<u32> = (0..n).map(|i| history[ring + ((p.history_head % cap + cap - 1 - i) % cap) as usize]).collect();
            let sampling = SamplingParams {
                temperature: p.temperature,
                top_k: p.top_k,
                top_p: p.top_p,
                repetition_penalty: p.penalty,
                repetition_window: n,
                seed: (p.seed_hi as u64) << 32 | p.seed_lo as u64,
            };
            let token = sample_row(&sampling, &mut logits[r * vocab..(r + 1) * vocab], &window, p.counter);
            if p.flags & RowParams::APPEND_HISTORY != 0 && cap != 0 && has_ring {
                history[ring + (p.history_head % cap) as usize] = token;
            }
            Some(token)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, seed: 42, ..Default::default() }
    }

    /// Tokens drawn from `logits` at counters `0..n`.
    fn draws(s: &Sampler, logits: &[f32], history: &[u32], n: u32) -> Vec<u32> {
        (0..n).map(|c| s.sample(&mut logits.to_vec(), history, c)).collect()
    }

    #[test]
    fn greedy_picks_the_maximum_and_skips_nans() {
        let s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 3.0, 2.9], &[], 0), 1, "ties go to the lowest id");
        assert_eq!(s.sample(&mut [f32::NAN, -1.0, f32::NAN], &[], 0), 1, "NaN never wins");
        assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY], &[], 0), 1, "-inf ranks above NaN");
        assert_eq!(s.sample(&mut [f32::NAN; 3], &[], 0), 0, "a row of NaNs gives 0");
        // Sampling falls back to the same order: NaNs are never drawn.
        let hot = Sampler::new(params(100.0, 0, 1.0)).unwrap();
        assert!(draws(&hot, &[f32::NAN, 0.0, f32::NAN, 0.5], &[], 300).iter().all(|&t| t == 1 || t == 3));
    }

    #[test]
    fn invalid_parameters_are_refused() {
        assert_eq!(Sampler::new(params(-1.0, 0, 1.0)).err(), Some(SamplingError::Temperature(-1.0)));
        assert_eq!(Sampler::new(params(1.0, 0, 0.0)).err(), Some(SamplingError::TopP(0.0)));
        assert!(Sampler::new(params(f32::NAN, 0, 1.0)).is_err());
        let bad = SamplingParams { repetition_penalty: 0.0, ..Default::default() };
        assert!(matches!(Sampler::new(bad), Err(SamplingError::RepetitionPenalty(_))));
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let s = Sampler::new(params(5.0, 1, 1.0)).unwrap();
        let logits = [0.0, 1.0, 0.5, 1.0 - f32::EPSILON, 1.0];
        assert!(draws(&s, &logits, &[], 200).iter().all(|&t| t == 1));
    }

    #[test]
    fn top_k_and_top_p_keep_only_their_sets() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the first two, top_k 3 the first three.
        let base = [3.0f32, 2.0, 1.0, 0.0];
        let nucleus = draws(&Sampler::new(params(1.0, 0, 0.7)).unwrap(), &base, &[], 500);
        assert!(nucleus.iter().all(|&t| t <= 1), "a token outside the nucleus");
        assert!(nucleus.contains(&1), "the nucleus's second token is never drawn");
        let top3 = draws(&Sampler::new(params(1.0, 3, 1.0)).unwrap(), &base, &[], 2000);
        assert!(top3.iter().all(|&t| t <= 2), "a token outside the top 3");
        assert!(top3.contains(&2), "the third token is never drawn");
    }

    #[test]
    fn draws_are_a_function_of_seed_and_counter() {
        let base = [1.0f32, 0.0, 2.0, 0.5];
        let seeded = |seed| Sampler::new(SamplingParams { temperature: 1.0, seed, ..Default::default() }).unwrap();
        let a = draws(&seeded(1), &base, &[], 400);
        assert_eq!(a, draws(&seeded(1), &base, &[], 400), "the same seed must give the same draws");
        assert_ne!(a, draws(&seeded(2), &base, &[], 400), "another seed must give other draws");
        // Out of order and repeated, each counter gives its own draw again.
        let s = seeded(1);
        for c in [399u32, 7, 7, 0, 123] {
            assert_eq!(s.sample(&mut base.to_vec(), &[], c), a[c as usize], "counter {c}");
        }
        assert!(a.windows(2).any(|w| w[0] != w[1]), "different counters must vary");
    }

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let base = [1.0f32, 0.0, 2.0];
        for temperature in [1.0f32, 0.5] {
            let s = Sampler::new(SamplingParams { temperature, seed: 9, ..Default::default() }).unwrap();
            let a = draws(&s, &base, &[], 6000);
            let z: f64 = base.iter().map(|&l| (l as f64 / temperature as f64).exp()).sum();
            for t in 0..3u32 {
                let freq = a.iter().filter(|&&x| x == t).count() as f64 / a.len() as f64;
                let p = (base[t as usize] as f64 / temperature as f64).exp() / z;
                // 4.5 standard deviations of a frequency over 6000 draws is at most 0.029.
                assert!((freq - p).abs() < 0.03, "T={temperature} token {t}: frequency {freq} vs probability {p}");
            }
        }
    }

    #[test]
    fn repetition_penalty_demotes_each_seen_token_once() {
        let s = Sampler::new(SamplingParams { repetition_penalty: 2.0, repetition_window: 3, ..Default::default() }).unwrap();
        let mut logits = vec![3.0f32, 2.0, -1.0, 0.5];
        // Token 3 is outside the window of 3, tokens 0 and 2 repeat inside it, 9 is past the vocabulary.
        assert_eq!(s.sample(&mut logits, &[3, 0, 2, 0, 9, 2, 0], 0), 1);
        assert_eq!(logits, vec![1.5, 2.0, -2.0, 0.5]);
    }

    #[test]
    fn weights_are_monotone_and_bounded() {
        assert_eq!(weight(0.0), 1 << WEIGHT_BITS);
        assert!(weight(X_MIN) >= 1, "every candidate weighs at least 1");
        let xs: Vec<f32> = (0..=275).map(|i| -(i as f32) / 10.0).collect();
        assert!(xs.windows(2).all(|w| weight(w[0]) >= weight(w[1])));
        assert_eq!(top_p_fraction(1.0), 1 << 24);
        assert!(top_p_fraction(0.5) == 1 << 23 && top_p_fraction(1e-9) <= 1);
    }

    #[test]
    fn top_k_orders_and_breaks_ties_by_id() {
        assert_eq!(top_k(&[1.0, 5.0, 5.0, f32::NAN, 2.0], 3), vec![(1, 5.0), (2, 5.0), (4, 2.0)]);
    }
}
