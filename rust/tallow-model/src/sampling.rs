//! Choosing the next token from logits, per request: penalties and logit bias, the tokens a
//! constraint on the output allows, then greedy or seeded sampling with temperature, top-k,
//! top-p and min-p (each draw [`tallow_backend::draw`]'s, so that a device that draws a
//! request's tokens itself draws the same ones); optionally the log
//! probabilities of the chosen and the most likely tokens. A batch of rows is sampled in
//! parallel, each row with its own request's parameters and random state, so a request's
//! output does not depend on what else is in the batch.

use std::borrow::Cow;
use std::collections::HashMap;

use rayon::prelude::*;
use tallow_backend::{argmax, draw, Draw};
use tallow_grammar::Constraint;

use crate::error::ModelError;

/// How one request picks its tokens. The defaults change nothing: greedy, no filters, no
/// penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps
    /// all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen before; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted from a logit once per earlier occurrence of its token.
    pub frequency_penalty: f32,
    /// Subtracted from the logit of every token that occurred before.
    pub presence_penalty: f32,
    /// Added to the logits of the given tokens (-inf bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
    /// Report the log probability of each chosen token (a log-sum-exp over the vocabulary per
    /// token, so only when asked).
    pub logprobs: bool,
    /// How many of the most likely tokens to report with their log probabilities (implies
    /// `logprobs`).
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            logprobs: false,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    fn validate(&self) -> Result<(), ModelError> {
        let bad = |what: String| Err(ModelError::InvalidArgument(what));
        if let Err(what) = self.draw().check() {
            return bad(what);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(format!(
                "repetition_penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !v.is_finite() {
                return bad(format!("{name} must be finite, got {v}"));
            }
        }
        if let Some((id, b)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return bad(format!("logit_bias for token {id} is NaN ({b})"));
        }
        Ok(())
    }

    /// The parameters of this request's draws, with no seed.
    fn draw(&self) -> Draw {
        Draw {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            seed: 0,
        }
    }
}

/// The outcome of sampling one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log probability of `token` under the model (log-softmax of the raw logits); NaN unless
    /// the parameters ask for log probabilities.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens and their log probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What an output may write before its answer: a reasoning block (`<think>` ... `</think>`),
/// or gpt-oss's messages before its final channel (`...<|channel|>final<|message|>`). What it
/// reasons is free of the constraint on the output, which applies to the answer after it, and
/// a budget of tokens closes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    /// The token that opens the block (where the prompt did not).
    pub start: u32,
    /// The tokens that end it: the answer starts once the output ends with them.
    pub end: Vec<u32>,
    /// What closes the block when its budget is spent, chosen token by token in place of the
    /// model's (it ends with `end`).
    pub close: Vec<u32>,
    /// The most tokens the block may hold before `close` is chosen.
    pub budget: Option<usize>,
    /// Whether the prompt opened the block already (the output starts inside it); otherwise
    /// the output opens one if its first token is `start`.
    pub opened: bool,
}

/// Where the output stands with its reasoning block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// Before the first token: it may open the block.
    Before,
    /// Inside, with this many tokens so far.
    Inside(usize),
    /// After the block, or the output did not open one: the answer.
    After,
}

