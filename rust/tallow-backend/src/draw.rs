//! Drawing a row's token from its logits with temperature, top-k, min-p and top-p, by one rule
//! that the host and a device's kernels both follow. Each filter keeps the tokens whose value
//! reaches a threshold (no sorted list, which a device would have to build), and the draw is
//! the Gumbel-max of the kept tokens: the largest `logit / temperature + g`, where `g` is
//! Gumbel noise that hashes the draw's seed with the token's index. That picks each kept token
//! with its softmax probability among them, and needs no random state shared between a
//! device's threads: a device and the host draw the same token from the same logits and seed
//! (they may part only where two tokens' noisy values, or a filter's sum, tie to the last bit).

use crate::output::argmax;

/// How one row's token is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// Divides the logits; 0 is greedy (the row's [`argmax`], the filters and seed unused).
    pub temperature: f32,
    /// Keep the tokens whose value is at least the `top_k`-th largest (all of a tie at that
    /// value); 0 keeps all.
    pub top_k: u32,
    /// Keep the tokens before which the more likely tokens (of those the other filters keep)
    /// hold less than `top_p` of the probability; 1 keeps all.
    pub top_p: f32,
    /// Keep the tokens at least `min_p` times as likely as the most likely; 0 keeps all.
    pub min_p: f32,
    /// The seed of the noise.
    pub seed: u64,
}

impl Draw {
    /// The greedy choice.
    pub const GREEDY: Draw = Draw {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
    };

    /// Whether the token is the row's argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// What is wrong with the parameters, if anything: a temperature that is not a finite
    /// number >= 0, a `top_p` outside (0, 1] or a `min_p` outside [0, 1].
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }

    /// The six 32-bit words a device's kernel reads for the row: the temperature, `top_k`,
    /// `top_p` and `min_p` (floats as their bits), then the seed's low and high halves.
    pub fn words(&self) -> [u32; 6] {
        [
            self.temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.seed as u32,
            (self.seed >> 32) as u32,
        ]
    }
}

/// The Gumbel noise of token `token` under `seed`: `-ln(-ln(u))` of a uniform `u` in (0, 1)
/// made of 23 bits of a splitmix64 hash of the two (the kernels compute the same).
pub fn noise(seed: u64, token: u32) -> f32 {
    let mut z = seed ^ (u64::from(token) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // Exact in f32: a 23-bit integer plus a half, times 2^-23.
    let u = ((z >> 41) as f32 + 0.5) * (1.0 / 8_388_608.0);
    -(-u.ln()).ln()
}

/// Whether a logit may be drawn: neither NaN nor -inf (a banned token).
fn drawable(l: f32) -> bool {
    !l.is_nan() && l != f32::NEG_INFINITY
}

/// The token `d` draws from `logits`; `None` where every logit is NaN or -inf. A greedy draw
/// is the [`argmax`]; otherwise the token is, of the [`candidates`], the one with the largest
/// `logit / temperature +` [`noise`], the first on ties.
pub fn draw(logits: &[f32], d: &Draw) -> Option<u32> {
    if d.is_greedy() {
        return logits.iter().any(|&l| drawable(l)).then(|| argmax(logits));
    }
    let score = |&(i, _): &(u32, f32)| (logits[i as usize] / d.temperature + noise(d.seed, i), i);
    let first_largest = |a: (f32, u32), b: (f32, u32)| {
        if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
            b
        } else {
            a
        }
    };
    let candidates = candidates(logits, d);
    candidates
        .iter()
        .map(score)
        .reduce(first_largest)
        .map(|(_, i)| i)
}

