//! Speculative decoding's drafts: the tokens a sequence proposes to verify in one pass with its
//! next token, and how many it proposes.
//!
//! A draft comes from text the sequence already holds, never from a second model:
//! - **a prediction** (OpenAI's "predicted outputs": `prediction: {type: "content", content}`),
//!   tokenized when the request is submitted and followed along as the output advances: while
//!   the output agrees with it, the draft is what comes next in it; after a mismatch the
//!   drafter re-synchronises by looking the output's last tokens up in the prediction;
//! - **prompt lookup**: the longest suffix of the context (n = [`MAX_NGRAM`] down to
//!   [`MIN_NGRAM`] tokens) found earlier in the context (prompt and output) proposes the tokens
//!   that followed it; of its occurrences, the one whose tokens before it agree with the
//!   context's furthest back (the text being copied), the most recent on a tie. A match of
//!   [`LONG_MATCH`] tokens or more drafts as far as a prediction on its track, a shorter one at
//!   most [`LOOKUP_MAX_DRAFT`]. Off the prediction's track, the longer of the two matches
//!   drafts (the prediction's on a tie): a reply that leaves the prediction to repeat itself is
//!   still drafted.
//!
//! Verification is the scheduler's and the request's (see `sched.rs`): every drafted row is a
//! logit row whose token is chosen as it would be without speculation (the argmax, or the
//! seeded draw of that position), and a draft token is accepted while it equals the token
//! chosen before it. For a greedy row that is the longest prefix equal to the argmax chain plus
//! the first corrected token; for a sampled row it is the standard speculative-sampling rule
//! for a deterministic draft (q = 1 on the draft token: accept with probability p(d), and on a
//! rejection the token drawn is a draw from the residual p without d, renormalised), with the
//! draw still seeded by (seed, position) ([`accept_reference`] is the general rule, for tests).
//!
//! **Adaptive**: the draft length follows the measured acceptance (doubled after a draft fully
//! accepted, cut to one more than what was accepted otherwise), and a sequence whose recent
//! acceptance (an exponential average over its drafting steps, a step without a proposal
//! counting as nothing accepted) falls below [`PAUSE_BELOW`] stops drafting for a while,
//! longer each time, so free text runs as without speculation. A paused sequence still probes:
//! when its last [`MAX_NGRAM`] tokens occur earlier it drafts [`PROBE`] token, and a probe
//! taken whole ends the pause, so a reply that turns to copying (a list written out again, a
//! loop) is drafted from there on, not after the pause.

/// Longest context suffix prompt lookup matches.
pub const MAX_NGRAM: usize = 3;
/// Shortest: a single token found earlier says too little about what follows (in free text
/// such drafts are mostly refused, and each costs a row).
pub const MIN_NGRAM: usize = 2;
/// Most draft tokens per sequence and step unless asked otherwise: the length a draft that
/// follows a prediction on its track may reach.
pub const DEFAULT_MAX_DRAFT: u32 = 15;
/// Most draft tokens a lookup proposes (prompt lookup, or a prediction found again after a
/// mismatch): a match of a few tokens says less about what follows than a prediction the output
/// agrees with.
pub const LOOKUP_MAX_DRAFT: u32 = 7;
/// Context tokens from which a lookup's match counts as text being copied: it drafts up to the
/// request's `max_draft` then, as a prediction on its track does, not [`LOOKUP_MAX_DRAFT`].
pub const LONG_MATCH: usize = 8;
/// Longest match a lookup measures ([`LONG_MATCH`] and the choice between occurrences).
const MAX_MATCH: usize = 32;
/// Most logit rows of decoding sequences (next tokens and drafts together) in one step: what a
/// verification step's logits may take (rows × vocabulary × 4 bytes).
pub const MAX_VERIFY_ROWS: u32 = 64;
/// Most draft tokens per sequence and step one may ask for.
pub const MAX_DRAFT_LIMIT: u32 = 31;
/// Below this average acceptance (accepted / proposed per drafting step) a sequence pauses.
pub const PAUSE_BELOW: f32 = 0.5;
/// Drafting steps a sequence makes before its average can pause it.
const WARMUP_STEPS: u32 = 1;
/// The average a sequence drafts again with after a pause (or a probe taken whole): one refused
/// draft pauses it again.
const RESUME_AVERAGE: f32 = 0.6;
/// The average from which a draft is likely taken whole: a step on the GPU is planned past a
/// draft in flight only then, since a cut draft discards the rows planned past it (a whole step
/// for a sequence alone).
const CONFIDENT: f32 = 0.75;
/// Weight of the newest step in the average.
const EMA_ALPHA: f32 = 0.3;
/// Decode steps of the first pause; each pause after it doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: u32 = 16;
const MAX_PAUSE: u32 = 512;
/// Draft tokens of a probe: a paused sequence whose context's last [`MAX_NGRAM`] tokens occur
/// earlier drafts this many, and a probe taken whole ends its pause.
const PROBE: u32 = 1;