/// Sampling parameters, random state and token history of one request.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256,
    /// Occurrences of each token so far (for the penalties).
    counts: HashMap<u32, u32>,
    /// What the output must match, where the request constrains it.
    constraint: Option<Constraint>,
    /// The output's reasoning block, where it may have one, where the output stands, and
    /// its last tokens inside the block (as many as the block's `end` has).
    reasoning: Option<(Reasoning, Block, Vec<u32>)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, ModelError> {
        params.validate()?;
        Ok(Sampler {
            rng: Xoshiro256::seeded(params.seed),
            params,
            counts: HashMap::new(),
            constraint: None,
            reasoning: None,
        })
    }

    /// This sampler, for an output that may reason in a block first (see [`Reasoning`]).
    pub fn with_reasoning(mut self, reasoning: Reasoning) -> Self {
        let block = if reasoning.opened {
            Block::Inside(0)
        } else {
            Block::Before
        };
        self.reasoning = Some((reasoning, block, Vec::new()));
        self
    }

    /// Whether the output is inside its reasoning block (or may still open one).
    pub fn is_reasoning(&self) -> bool {
        matches!(
            self.reasoning,
            Some((_, Block::Before | Block::Inside(_), _))
        )
    }

    /// This sampler, choosing only tokens that `constraint` allows (and advancing it with
    /// each token chosen), from the first token it samples.
    pub fn with_constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Whether a constraint limits the tokens this sampler chooses.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records tokens for the penalties (the generated ones; prompt tokens too if wanted).
    pub fn accept(&mut self, tokens: &[u32]) {
        for &t in tokens {
            *self.counts.entry(t).or_insert(0) += 1;
        }
    }

    /// Picks a token from one row of logits and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Result<Sampled, ModelError> {
        check_row(logits)?;
        let adjusted = self.adjusted(logits)?;
        let token = self.choose(&adjusted)?;
        self.record(logits, token)
    }

    /// The token chosen from adjusted logits: their argmax, or a draw with the next seed.
    fn choose(&mut self, adjusted: &[f32]) -> Result<u32, ModelError> {
        if self.params.temperature == 0.0 {
            return Ok(argmax(adjusted));
        }
        let d = self.next_draw();
        draw(adjusted, &d).ok_or_else(every_token_banned)
    }

    /// How this sampler draws its next token, its seed taken from the random state (as
    /// [`Sampler::sample`] takes it): what a device needs to draw it
    /// ([`crate::Output::Draw`]), for a sampler that [`Sampler::draws_on_device`].
    pub fn next_draw(&mut self) -> Draw {
        let d = self.params.draw();
        match d.is_greedy() {
            true => Draw::GREEDY,
            false => Draw {
                seed: self.rng.next_u64(),
                ..d
            },
        }
    }

    /// Verifies tokens a proposer guessed after the last token (speculative decoding, the
    /// rule of Leviathan et al. and Chen et al., 2023), so that the tokens returned follow
    /// exactly the distribution [`Sampler::sample`] would give, one by one.
    ///
    /// `rows` holds `draft.len() + 1` rows of `n_vocab` logits: row `i` is the model's
    /// prediction after the draft's first `i` tokens. `draft_probs`, when given, holds for
    /// each draft token the distribution it was drawn from (`draft.len()` rows); without it
    /// every draft token counts as proposed with certainty (a lookup). Draft token `i` is
    /// accepted with probability `min(1, p(d) / q(d))`; at the first rejection a token is
    /// drawn from the residual `max(0, p - q)` (normalized) instead and verification stops;
    /// when all are accepted, a last token is drawn from the final row. Greedy requests keep
    /// draft tokens while they equal the argmax. A constrained sampler rejects a draft token
    /// its constraint does not allow. Returns the accepted tokens then that last one, each
    /// recorded as [`Sampler::sample`] records its token.
    pub fn verify(
        &mut self,
        rows: &[f32],
        n_vocab: usize,
        draft: &[u32],
        draft_probs: Option<&[f32]>,
    ) -> Result<Vec<Sampled>, ModelError> {
        let k = draft.len();
        if n_vocab == 0 || rows.len() != (k + 1) * n_vocab {
            return Err(ModelError::InvalidArgument(format!(
                "{} logits are not {} rows of {n_vocab}",
                rows.len(),
                k + 1
            )));
        }
        if let Some(q) = draft_probs {
            if q.len() != k * n_vocab {
                return Err(ModelError::InvalidArgument(format!(
                    "{} draft probabilities are not {k} rows of {n_vocab}",
                    q.len()
                )));
            }
        }
        if let Some(&bad) = draft.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { id: bad, n_vocab });
        }
        let mut out = Vec::with_capacity(k + 1);
        for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
            check_row(row)?;
            let adjusted = self.adjusted(row)?;
            let proposed = draft.get(i).copied();
            let token = match proposed {
                Some(d) if self.params.temperature != 0.0 => {
                    let (candidates, total) = self.candidates(&adjusted)?;
                    let q = draft_probs.map(|q| &q[i * n_vocab..(i + 1) * n_vocab]);
                    let p_d = candidates
                        .iter()
                        .find(|c| c.0 == d)
                        .map_or(0.0, |c| c.1 / total);
                    let q_d = q.map_or(1.0, |q| q[d as usize]);
                    // Accept with probability min(1, p/q): u * q < p, u uniform in [0, 1).
                    if self.rng.next_f32() * q_d < p_d {
                        d
                    } else {
                        self.pick_residual(&candidates, total, d, q)
                    }
                }
                // Greedy, or past the draft: as `sample` chooses.
                _ => self.choose(&adjusted)?,
            };
            out.push(self.record(row, token)?);
            if proposed != Some(token) {
                break;
            }
        }
        Ok(out)
    }

    /// Whether this sampler's choice from a row is drawn from the raw logits and nothing more:
    /// no penalty, bias or constraint that changes them, no reasoning budget and no log
    /// probability that needs them. Its tokens can then be drawn on the device
    /// ([`crate::Output::Draw`], with [`Sampler::next_draw`]).
    pub fn draws_on_device(&self) -> bool {
        let p = &self.params;
        !self.changes_logits()
            && !self.is_constrained()
            && self
                .reasoning
                .as_ref()
                .is_none_or(|(r, ..)| r.budget.is_none())
            && !p.logprobs
            && p.top_logprobs == 0
    }

    /// Whether this sampler's choice from a row is the row's [`argmax`] and nothing more: a
    /// greedy sampler that [`Sampler::draws_on_device`].
    pub fn is_plain_greedy(&self) -> bool {
        self.params.temperature == 0.0 && self.draws_on_device()
    }

    /// Whether penalties or a logit bias change the logits before a token is chosen.
    fn changes_logits(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0
            || p.frequency_penalty != 0.0
            || p.presence_penalty != 0.0
            || !p.logit_bias.is_empty()
    }

    /// [`Sampler::verify`] (or, with no draft, [`Sampler::sample`]) for a sampler that
    /// [`Sampler::draws_on_device`], given only the tokens the device drew from each row: for a
    /// greedy one, each row's argmax (the draft's tokens while they equal the argmax, then the
    /// argmax where they part, or after the last); for one that samples, the one token drawn
    /// with its [`Sampler::next_draw`] (a draft is verified on the host, from the logits).
    /// Records them; their log probabilities are NaN, as when none are asked for.
    pub fn take_drawn(&mut self, drawn: &[u32], draft: &[u32]) -> Result<Vec<Sampled>, ModelError> {
        if !self.draws_on_device() {
            return Err(ModelError::InvalidArgument(
                "only a sampler with no penalties, bias, constraint or log probabilities takes \
                 the device's tokens"
                    .into(),
            ));
        }
        if self.params.temperature != 0.0 && !draft.is_empty() {
            return Err(ModelError::InvalidArgument(
                "a sampled request's draft is verified from its logits, not from drawn tokens"
                    .into(),
            ));
        }
        if drawn.len() != draft.len() + 1 {
            return Err(ModelError::InvalidArgument(format!(
                "{} drawn tokens for a draft of {}: expected one more",
                drawn.len(),
                draft.len()
            )));
        }
        let mut out = Vec::with_capacity(drawn.len());
        for (i, &token) in drawn.iter().enumerate() {
            out.push(self.record(&[], token)?);
            if draft.get(i) != Some(&token) {
                break;
            }
        }
        Ok(out)
    }

    /// Draws a token to propose from one row of logits (a draft model's), with this
    /// sampler's parameters and random state but without recording it; returns it with the
    /// distribution it was drawn from (`logits.len()` probabilities; one-hot when greedy).
    /// A constraint does not apply: it has not seen the tokens drafted before this one (the
    /// target's verification rejects what it does not allow).
    pub fn draft(&mut self, logits: &[f32]) -> Result<(u32, Vec<f32>), ModelError> {
        check_row(logits)?;
        let adjusted = self.penalized(logits);
        let mut q = vec![0.0; logits.len()];
        let token = if self.params.temperature == 0.0 {
            let token = argmax(&adjusted);
            q[token as usize] = 1.0;
            token
        } else {
            let (candidates, total) = self.candidates(&adjusted)?;
            for &(t, w) in &candidates {
                q[t as usize] = w / total;
            }
            self.pick(&candidates, total)
        };
        Ok((token, q))
    }

    /// The logits after the penalties and the logit bias, with the tokens the constraint does
    /// not allow next set to -inf. Inside a reasoning block the constraint waits (before it,
    /// the block's opening token is allowed beside what the constraint allows), and a block
    /// that has spent its budget can only close.
    fn adjusted<'l>(&mut self, logits: &'l [f32]) -> Result<Cow<'l, [f32]>, ModelError> {
        let penalized = self.penalized(logits);
        match &self.reasoning {
            Some((r, Block::Inside(used), _)) => {
                let closing = r.budget.and_then(|budget| used.checked_sub(budget));
                if let Some(&token) = closing.and_then(|i| r.close.get(i)) {
                    let mut forced = vec![f32::NEG_INFINITY; penalized.len()];
                    if let Some(slot) = forced.get_mut(token as usize) {
                        *slot = 0.0;
                    }
                    return Ok(Cow::Owned(forced));
                }
                Ok(penalized)
            }
            Some((r, Block::Before, _)) => {
                let start = r.start as usize;
                let Some(constraint) = &mut self.constraint else {
                    return Ok(penalized);
                };
                let opening = penalized.get(start).copied();
                let mut masked = penalized.into_owned();
                constraint.mask(&mut masked)?;
                if let (Some(value), Some(slot)) = (opening, masked.get_mut(start)) {
                    *slot = value;
                }
                Ok(Cow::Owned(masked))
            }
            None | Some((_, Block::After, _)) => {
                let Some(constraint) = &mut self.constraint else {
                    return Ok(penalized);
                };
                let mut masked = penalized.into_owned();
                constraint.mask(&mut masked)?;
                Ok(Cow::Owned(masked))
            }
        }
    }

    /// Moves the reasoning block on past `token`; whether the constraint takes `token` (the
    /// answer's tokens only).
    fn advance_block(&mut self, token: u32) -> bool {
        let Some((r, block, recent)) = &mut self.reasoning else {
            return true;
        };
        *block = match *block {
            Block::Before if token == r.start => Block::Inside(0),
            Block::Before | Block::After => Block::After,
            Block::Inside(used) => {
                recent.push(token);
                if recent.len() > r.end.len() {
                    recent.remove(0);
                }
                if *recent == r.end {
                    *block = Block::After;
                    return false;
                }
                Block::Inside(used + 1)
            }
        };
        *block == Block::After
    }

    /// The logits after the penalties for the tokens seen so far and the logit bias.
    fn penalized<'l>(&self, logits: &'l [f32]) -> Cow<'l, [f32]> {
        if !self.changes_logits() {
            // Nothing to change: no copy of a whole vocabulary's row.
            return Cow::Borrowed(logits);
        }
        let p = &self.params;
        let mut adjusted = logits.to_vec();
        for (&token, &count) in &self.counts {
            let Some(l) = adjusted.get_mut(token as usize) else {
                continue;
            };
            if p.repetition_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
        for &(token, bias) in &p.logit_bias {
            if let Some(l) = adjusted.get_mut(token as usize) {
                *l += bias;
            }
        }
        Cow::Owned(adjusted)
    }

    /// Records `token` (advancing the constraint) and, if asked for, its log probabilities
    /// under the raw `logits`.
    fn record(&mut self, logits: &[f32], token: u32) -> Result<Sampled, ModelError> {
        if self.advance_block(token) {
            if let Some(constraint) = &mut self.constraint {
                constraint.accept(token)?;
            }
        }
        self.accept(&[token]);
        let p = &self.params;
        let (logprob, top) = if p.logprobs || p.top_logprobs > 0 {
            logprobs(logits, token, p.top_logprobs)
        } else {
            (f32::NAN, Vec::new())
        };
        Ok(Sampled {
            token,
            logprob,
            top,
        })
    }

    /// The tokens a draw can pick after temperature, top-k, min-p and top-p (the rule of
    /// [`tallow_backend::candidates`], which [`Sampler::sample`]'s draws follow), with weights
    /// summing to the returned total.
    fn candidates(&self, logits: &[f32]) -> Result<(Vec<(u32, f32)>, f32), ModelError> {
        let weighted = tallow_backend::candidates(logits, &self.params.draw());
        if weighted.is_empty() {
            return Err(every_token_banned());
        }
        let total = weighted.iter().map(|&(_, w)| w).sum();
        Ok((weighted, total))
    }

    /// A seeded draw among `candidates` (weights summing to `total`).
    fn pick(&mut self, candidates: &[(u32, f32)], total: f32) -> u32 {
        let mut target = self.rng.next_f32() * total;
        for &(token, q) in candidates {
            if target < q {
                return token;
            }
            target -= q;
        }
        candidates[candidates.len() - 1].0
    }

    /// A draw from `max(0, p - q)`, `p` the candidates' distribution and `q` the draft's
    /// (`None`: all of it on `drafted`).
    fn pick_residual(
        &mut self,
        candidates: &[(u32, f32)],
        total: f32,
        drafted: u32,
        q: Option<&[f32]>,
    ) -> u32 {
        let residual: Vec<(u32, f32)> = candidates
            .iter()
            .map(|&(t, w)| {
                let q_t = match q {
                    Some(q) => q[t as usize],
                    None => f32::from(u8::from(t == drafted)),
                };
                (t, (w / total - q_t).max(0.0))
            })
            .collect();
        let mass: f32 = residual.iter().map(|r| r.1).sum();
        if mass > 0.0 {
            self.pick(&residual, mass)
        } else {
            // p <= q everywhere only when they are equal up to rounding: then p itself.
            self.pick(candidates, total)
        }
    }
}

