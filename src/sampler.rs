//! Token sampling: greedy, temperature, top-k, top-p and repetition penalty with a seeded RNG.
//!
//! Greedy decoding never reads the logits back: the engine takes the GPU's argmax. The other
//! modes read one row of logits and sample here, on the CPU, where the sort for top-k/top-p is cheap.

use crate::rng::Rng;

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
        Ok(())
    }

    /// True when the GPU's argmax is the whole decision (no logits need to be read back).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }
}

/// A sampler for one sequence: the parameters plus the RNG state.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler { params, rng })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token from one row of logits. `history` is the sequence so far
    /// (prompt and generated tokens), used by the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let start = history.len().saturating_sub(p.repetition_window as usize);
            let mut seen: Vec<u32> = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for &t in &seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        // Candidates sorted by logit, highest first; NaNs never win.
        let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
        if idx.is_empty() {
            return 0;
        }
        let k = if p.top_k == 0 { idx.len() } else { (p.top_k as usize).min(idx.len()) };
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            idx.truncate(k);
        }
        idx.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let max = logits[idx[0] as usize];
        let mut probs: Vec<f64> = idx.iter().map(|&i| (((logits[i as usize] - max) / p.temperature) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (n, q) in probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= total);
        }
        let r = self.rng.next_f32() as f64;
        let mut cum = 0.0;
        for (n, q) in probs.iter().enumerate() {
            cum += q;
            if r < cum {
                return idx[n];
            }
        }
        idx[probs.len() - 1]
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, seed: 42, ..Default::default() }
    }

    #[test]
    fn greedy_picks_the_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut logits = vec![0.1, 3.0, -1.0, 3.0, 2.9];
        assert_eq!(s.sample(&mut logits, &[]), 1);
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
        let mut s = Sampler::new(params(5.0, 1, 1.0)).unwrap();
        for _ in 0..100 {
            let mut logits = vec![0.0, 1.0, 0.5, 0.9];
            assert_eq!(s.sample(&mut logits, &[]), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the first two.
        let mut s = Sampler::new(params(1.0, 0, 0.7)).unwrap();
        let base = vec![3.0f32, 2.0, 1.0, 0.0];
        for _ in 0..500 {
            let mut logits = base.clone();
            let t = s.sample(&mut logits, &[]);
            assert!(t == 0 || t == 1, "token {t} is outside the nucleus");
        }
    }

    #[test]
    fn temperature_sampling_follows_the_distribution_and_the_seed() {
        let base = vec![1.0f32, 0.0, 2.0];
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed, ..Default::default() }).unwrap();
            (0..4000).map(|_| s.sample(&mut base.clone(), &[])).collect::<Vec<u32>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1), "the same seed must give the same draws");
        assert_ne!(a, draw(2));
        let z: f64 = base.iter().map(|&l| (l as f64).exp()).sum();
        for t in 0..3u32 {
            let freq = a.iter().filter(|&&x| x == t).count() as f64 / a.len() as f64;
            let p = (base[t as usize] as f64).exp() / z;
            assert!((freq - p).abs() < 0.03, "token {t}: frequency {freq} vs probability {p}");
        }
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() }).unwrap();
        let mut logits = vec![3.0f32, 2.0, -1.0];
        assert_eq!(s.sample(&mut logits, &[0]), 1);
        assert_eq!(logits, vec![1.5, 2.0, -1.0]);
    }

    #[test]
    fn top_k_orders_and_breaks_ties_by_id() {
        assert_eq!(top_k(&[1.0, 5.0, 5.0, f32::NAN, 2.0], 3), vec![(1, 5.0), (2, 5.0), (4, 2.0)]);
    }
}