/// The tokens a draw at `d`'s temperature may take (empty where every logit is NaN or -inf),
/// each with its weight `exp(s - m)`, `s = logit / temperature` and `m` the largest `s`: its
/// probability times their sum. Kept are the tokens with `s` at least the `top_k`-th largest,
/// with `exp(s - m) >= min_p`, and, of those, the ones before which the tokens of larger `s`
/// hold less than `top_p` of their weight. A logit of +inf is the argmax's choice alone, and
/// so is a row whose values all overflow to -inf (a temperature near 0), which no filter
/// keeps.
pub fn candidates(logits: &[f32], d: &Draw) -> Vec<(u32, f32)> {
    let mut kept: Vec<(f32, u32)> = (logits.iter().enumerate())
        .filter(|&(_, &l)| drawable(l))
        .map(|(i, &l)| (l / d.temperature, i as u32))
        .collect();
    let m = kept.iter().fold(f32::NEG_INFINITY, |m, &(s, _)| m.max(s));
    if m == f32::INFINITY {
        return vec![(argmax(logits), 1.0)];
    }
    let k = d.top_k as usize;
    if k > 0 && k < kept.len() {
        let by_value_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
        let kth = kept.select_nth_unstable_by(k - 1, by_value_desc).1 .0;
        kept.retain(|&(s, _)| s >= kth);
    }
    let mut weighted: Vec<(u32, f32)> = (kept.iter())
        .map(|&(s, i)| (i, (s - m).exp()))
        .filter(|&(_, w)| w >= d.min_p)
        .collect();
    if d.top_p < 1.0 {
        // Larger values first; ties (equal values) are kept or dropped together.
        let value = |i: u32| logits[i as usize] / d.temperature;
        weighted.sort_unstable_by(|a, b| value(b.0).total_cmp(&value(a.0)).then(a.0.cmp(&b.0)));
        let target = d.top_p * weighted.iter().map(|&(_, w)| w).sum::<f32>();
        let (mut before, mut mass, mut keep) = (0.0f32, 0.0f32, 0);
        while keep < weighted.len() {
            let (token, w) = weighted[keep];
            if keep > 0 && value(token) != value(weighted[keep - 1].0) {
                before = mass;
            }
            if before >= target {
                break;
            }
            mass += w;
            keep += 1;
        }
        weighted.truncate(keep);
    }
    if weighted.is_empty() && !kept.is_empty() {
        return vec![(argmax(logits), 1.0)];
    }
    weighted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> Draw {
        Draw {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 0,
        }
    }

    /// How often each token is drawn over `n` seeds.
    fn counts(logits: &[f32], d: Draw, n: u64) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for seed in 0..n {
            let token = draw(logits, &Draw { seed, ..d }).unwrap();
            counts[token as usize] += 1;
        }
        counts
    }

    #[test]
    fn the_noise_is_gumbel() {
        // Mean: the Euler-Mascheroni constant; variance pi^2 / 6.
        let n = 200_000;
        let g: Vec<f64> = (0..n).map(|i| f64::from(noise(7, i))).collect();
        let mean = g.iter().sum::<f64>() / f64::from(n);
        let var = g.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / f64::from(n);
        assert!((mean - 0.5772).abs() < 0.01, "{mean}");
        assert!((var - 1.6449).abs() < 0.03, "{var}");
        assert_ne!(noise(7, 3), noise(8, 3));
    }

    #[test]
    fn draws_follow_the_softmax_of_the_kept_tokens() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 2.0];
        let n = 40_000;
        for (d, kept) in [
            (sampling(1.0, 0, 1.0, 0.0), vec![0, 1, 2, 3, 4]),
            (sampling(0.5, 0, 1.0, 0.0), vec![0, 1, 2, 3, 4]),
            // The two largest values (a tie) and the next one.
            (sampling(1.0, 3, 1.0, 0.0), vec![0, 1, 4]),
            // exp(s - m) >= 0.3: e^-1 = 0.37 is kept, e^-1.5 = 0.22 is not.
            (sampling(1.0, 0, 1.0, 0.3), vec![0, 1, 4]),
            // The tie holds 0.76 of the mass: 0.8 needs the next value too.
            (sampling(1.0, 0, 0.8, 0.0), vec![0, 1, 4]),
            (sampling(1.0, 0, 0.5, 0.0), vec![1, 4]),
        ] {
            let got = counts(&logits, d, n);
            let weights: Vec<f64> = (0..logits.len())
                .map(|i| match kept.contains(&i) {
                    true => (f64::from(logits[i]) / f64::from(d.temperature)).exp(),
                    false => 0.0,
                })
                .collect();
            let total: f64 = weights.iter().sum();
            for (i, (&c, w)) in got.iter().zip(&weights).enumerate() {
                let (want, freq) = (w / total, c as f64 / n as f64);
                assert!(
                    (freq - want).abs() < 0.01,
                    "{d:?} token {i}: {freq} vs {want}"
                );
            }
        }
    }

    #[test]
    fn greedy_and_single_token_filters_take_the_argmax() {
        let logits = [0.3f32, 4.0, f32::NAN, 4.0, -2.0];
        assert_eq!(draw(&logits, &Draw::GREEDY), Some(1));
        for d in [
            sampling(1.0, 1, 1.0, 0.0),
            sampling(1.0, 0, 1e-6, 0.0),
            sampling(0.01, 0, 1.0, 0.0),
        ] {
            // A tie at the top: either of the two, never another.
            for seed in 0..200 {
                let token = draw(&logits, &Draw { seed, ..d }).unwrap();
                assert!(token == 1 || token == 3, "{d:?}: {token}");
            }
        }
        let one = [0.3f32, 4.0, 1.0];
        assert_eq!(counts(&one, sampling(1.0, 0, 1.0, 1.0), 100)[1], 100);
    }

    #[test]
    fn banned_and_nan_tokens_are_never_drawn() {
        let logits = [f32::NEG_INFINITY, 0.0, f32::NAN, -0.5];
        let got = counts(&logits, sampling(2.0, 0, 1.0, 0.0), 2000);
        assert_eq!((got[0], got[2]), (0, 0));
        assert!(got[1] > 0 && got[3] > 0);
        assert_eq!(draw(&[f32::NAN, f32::NEG_INFINITY], &Draw::GREEDY), None);
        let d = sampling(1.0, 0, 1.0, 0.0);
        assert_eq!(draw(&[f32::NEG_INFINITY; 3], &d), None);
        assert_eq!(draw(&[0.0, f32::INFINITY, 1.0], &d), Some(1));
        // Values that all overflow to -inf (or to +inf) at a temperature near 0: the argmax.
        for top_p in [1.0, 0.5] {
            let tiny = sampling(1e-38, 0, top_p, 0.0);
            assert_eq!(draw(&[-10.0, -20.0, f32::NAN], &tiny), Some(0));
            assert_eq!(draw(&[-10.0, 20.0, 30.0], &tiny), Some(2));
        }
    }

    #[test]
    fn a_seed_draws_the_same_token() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
        let d = Draw {
            seed: 99,
            ..sampling(0.8, 50, 0.9, 0.01)
        };
        let first = draw(&logits, &d);
        assert!((0..5).all(|_| draw(&logits, &d) == first));
        let others: Vec<Option<u32>> = (0..20)
            .map(|seed| draw(&logits, &Draw { seed, ..d }))
            .collect();
        assert!(others.iter().any(|&t| t != first), "{others:?}");
    }

    #[test]
    fn bad_parameters_are_named() {
        for d in [
            sampling(-1.0, 0, 1.0, 0.0),
            sampling(f32::NAN, 0, 1.0, 0.0),
            sampling(1.0, 0, 0.0, 0.0),
            sampling(1.0, 0, 1.5, 0.0),
            sampling(1.0, 0, 1.0, -0.1),
        ] {
            assert!(d.check().is_err(), "{d:?}");
        }
        assert!(sampling(0.7, 40, 0.95, 0.05).check().is_ok());
    }
}