fn every_token_banned() -> ModelError {
    ModelError::InvalidArgument("every token is banned or NaN".into())
}

fn check_row(logits: &[f32]) -> Result<(), ModelError> {
    if logits.is_empty() {
        return Err(ModelError::InvalidArgument(
            "no logits to sample from".into(),
        ));
    }
    Ok(())
}

/// Samples every row of `logits` (`samplers.len()` rows of `n_vocab`) with its own sampler,
/// in parallel. A row that cannot be sampled (its constraint failed, every token banned) is
/// an error of that row alone.
pub fn sample_batch(
    samplers: &mut [&mut Sampler],
    logits: &[f32],
    n_vocab: usize,
) -> Result<Vec<Result<Sampled, ModelError>>, ModelError> {
    if n_vocab == 0 || logits.len() != samplers.len() * n_vocab {
        return Err(ModelError::InvalidArgument(format!(
            "{} logits are not {} rows of {n_vocab}",
            logits.len(),
            samplers.len()
        )));
    }
    Ok(samplers
        .par_iter_mut()
        .zip(logits.par_chunks_exact(n_vocab))
        .map(|(sampler, row)| sampler.sample(row))
        .collect())
}

/// The log probability of `token` and the `n` most likely tokens with theirs, from raw logits.
fn logprobs(logits: &[f32], token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_total = max
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        let mut indexed: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i as u32))
            .collect();
        let n = n.min(indexed.len());
        let by_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        indexed.select_nth_unstable_by(n - 1, by_desc);
        indexed.truncate(n);
        indexed.sort_unstable_by(by_desc);
        top = indexed.iter().map(|&(l, i)| (i, l - log_total)).collect();
    }
    (logits[token as usize] - log_total, top)
}