/// Whether sequences draft (`speculative` in the package, `--speculative` in the CLI).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Speculative {
    /// Draft where the acceptance pays (adaptive, above).
    #[default]
    Auto,
    /// Never draft: one token per step.
    Off,
}

impl Speculative {
    /// Parses `auto` or `off`.
    pub fn parse(name: &str) -> Option<Speculative> {
        match name {
            "auto" => Some(Speculative::Auto),
            "off" => Some(Speculative::Off),
            _ => None,
        }
    }
}

/// Longest draft lengths a step takes: one less than a power of two, so that a sequence's
/// verification step has one of a few row counts (each row count is a GPU graph of its own).
pub fn quantize_draft(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        (1u32 << (32 - (n + 1).leading_zeros() - 1)) - 1
    }
}

/// One sequence's drafter: its prediction, where the output stands in it, and the adaptive
/// control of its draft length.
#[derive(Clone, Debug)]
pub struct Drafter {
    /// The prediction's tokens (empty: none).
    predicted: Vec<u32>,
    /// Where the output's next token is expected in `predicted` while they agree.
    cursor: Option<usize>,
    /// Whether prompt lookup drafts when the prediction has nothing.
    lookup: bool,
    /// The draft length to propose next (at most the request's limit).
    length: u32,
    max_draft: u32,
    /// Average acceptance over its drafting steps, and how many there were.
    average: f32,
    steps: u32,
    /// Decode steps left without drafting, and the next pause's length.
    paused: u32,
    /// Whether a paused sequence probes ([`PROBE`]).
    pub probe: bool,
    next_pause: u32,
    /// Draft tokens accepted and rejected so far (the usage's accepted/rejected prediction tokens).
    pub accepted: u32,
    pub rejected: u32,
}

impl Drafter {
    /// A drafter drafting at most `max_draft` tokens a step (0: none), from `predicted` (may be
    /// empty) and, with `lookup`, by prompt lookup.
    pub fn new(max_draft: u32, predicted: Vec<u32>, lookup: bool) -> Drafter {
        let cursor = (!predicted.is_empty()).then_some(0);
        Drafter {
            predicted,
            cursor,
            lookup,
            length: max_draft,
            max_draft,
            average: 1.0,
            steps: 0,
            paused: 0,
            probe: true,
            next_pause: FIRST_PAUSE,
            accepted: 0,
            rejected: 0,
        }
    }

    /// Whether it drafts at all and is not paused.
    pub fn active(&self) -> bool {
        self.drafts() && self.paused == 0
    }

    /// Whether it may propose a draft at the next step: it is not paused, or it probes while
    /// paused ([`PROBE`]).
    pub fn may_draft(&self) -> bool {
        self.drafts() && (self.paused == 0 || self.probe)
    }

    /// Whether a draft it proposed is likely taken whole: it is not paused (a probe is a guess)
    /// and its average acceptance is at least [`CONFIDENT`].
    pub fn confident(&self) -> bool {
        self.paused == 0 && self.average >= CONFIDENT
    }

    /// Whether it drafts at all (paused or not).
    fn drafts(&self) -> bool {
        self.max_draft > 0 && (self.lookup || !self.predicted.is_empty())
    }

