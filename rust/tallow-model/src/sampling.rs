//! Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p.

use crate::error::ModelError;

/// Sampling parameters and the random state of one request.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    rng: Xoshiro256,
}

impl Sampler {
    /// `temperature` 0 means greedy (argmax); `top_k` 0 and `top_p` 1 switch those filters off.
    pub fn new(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Result<Self, ModelError> {
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(ModelError::InvalidArgument(format!(
                "temperature must be a finite number >= 0, got {temperature}"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ModelError::InvalidArgument(format!(
                "top_p must be in (0, 1], got {top_p}"
            )));
        }
        Ok(Sampler {
            temperature,
            top_k,
            top_p,
            rng: Xoshiro256::seeded(seed),
        })
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        if logits.is_empty() {
            return Err(ModelError::InvalidArgument(
                "no logits to sample from".into(),
            ));
        }
        if self.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        let mut candidates: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (l / self.temperature, i as u32))
            .collect();
        if candidates.is_empty() {
            return Err(ModelError::InvalidArgument("every logit is NaN".into()));
        }
        let by_logit_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
        if self.top_k > 0 && self.top_k < candidates.len() {
            candidates.select_nth_unstable_by(self.top_k - 1, by_logit_desc);
            candidates.truncate(self.top_k);
        }
        candidates.sort_unstable_by(by_logit_desc);

        let max = candidates[0].0;
        let mut probs: Vec<f32> = candidates.iter().map(|c| (c.0 - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.top_p < 1.0 {
            let mut cumulative = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    cumulative += p;
                    cumulative >= self.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut target = self.rng.next_f32() * total;
        for (p, c) in probs.iter().zip(&candidates) {
            if target < *p {
                return Ok(c.1);
            }
            target -= p;
        }
        Ok(candidates[probs.len() - 1].1)
    }
}

/// Index of the largest logit (the first one on ties), ignoring NaN.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
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

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(0.0, 0, 1.0, 1).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(1.5, 1, 1.0, 7).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 0.2, 5.0, 4.9]).unwrap(), 2);
        }
    }

    #[test]
    fn top_p_drops_the_tail() {
        // probabilities ~[0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps the first two
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(1.0, 0, 0.8, 3).unwrap();
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[s.sample(&logits).unwrap() as usize] += 1;
        }
        assert!(seen[0] > 1300 && seen[1] > 300, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [1.0f32, 0.0, 2.0];
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        let mut s = Sampler::new(1.0, 0, 1.0, 11).unwrap();
        let n = 20_000;
        let mut seen = [0usize; 3];
        for _ in 0..n {
            seen[s.sample(&logits).unwrap() as usize] += 1;
        }
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
    fn same_seed_same_choices() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(0.9, 40, 0.95, seed).unwrap();
            (0..20)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn bad_parameters_are_rejected() {
        assert!(Sampler::new(-1.0, 0, 1.0, 0).is_err());
        assert!(Sampler::new(f32::NAN, 0, 1.0, 0).is_err());
        assert!(Sampler::new(1.0, 0, 0.0, 0).is_err());
        assert!(Sampler::new(1.0, 0, 1.5, 0).is_err());
    }
}