/// xoshiro256** seeded through splitmix64: small, fast and reproducible across platforms.
#[derive(Debug, Clone)]
struct Xoshiro256([u64; 4]);

impl Xoshiro256 {
    fn seeded(seed: u64) -> Self {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Xoshiro256([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params).unwrap()
    }

    fn sampling(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        sampler(SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
            ..SamplingParams::default()
        })
    }

    fn counts(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut seen = vec![0; logits.len()];
        for _ in 0..n {
            seen[s.sample(logits).unwrap().token as usize] += 1;
        }
        seen
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = sampling(0.0, 0, 1.0, 1);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).unwrap().token, 1);
    }

    #[test]
    fn device_argmax_takes_what_verify_takes() {
        let n_vocab = 6;
        let rows: Vec<f32> = (0..4 * n_vocab).map(|i| ((i * 7) % 11) as f32).collect();
        let argmaxes: Vec<u32> = rows.chunks_exact(n_vocab).map(argmax).collect();
        for draft in [vec![], argmaxes[..3].to_vec(), vec![argmaxes[0], 5, 0]] {
            let rows = &rows[..(draft.len() + 1) * n_vocab];
            let want = sampling(0.0, 0, 1.0, 1).verify(rows, n_vocab, &draft, None);
            let got = sampling(0.0, 0, 1.0, 1).take_drawn(&argmaxes[..=draft.len()], &draft);
            let tokens = |s: Vec<Sampled>| s.iter().map(|s| s.token).collect::<Vec<_>>();
            assert_eq!(tokens(got.unwrap()), tokens(want.unwrap()), "{draft:?}");
        }
        let mut biased = sampler(SamplingParams {
            logit_bias: vec![(1, 2.0)],
            ..SamplingParams::default()
        });
        assert!(!biased.is_plain_greedy() && !biased.draws_on_device());
        assert!(biased.take_drawn(&[0], &[]).is_err());
        let mut sampled = sampling(1.0, 0, 1.0, 1);
        assert!(!sampled.is_plain_greedy() && sampled.draws_on_device());
        assert!(sampled.take_drawn(&[0, 1], &[0]).is_err());
        assert!(sampling(0.0, 0, 1.0, 1).take_drawn(&[0, 1], &[]).is_err());
    }

    #[test]
    fn verifying_no_draft_takes_what_sample_takes() {
        let rows: Vec<f32> = (0..30 * 20).map(|i| ((i * 11) % 23) as f32 / 5.0).collect();
        let (mut sampled, mut verified) = (sampling(0.9, 8, 0.95, 3), sampling(0.9, 8, 0.95, 3));
        for row in rows.chunks_exact(20) {
            let want = sampled.sample(row).unwrap().token;
            let got = verified.verify(row, 20, &[], None).unwrap();
            assert_eq!(got.iter().map(|s| s.token).collect::<Vec<_>>(), [want]);
        }
    }

    #[test]
    fn device_draws_take_what_sample_takes() {
        // A device draws with `next_draw`'s parameters what `sample` draws, step after step.
        let n_vocab = 50;
        let rows: Vec<Vec<f32>> = (0..40)
            .map(|r| {
                (0..n_vocab)
                    .map(|i| ((i * 13 + r * 7) % 17) as f32 / 4.0)
                    .collect()
            })
            .collect();
        for (temperature, top_k, top_p) in [(1.0, 0, 1.0), (0.7, 10, 0.9), (0.0, 0, 1.0)] {
            let mut host = sampling(temperature, top_k, top_p, 42);
            let mut device = sampling(temperature, top_k, top_p, 42);
            assert!(device.draws_on_device());
            let sampled: Vec<u32> = rows.iter().map(|r| host.sample(r).unwrap().token).collect();
            let drawn: Vec<u32> = (rows.iter())
                .map(|r| {
                    let token = draw(r, &device.next_draw()).unwrap();
                    device.take_drawn(&[token], &[]).unwrap()[0].token
                })
                .collect();
            assert_eq!(drawn, sampled, "temperature {temperature}");
            if temperature > 0.0 {
                let distinct: std::collections::HashSet<_> = sampled.iter().collect();
                assert!(distinct.len() > 3, "{sampled:?}");
            }
        }
    }

    #[test]
    fn a_reasoning_block_closes_when_its_budget_is_spent() {
        // Token 2 is always the most likely; 0 opens the block and 1 closes it.
        let logits = [0.0f32, -1.0, 3.0, 1.0];
        let block = |budget, opened| Reasoning {
            start: 0,
            end: vec![1],
            close: vec![1],
            budget,
            opened,
        };
        let tokens = |s: &mut Sampler, n: usize| -> Vec<u32> {
            (0..n).map(|_| s.sample(&logits).unwrap().token).collect()
        };
        // Opened by the prompt: three tokens, then the close, then free again.
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(Some(3), true));
        assert!(s.is_reasoning() && !s.is_plain_greedy());
        assert_eq!(tokens(&mut s, 4), [2, 2, 2, 1]);
        assert!(!s.is_reasoning());
        assert_eq!(tokens(&mut s, 3), [2, 2, 2]);
        // A budget of nothing closes the block at once, sampling or not.
        let mut s = sampling(1.0, 0, 1.0, 5).with_reasoning(block(Some(0), true));
        assert_eq!(tokens(&mut s, 1), [1]);
        // Not opened by the prompt: a first token other than the opening means no block.
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(Some(1), false));
        assert!(s.is_reasoning());
        assert_eq!(tokens(&mut s, 3), [2, 2, 2]);
        assert!(!s.is_reasoning());
        // Without a budget the block lasts as long as the model reasons.
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(None, true));
        assert!(s.is_plain_greedy());
        assert_eq!(tokens(&mut s, 5), [2; 5]);
        assert!(s.is_reasoning());
        // Greedy choices taken from the device follow the block too.
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(None, false));
        let taken: Vec<u32> = (s.take_drawn(&[0], &[]).unwrap().into_iter())
            .chain(s.take_drawn(&[1], &[]).unwrap())
            .map(|t| t.token)
            .collect();
        assert_eq!(taken, [0, 1]);
        assert!(!s.is_reasoning());
    }

    #[test]
    fn a_block_may_end_with_several_tokens_and_close_with_more() {
        // As gpt-oss: the answer starts after [4, 5] (`<|channel|>final<|message|>`), and a
        // spent budget closes with [3, 4, 5] (`<|end|>` first).
        let block = |budget| Reasoning {
            start: 0,
            end: vec![4, 5],
            close: vec![3, 4, 5],
            budget,
            opened: true,
        };
        let row = |token: usize| -> Vec<f32> {
            let mut row = vec![0.0f32; 6];
            row[token] = 5.0;
            row
        };
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(Some(2)));
        let got: Vec<u32> = (0..6).map(|_| s.sample(&row(2)).unwrap().token).collect();
        assert_eq!(got, [2, 2, 3, 4, 5, 2]);
        assert!(!s.is_reasoning());
        // The model's own: a partial end is not the end.
        let mut s = sampling(0.0, 0, 1.0, 1).with_reasoning(block(None));
        for (token, reasoning) in [(4, true), (2, true), (4, true), (5, false)] {
            assert_eq!(s.sample(&row(token)).unwrap().token, token as u32);
            assert_eq!(s.is_reasoning(), reasoning, "after {token}");
        }
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = sampling(1.5, 1, 1.0, 7);
        assert_eq!(counts(&mut s, &[0.0, 0.2, 5.0, 4.9], 50), [0, 0, 50, 0]);
    }

    #[test]
    fn top_p_drops_the_tail() {
        // probabilities ~[0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps the first two
        let seen = counts(&mut sampling(1.0, 0, 0.8, 3), &[3.0, 2.0, 1.0, 0.0], 2000);
        assert!(seen[0] > 1300 && seen[1] > 300, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // relative probabilities 1, e^-1 = 0.37, e^-2 = 0.14, e^-3 = 0.05: min_p 0.2 keeps two
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            seed: 9,
            ..SamplingParams::default()
        });
        let seen = counts(&mut s, &[3.0, 2.0, 1.0, 0.0], 2000);
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [1.0f32, 0.0, 2.0];
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        let n = 20_000;
        let seen = counts(&mut sampling(1.0, 0, 1.0, 11), &logits, n);
        for (i, &l) in logits.iter().enumerate() {
            let expected = l.exp() / total;
            let got = seen[i] as f32 / n as f32;
            assert!(
                (got - expected).abs() < 0.015,
                "token {i}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn penalties_and_bias_change_greedy_choices() {
        let logits = [2.0, 1.5, -1.0];
        let mut s = sampler(SamplingParams {
            presence_penalty: 1.0,
            ..SamplingParams::default()
        });
        // 0 wins, then is penalised below 1, then 1 is penalised too and 0 wins again.
        let picks: Vec<u32> = (0..3).map(|_| s.sample(&logits).unwrap().token).collect();
        assert_eq!(picks, [0, 1, 0]);

        let mut s = sampler(SamplingParams {
            frequency_penalty: 0.3,
            ..SamplingParams::default()
        });
        let picks: Vec<u32> = (0..3).map(|_| s.sample(&logits).unwrap().token).collect();
        assert_eq!(picks, [0, 0, 1]); // 2.0 -> 1.7 -> 1.4 < 1.5

        let mut s = sampler(SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        });
        s.accept(&[0]);
        assert_eq!(s.sample(&logits).unwrap().token, 1); // 2.0 / 2 = 1.0 < 1.5

        let mut s = sampler(SamplingParams {
            logit_bias: vec![(2, 5.0), (0, f32::NEG_INFINITY)],
            ..SamplingParams::default()
        });
        assert_eq!(s.sample(&logits).unwrap().token, 2);
    }

    #[test]
    fn banned_tokens_are_never_sampled() {
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(0, f32::NEG_INFINITY)],
            seed: 4,
            ..SamplingParams::default()
        });
        assert_eq!(counts(&mut s, &[5.0, 0.0, 0.0], 500)[0], 0);
    }

    #[test]
    fn logprobs_are_log_softmax_of_the_raw_logits() {
        let logits = [1.0f32, 3.0, 2.0];
        let lse = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        let mut s = sampler(SamplingParams {
            top_logprobs: 2,
            ..SamplingParams::default()
        });
        let out = s.sample(&logits).unwrap();
        assert_eq!(out.token, 1);
        assert!((out.logprob - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert!((out.top[1].1 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn a_request_samples_the_same_whatever_else_is_in_the_batch() {
        let n_vocab = 50;
        let row = |k: usize| -> Vec<f32> {
            (0..n_vocab)
                .map(|i| ((i * 7 + k * 3) as f32 * 0.13).sin())
                .collect()
        };
        let params = |seed| SamplingParams {
            temperature: 0.9,
            top_k: 20,
            seed,
            ..SamplingParams::default()
        };
        let mut alone = Sampler::new(params(42)).unwrap();
        let solo: Vec<u32> = (0..10)
            .map(|_| alone.sample(&row(0)).unwrap().token)
            .collect();

        let mut a = Sampler::new(params(42)).unwrap();
        let mut others: Vec<Sampler> = (0..5).map(|s| Sampler::new(params(s)).unwrap()).collect();
        let mut batched = Vec::new();
        for _ in 0..10 {
            let mut rows = row(0);
            for k in 1..=others.len() {
                rows.extend(row(k));
            }
            let mut all: Vec<&mut Sampler> = std::iter::once(&mut a).collect();
            all.extend(others.iter_mut());
            let first = sample_batch(&mut all, &rows, n_vocab)
                .unwrap()
                .swap_remove(0);
            batched.push(first.unwrap().token);
        }
        assert_eq!(solo, batched);
        assert!(sample_batch(&mut [&mut a], &row(0)[..10], n_vocab).is_err());
    }

    #[test]
    fn same_seed_same_choices() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = sampling(0.9, 40, 0.95, seed);
            (0..20)
                .map(|_| s.sample(&logits).unwrap().token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn greedy_verification_keeps_draft_tokens_while_they_are_the_argmax() {
        let n = 8;
        let one_hot =
            |t: usize| -> Vec<f32> { (0..n).map(|i| if i == t { 2.0 } else { 0.0 }).collect() };
        let rows: Vec<f32> = [5, 3, 7].iter().flat_map(|&t| one_hot(t)).collect();
        let tokens = |draft: &[u32]| -> Vec<u32> {
            let mut s = sampling(0.0, 0, 1.0, 1);
            let rows = &rows[..(draft.len() + 1) * n];
            s.verify(rows, n, draft, None)
                .unwrap()
                .iter()
                .map(|x| x.token)
                .collect()
        };
        assert_eq!(tokens(&[5, 3]), [5, 3, 7]); // all accepted, then the bonus token
        assert_eq!(tokens(&[5, 1]), [5, 3]); // the second is corrected
        assert_eq!(tokens(&[4, 3]), [5]);
        assert_eq!(tokens(&[]), [5]);
        let mut s = sampling(0.0, 0, 1.0, 1);
        assert!(s.verify(&rows[..2 * n], n, &[5, 3], None).is_err());
        assert!(s.verify(&rows[..2 * n], n, &[9], None).is_err());
        assert!(s.verify(&rows[..2 * n], n, &[5], Some(&[0.5; 3])).is_err());
    }

    /// Draws the first two tokens of a "model" whose logits at position i are `target[i]`
    /// whatever came before, the way the engine does: propose, verify, repeat.
    fn speculate_two(
        seed: u64,
        target: &[Vec<f32>],
        draft: &[Vec<f32>],
        with_probs: bool,
    ) -> (u32, u32) {
        let n = target[0].len();
        let params = |seed| SamplingParams {
            temperature: 1.0,
            seed,
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params(seed)).unwrap();
        let mut proposer = Sampler::new(params(seed ^ 0xdead_beef)).unwrap();
        let mut out = Vec::new();
        while out.len() < 2 {
            let pos = out.len();
            let k = 2 - pos;
            let (mut proposed, mut q) = (Vec::new(), Vec::new());
            for row in &draft[pos..pos + k] {
                let (t, probs) = proposer.draft(row).unwrap();
                proposed.push(t);
                q.extend(probs);
            }
            let rows: Vec<f32> = target[pos..=pos + k].concat();
            let q = with_probs.then_some(&q[..]);
            let got = sampler.verify(&rows, n, &proposed, q).unwrap();
            out.extend(got.iter().map(|s| s.token));
        }
        (out[0], out[1])
    }

    #[test]
    fn speculative_sampling_follows_the_target_distribution() {
        let target = vec![
            vec![1.0f32, 0.2, -0.5, 0.8],
            vec![-1.0, 0.5, 0.0, 1.5],
            vec![0.3, 0.0, 0.0, 0.1],
        ];
        // A draft that disagrees with the target: rejections and residual draws happen often.
        let draft = vec![vec![-1.0f32, 2.0, 1.0, -2.0], vec![1.0, 0.0, 0.0, -1.0]];
        let softmax = |l: &[f32]| -> Vec<f64> {
            let total: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
            l.iter().map(|&x| (x as f64).exp() / total).collect()
        };
        let (p0, p1) = (softmax(&target[0]), softmax(&target[1]));
        let trials = 40_000;
        for with_probs in [true, false] {
            let mut seen = [[0usize; 4]; 4];
            for seed in 0..trials {
                let (a, b) = speculate_two(seed, &target, &draft, with_probs);
                seen[a as usize][b as usize] += 1;
            }
            // Pearson's chi-square against p0 x p1 over 16 cells (15 degrees of freedom):
            // 37.7 is the 0.1% critical value.
            let mut chi2 = 0.0;
            for (a, row) in seen.iter().enumerate() {
                for (b, &count) in row.iter().enumerate() {
                    let expected = trials as f64 * p0[a] * p1[b];
                    chi2 += (count as f64 - expected).powi(2) / expected;
                }
            }
            assert!(
                chi2 < 37.7,
                "chi-square {chi2} (draft probabilities: {with_probs}) {seen:?}"
            );
        }
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let with = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            Sampler::new(p).is_err()
        };
        assert!(with(|p| p.temperature = -1.0));
        assert!(with(|p| p.temperature = f32::NAN));
        assert!(with(|p| p.top_p = 0.0));
        assert!(with(|p| p.top_p = 1.5));
        assert!(with(|p| p.min_p = 2.0));
        assert!(with(|p| p.repetition_penalty = 0.0));
        assert!(with(|p| p.frequency_penalty = f32::INFINITY));
        assert!(with(|p| p.logit_bias = vec![(1, f32::NAN)]));
        assert!(!with(|p| p.logit_bias = vec![(1, f32::NEG_INFINITY)]));
    }
}