    /// The draft for the token after `context` (the sequence's tokens, its pending one last), at
    /// most `limit` tokens and at most its adaptive length.
    pub fn propose(&self, context: &[u32], limit: u32) -> Vec<u32> {
        let probing = self.paused > 0;
        let n = if probing { limit.min(PROBE) } else { limit.min(self.length) } as usize;
        if !self.drafts() || (probing && !self.probe) || n == 0 || context.is_empty() {
            return Vec::new();
        }
        if let Some(c) = self.cursor {
            if c < self.predicted.len() {
                return self.predicted[c..].iter().take(n).copied().collect();
            }
        }
        // The longer match of the context's last tokens, in the prediction or (prompt lookup)
        // earlier in the context; the prediction on a tie.
        let in_prediction = lookup(&self.predicted, context, None);
        let last = context.len() - 1;
        let in_context = if self.lookup { lookup(&context[..last], context, Some(last)) } else { None };
        let (source, at, m) = match (in_prediction, in_context) {
            (Some((at, m)), c) if c.is_none_or(|(_, k)| m >= k) => (&self.predicted[..], at, m),
            (_, Some((at, m))) => (context, at, m),
            _ => return Vec::new(),
        };
        if probing && m < MAX_NGRAM {
            return Vec::new();
        }
        let cap = if m >= LONG_MATCH { self.max_draft } else { LOOKUP_MAX_DRAFT };
        source[at..].iter().take(n.min(cap as usize)).copied().collect()
    }

    /// Follows the prediction with a token the output took.
    pub fn advance(&mut self, token: u32) {
        self.cursor = match self.cursor {
            Some(c) if self.predicted.get(c) == Some(&token) => Some(c + 1),
            _ => None,
        };
    }

    /// After a decode step of its sequence: `proposed` draft tokens of which `accepted` were
    /// taken, `asked` when the step asked it for a draft (0 proposed then: nothing matched).
    /// Counts them, adapts the length and pauses a sequence whose drafts do not pay.
    pub fn record(&mut self, proposed: u32, accepted: u32, asked: bool) {
        if self.paused > 0 && proposed > 0 {
            self.accepted += accepted;
            self.rejected += proposed - accepted;
            if accepted == proposed {
                // A probe taken whole: the text copies again.
                self.paused = 0;
                self.average = RESUME_AVERAGE;
                self.steps = 0;
                self.length = self.max_draft.min(2 * PROBE);
                return;
            }
        }
        if self.paused > 0 {
            self.paused -= 1;
            if self.paused == 0 {
                self.average = RESUME_AVERAGE;
                self.steps = 0;
                self.length = self.max_draft.min(2);
            }
            return;
        }
        if !self.active() || !asked {
            return;
        }
        self.accepted += accepted;
        self.rejected += proposed - accepted;
        self.length = if proposed > 0 && accepted == proposed { (self.length * 2).clamp(1, self.max_draft) } else { (accepted + 1).min(self.max_draft) };
        let share = if proposed == 0 { 0.0 } else { accepted as f32 / proposed as f32 };
        self.average = EMA_ALPHA * share + (1.0 - EMA_ALPHA) * self.average;
        self.steps += 1;
        if self.steps >= WARMUP_STEPS && self.average < PAUSE_BELOW {
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
        }
    }
}

/// Where the tokens after the longest suffix of `context` (n = [`MAX_NGRAM`] down to
/// [`MIN_NGRAM`]) found in `source` start, and how long the match is: of that suffix's
/// occurrences (in `source` before `end`, when `source` is the context's own start, with a
/// continuation), the one whose match with the context's end reaches back furthest (up to
/// [`MAX_MATCH`] tokens), the most recent on a tie. A long match is text being copied: where
/// a short suffix occurs several times, the place the output copies from is the one whose
/// tokens before it agree too.
fn lookup(source: &[u32], context: &[u32], end: Option<usize>) -> Option<(usize, usize)> {
    // One scan for the shortest suffix: an occurrence of a longer one matches further back, so
    // the longest match is also the longest suffix's.
    let end = end.unwrap_or(source.len()).min(source.len());
    let n = MIN_NGRAM;
    if context.len() < n {
        return None;
    }
    let (before, suffix) = context.split_at(context.len() - n);
    let mut best: Option<(usize, usize)> = None;
    for i in (0..end.saturating_sub(n)).rev() {
        if source[i..i + n] != *suffix {
            continue;
        }
        let back = source[..i].iter().rev().zip(before.iter().rev()).take(MAX_MATCH - n).take_while(|(a, b)| a == b).count();
        if best.is_none_or(|(_, m)| n + back > m) {
            best = Some((i + n, n + back));
        }
        if n + back == MAX_MATCH {
            break;
        }
    }
    best
}

/// The standard speculative-sampling rule for one drafted row (Leviathan et al., Chen et al.):
/// the target's distribution `p`, the draft's `q` and its token `d`, a uniform `u` in [0, 1) for
/// the acceptance and one `v` for a resample. Accepts `d` when `u < min(1, p[d] / q[d])`; else
/// draws from the residual `max(0, p - q)` renormalised. Returns the token and whether it was
/// the draft. The engine's rule for deterministic drafts (q one-hot) draws from `p` and accepts
/// when the draw is `d`; this general form is its reference in tests.
pub fn accept_reference(p: &[f64], q: &[f64], d: usize, u: f64, v: f64) -> (usize, bool) {
    if q[d] > 0.0 && u < (p[d] / q[d]).min(1.0) {
        return (d, true);
    }
    let residual: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let z: f64 = residual.iter().sum();
    let mut cum = 0.0;
    for (t, r) in residual.iter().enumerate() {
        cum += r / z;
        if v < cum {
            return (t, false);
        }
    }
    (residual.iter().rposition(|&r| r > 0.0).unwrap_or(0), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{sample_row, SamplingParams};

    #[test]
    fn quantizes_draft_lengths_to_one_less_than_a_power_of_two() {
        let q: Vec<u32> = (0..=16).map(quantize_draft).collect();
        assert_eq!(q, vec![0, 1, 1, 3, 3, 3, 3, 7, 7, 7, 7, 7, 7, 7, 7, 15, 15]);
    }

    #[test]
    fn prompt_lookup_proposes_what_followed_the_longest_recent_match() {
        let d = Drafter::new(4, Vec::new(), true);
        // "1 2 3 4 5 ... 2 3" -> the 2-gram "2 3" matched, "4 5" follows.
        assert_eq!(d.propose(&[1, 2, 3, 4, 5, 9, 2, 3], 4), vec![4, 5, 9, 2]);
        // The most recent occurrence wins: "0 7" was followed by 8 then by 6.
        assert_eq!(d.propose(&[0, 7, 8, 0, 7, 6, 5, 0, 7], 2), vec![6, 5]);
        // Nothing matches, or only one token (shorter than MIN_NGRAM): no draft; a limit of 0: none.
        assert_eq!(d.propose(&[1, 2, 3], 4), Vec::<u32>::new());
        assert_eq!(d.propose(&[7, 8, 0, 7], 4), Vec::<u32>::new());
        assert_eq!(d.propose(&[1, 2, 1, 2], 0), Vec::<u32>::new());
        assert_eq!(Drafter::new(4, Vec::new(), false).propose(&[1, 2, 3, 1, 2], 4), Vec::<u32>::new(), "lookup off");
    }

    #[test]
    fn follows_a_prediction_and_resynchronises_after_a_mismatch() {
        let mut d = Drafter::new(3, vec![10, 11, 12, 13, 14, 15], false);
        assert_eq!(d.propose(&[1, 2], 8), vec![10, 11, 12], "from its start");
        for t in [10, 11] {
            d.advance(t);
        }
        assert_eq!(d.propose(&[1, 2, 10, 11], 8), vec![12, 13, 14]);
        // The output went its own way (99), then came back to 13 14: lookup finds it again.
        d.advance(99);
        assert_eq!(d.propose(&[1, 2, 10, 11, 99], 8), Vec::<u32>::new());
        d.advance(13);
        assert_eq!(d.propose(&[1, 2, 10, 11, 99, 13], 8), Vec::<u32>::new(), "one token is too short a match");
        d.advance(14);
        assert_eq!(d.propose(&[1, 2, 10, 11, 99, 13, 14], 8), vec![15]);
    }

    #[test]
    fn adapts_its_length_and_pauses_when_drafts_do_not_pay() {
        let mut d = Drafter::new(8, Vec::new(), true);
        d.record(8, 2, true);
        assert_eq!(d.length, 3, "one more than accepted");
        d.record(3, 3, true);
        assert_eq!(d.length, 6, "doubled after a full acceptance");
        assert_eq!((d.accepted, d.rejected), (5, 6));
        // Nothing accepted for a few steps: it pauses, then drafts again, and pauses longer.
        let mut steps = 0;
        while d.active() {
            d.record(1, 0, true);
            steps += 1;
            assert!(steps < 10);
        }
        for _ in 0..FIRST_PAUSE {
            assert!(!d.active());
            d.record(0, 0, true);
        }
        assert!(d.active(), "the pause ends");
        d.record(0, 0, false);
        assert_eq!((d.steps, d.accepted), (0, 5), "a step that asked for no draft counts for nothing");
        while d.active() {
            d.record(0, 0, true);
        }
        assert_eq!(d.paused, 2 * FIRST_PAUSE);
    }

    #[test]
    fn a_paused_drafter_probes_on_a_full_match_and_a_probe_taken_whole_ends_the_pause() {
        let mut d = Drafter::new(7, Vec::new(), true);
        d.paused = FIRST_PAUSE;
        assert!(!d.active() && d.may_draft());
        // The last 3 tokens (5 6 7) occur earlier: one token is probed; on a 2-token match, none.
        assert_eq!(d.propose(&[5, 6, 7, 8, 9, 1, 5, 6, 7], 7), vec![8]);
        assert_eq!(d.propose(&[5, 6, 7, 8, 9, 1, 2, 6, 7], 7), Vec::<u32>::new());
        d.record(1, 0, true);
        assert_eq!((d.paused, d.rejected), (FIRST_PAUSE - 1, 1), "a probe not taken: the pause goes on");
        d.record(1, 1, true);
        assert!(d.active(), "a probe taken whole ends the pause");
        assert_eq!(d.propose(&[5, 6, 7, 8, 9, 1, 5, 6, 7], 7), vec![8, 9], "and the draft grows from there");
        // Without probes (a constrained or penalized sequence), a paused drafter proposes nothing.
        let mut quiet = Drafter::new(7, Vec::new(), true);
        (quiet.paused, quiet.probe) = (FIRST_PAUSE, false);
        assert!(!quiet.may_draft());
        assert_eq!(quiet.propose(&[5, 6, 7, 8, 9, 1, 5, 6, 7], 7), Vec::<u32>::new());
    }

    #[test]
    fn a_lookup_takes_the_occurrence_the_output_copies_and_drafts_longer_on_a_long_match() {
        // "1 2" occurs twice before the end; the earlier one is preceded by 8 9, as the end is:
        // that is the text being copied, so its continuation (5) is drafted, not the most
        // recent one's (7).
        let d = Drafter::new(4, Vec::new(), true);
        assert_eq!(d.propose(&[8, 9, 1, 2, 5, 6, 3, 1, 2, 7, 8, 9, 1, 2], 2), vec![5, 6]);
        // A match shorter than LONG_MATCH drafts at most LOOKUP_MAX_DRAFT; one of LONG_MATCH
        // tokens or more drafts up to the request's limit.
        let source: Vec<u32> = (100..140).collect();
        let d = Drafter::new(DEFAULT_MAX_DRAFT, Vec::new(), true);
        let short = [source.clone(), vec![1], source[..LONG_MATCH - 1].to_vec()].concat();
        assert_eq!(d.propose(&short, DEFAULT_MAX_DRAFT), source[LONG_MATCH - 1..][..LOOKUP_MAX_DRAFT as usize].to_vec());
        let long = [source.clone(), vec![1], source[..LONG_MATCH].to_vec()].concat();
        assert_eq!(d.propose(&long, DEFAULT_MAX_DRAFT), source[LONG_MATCH..][..DEFAULT_MAX_DRAFT as usize].to_vec());
    }

    #[test]
    fn the_longer_match_wins_between_the_prediction_and_the_context() {
        // The prediction matches the last two tokens (6 7) only; the context the last three.
        let mut d = Drafter::new(4, vec![6, 7, 40, 41], true);
        d.advance(1);
        let context = [5, 6, 7, 8, 9, 5, 6, 7];
        assert_eq!(d.propose(&context, 4), vec![8, 9, 5, 6]);
        // On a tie the prediction wins.
        assert_eq!(d.propose(&[1, 6, 7, 2, 6, 7], 4), vec![40, 41]);
    }

    /// The engine's rule (draw from p with the row's sampler, accept when the draw is the draft)
    /// gives each token with the probability the reference rule does, for a one-hot draft, on
    /// fixed logits: both are exactly p.
    #[test]
    fn the_sampled_rule_matches_the_reference_acceptance_rule() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, 1.5];
        let params = SamplingParams { temperature: 0.8, top_k: 0, top_p: 1.0, seed: 5, ..Default::default() };
        let z: f64 = logits.iter().map(|&l| (l as f64 / 0.8).exp()).sum();
        let p: Vec<f64> = logits.iter().map(|&l| (l as f64 / 0.8).exp() / z).collect();
        let n = 40_000u32;
        for d in [0usize, 3] {
            let q: Vec<f64> = (0..p.len()).map(|t| if t == d { 1.0 } else { 0.0 }).collect();
            let (mut ours, mut reference) = (vec![0u32; p.len()], vec![0u32; p.len()]);
            let (mut ours_accepted, mut ref_accepted) = (0u32, 0u32);
            for c in 0..n {
                let t = sample_row(&params, &mut logits.to_vec(), &[], c) as usize;
                ours[t] += 1;
                ours_accepted += (t == d) as u32;
                let u = crate::rng::counter_u24(11, c) as f64 / (1u64 << 24) as f64;
                let v = crate::rng::counter_u24(12, c) as f64 / (1u64 << 24) as f64;
                let (r, accepted) = accept_reference(&p, &q, d, u, v);
                reference[r] += 1;
                ref_accepted += accepted as u32;
            }
            // Both match p within 5 standard deviations, and accept the draft equally often.
            for t in 0..p.len() {
                let sd = (p[t] * (1.0 - p[t]) / n as f64).sqrt();
                for (name, counts) in [("ours", &ours), ("reference", &reference)] {
                    let f = counts[t] as f64 / n as f64;
                    assert!((f - p[t]).abs() < 5.0 * sd + 1e-9, "{name}: draft {d} token {t}: {f} vs {}", p[t]);
                }
            }
            let sd = (p[d] * (1.0 - p[d]) / n as f64).sqrt() * n as f64;
            assert!((ours_accepted as f64 - ref_accepted as f64).abs() < 7.0 * sd, "accepted {ours_accepted} vs {ref_accepted}");
        }
        // A non-trivial draft distribution: the reference keeps p (its defining property).
        let q = [0.1, 0.5, 0.2, 0.1, 0.1];
        let mut counts = vec![0u32; p.len()];
        for c in 0..n {
            let u = crate::rng::counter_u24(21, c) as f64 / (1u64 << 24) as f64;
            let v = crate::rng::counter_u24(22, c) as f64 / (1u64 << 24) as f64;
            let w = crate::rng::counter_u24(23, c) as f64 / (1u64 << 24) as f64;
            // The draft token itself drawn from q.
            let d = q
                .iter()
                .scan(0.0, |s, &x| {
                    *s += x;
                    Some(*s)
                })
                .position(|s| w < s)
                .unwrap_or(4);
            counts[accept_reference(&p, &q, d, u, v).0] += 1;
        }
        for t in 0..p.len() {
            let sd = (p[t] * (1.0 - p[t]) / n as f64).sqrt();
            assert!((counts[t] as f64 / n as f64 - p[t]).abs() < 5.0 * sd, "token {t}");
        }
    }
}
