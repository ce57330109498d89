//! Rotary position embedding (RoPE), and the ways models stretch it past the context they were
//! trained on: frequency factors (Llama 3's `rope_freqs`, Phi-3's long and short factors),
//! linear interpolation and YaRN.

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` rotate together (GGML's "normal" mode: Llama, Mistral).
    Interleaved,
    /// Dimension `i` rotates with `i + rope_dim / 2` (GPT-NeoX: Qwen, Phi-3, Gemma).
    Halves,
}

/// How the layers that attend globally stretch RoPE beyond the original training context
/// (`rope.scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every position is divided by `factor` (position interpolation).
    Linear {
        factor: f32,
    },
    /// YaRN (Peng et al., 2023): the pairs that turn more than `beta_fast` times over the original
    /// context keep their frequency, those that turn fewer than `beta_slow` times are divided by
    /// `factor`, with a linear ramp between; cosines and sines grow by `1 + 0.1 ln(factor)`.
    Yarn {
        factor: f32,
        beta_fast: f32,
        beta_slow: f32,
    },
}

/// What one [`Rope`] is made of.
#[derive(Debug, Clone, Copy)]
pub struct RopeParams<'a> {
    pub style: RopeStyle,
    pub base: f32,
    /// Number of leading dimensions of each head that rotate.
    pub rope_dim: usize,
    pub head_dim: usize,
    /// Divides the frequency of each rotated pair.
    pub freq_factors: Option<&'a [f32]>,
    pub scaling: RopeScaling,
    /// The context the model was trained on before it was stretched (YaRN's ramp depends on it).
    pub original_context: usize,
    /// Multiplies every cosine and sine (`rope.scaling.attn_factor`; Phi-3's long-context
    /// attention factor).
    pub attn_factor: f32,
}

/// Rotary position embedding: pair `i` of the first `rope_dim` dimensions of each head (which
/// dimensions pair up is the [`RopeStyle`]) rotates by `pos * inv_freq[i]`, where `inv_freq[i]`
/// is `base^(-2i / rope_dim) / freq_factor[i]` as the [`RopeScaling`] stretches it. The cosines
/// and sines of a position are computed once per step ([`Rope::angles`]) and applied to every
/// head of every layer ([`Rope::apply`]).
pub struct Rope {
    style: RopeStyle,
    inv_freq: Vec<f32>,
    /// Multiplies the cosines and sines.
    magnitude: f32,
    head_dim: usize,
}

impl Rope {
    pub fn new(p: RopeParams<'_>) -> Self {
        let pairs = p.rope_dim / 2;
        let (factor, ramp) = match p.scaling {
            RopeScaling::None => (1.0, None),
            RopeScaling::Linear { factor } => (factor, None),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
            } => {
                let ramp = YarnRamp::new(&p, beta_fast, beta_slow);
                (factor, Some(ramp))
            }
        };
        let inv_freq = (0..pairs)
            .map(|i| {
                let kept = p.base.powf(-((2 * i) as f32) / p.rope_dim as f32)
                    / p.freq_factors.map_or(1.0, |factors| factors[i]);
                let stretched = kept / factor;
                match &ramp {
                    None => stretched,
                    Some(ramp) => {
                        let keep = ramp.keep(i);
                        stretched * (1.0 - keep) + kept * keep
                    }
                }
            })
            .collect();
        let yarn_magnitude = match ramp {
            Some(_) if factor > 1.0 => 1.0 + 0.1 * factor.ln(),
            _ => 1.0,
        };
        Rope {
            style: p.style,
            inv_freq,
            magnitude: p.attn_factor * yarn_magnitude,
            head_dim: p.head_dim,
        }
    }

    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// The angle per position of each rotated pair (`rope_dim / 2` of them).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// What the cosines and sines are multiplied by.
    pub fn magnitude(&self) -> f32 {
        self.magnitude
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Floats of one position's angles: a cosine and a sine per rotated pair.
    pub fn angles_len(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// Writes the cosine and sine of each rotated pair at `pos` to `out`
    /// ([`Rope::angles_len`] floats).
    pub fn angles(&self, pos: usize, out: &mut [f32]) {
        for (cs, &inv_freq) in out.chunks_exact_mut(2).zip(&self.inv_freq) {
            let (sin, cos) = (pos as f32 * inv_freq).sin_cos();
            cs[0] = cos * self.magnitude;
            cs[1] = sin * self.magnitude;
        }
    }

    /// [`Rope::angles`] of each of `positions`, one after the other in `out`
    /// (`positions.len() * angles_len` floats).
    pub fn angles_of(&self, positions: &[u32], out: &mut [f32]) {
        let len = self.angles_len();
        for (&pos, out) in positions.iter().zip(out.chunks_exact_mut(len)) {
            self.angles(pos as usize, out);
        }
    }

    /// Rotates every head of `x` (one row of `n_heads * head_dim` values) by `angles`, from
    /// [`Rope::angles`] of the row's position.
    pub fn apply(&self, x: &mut [f32], angles: &[f32]) {
        let half = self.inv_freq.len();
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (pair, cs) in head.chunks_exact_mut(2).zip(angles.chunks_exact(2)) {
                        (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                    }
                }
                RopeStyle::Halves => {
                    let (low, high) = head[..2 * half].split_at_mut(half);
                    for ((a, b), cs) in low.iter_mut().zip(high).zip(angles.chunks_exact(2)) {
                        (*a, *b) = rotate(*a, *b, cs);
                    }
                }
            }
        }
    }
}

/// YaRN's blend of kept and stretched frequencies: pairs up to `low` keep theirs, pairs from
/// `high` on are stretched, linearly between (as transformers' `_compute_yarn_parameters` and
/// ggml's `rope_yarn`).
struct YarnRamp {
    low: f32,
    high: f32,
}

impl YarnRamp {
    fn new(p: &RopeParams<'_>, beta_fast: f32, beta_slow: f32) -> Self {
        let dims = p.rope_dim as f32;
        // The pair index whose frequency turns `turns` times over the original context.
        let pair_turning = |turns: f32| {
            let wavelength = p.original_context as f32 / (turns * 2.0 * std::f32::consts::PI);
            dims * wavelength.ln() / (2.0 * p.base.ln())
        };
        YarnRamp {
            low: pair_turning(beta_fast).floor().max(0.0),
            high: pair_turning(beta_slow).ceil().min(dims - 1.0),
        }
    }

    /// How much of pair `i`'s own frequency it keeps: 1 up to `low`, 0 from `high`.
    fn keep(&self, i: usize) -> f32 {
        let t = (i as f32 - self.low) / (self.high - self.low).max(0.001);
        1.0 - t.clamp(0.0, 1.0)
    }
}

/// `(a, b)` rotated by the angle whose cosine and sine are `cs`.
#[inline(always)]
fn rotate(a: f32, b: f32, cs: &[f32]) -> (f32, f32) {
    (a * cs[0] - b * cs[1], a * cs[1] + b * cs[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(style: RopeStyle, rope_dim: usize, head_dim: usize) -> RopeParams<'static> {
        RopeParams {
            style,
            base: 10_000.0,
            rope_dim,
            head_dim,
            freq_factors: None,
            scaling: RopeScaling::None,
            original_context: 4096,
            attn_factor: 1.0,
        }
    }

    /// The cosines and sines of `pos`, as (cos, sin) pairs.
    fn angles(rope: &Rope, pos: usize) -> Vec<(f32, f32)> {
        let mut out = vec![0.0; rope.angles_len()];
        rope.angles(pos, &mut out);
        out.chunks_exact(2).map(|cs| (cs[0], cs[1])).collect()
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let rope = Rope::new(params(RopeStyle::Interleaved, 4, 4));
        let mut angles = vec![0.0; rope.angles_len()];
        let mut x = [1.0, 0.0, 0.0, 1.0];
        rope.angles(0, &mut angles);
        rope.apply(&mut x, &angles);
        assert_eq!(x, [1.0, 0.0, 0.0, 1.0]);
        rope.angles(1, &mut angles);
        rope.apply(&mut x, &angles);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let theta = 10_000f32.powf(-0.5);
        assert!((x[2] + theta.sin()).abs() < 1e-6 && (x[3] - theta.cos()).abs() < 1e-6);
    }

    #[test]
    fn rope_in_halves_pairs_i_with_i_plus_half() {
        let rope = Rope::new(params(RopeStyle::Halves, 4, 6));
        let mut angles = vec![0.0; rope.angles_len()];
        rope.angles(1, &mut angles);
        // Two heads of 6; the last 2 dimensions of each are not rotated.
        let mut x = [1.0, 0.0, 0.0, 1.0, 7.0, 8.0, 0.0, 2.0, 0.0, 0.0, 9.0, 9.0];
        rope.apply(&mut x, &angles);
        let theta = 10_000f32.powf(-0.5);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        // Pair (0, 2) turns by 1 radian, pair (1, 3) by theta.
        assert!(close(x[0], 1f32.cos()) && close(x[2], 1f32.sin()));
        assert!(close(x[1], -theta.sin()) && close(x[3], theta.cos()));
        assert_eq!(&x[4..6], &[7.0, 8.0]);
        assert!(close(x[7], 2.0 * theta.cos()) && close(x[9], 2.0 * theta.sin()));
        assert_eq!(&x[10..], &[9.0, 9.0]);
    }

    /// transformers' `_compute_yarn_parameters` (modeling_rope_utils.py), in f64: the inverse
    /// frequencies and the attention factor.
    fn hf_yarn(base: f64, dim: usize, factor: f64, original: f64) -> (Vec<f64>, f64) {
        let (beta_fast, beta_slow) = (32.0, 1.0);
        let correction_dim = |turns: f64| {
            (dim as f64 * (original / (turns * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * base.ln())
        };
        let low = correction_dim(beta_fast).floor().max(0.0);
        let high = correction_dim(beta_slow).ceil().min(dim as f64 - 1.0);
        let high = if low == high { high + 0.001 } else { high };
        let inv_freq = (0..dim / 2)
            .map(|i| {
                let pos_freq = base.powf((2 * i) as f64 / dim as f64);
                let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
            })
            .collect();
        (inv_freq, 0.1 * factor.ln() + 1.0)
    }

    #[test]
    fn yarn_matches_the_reference_formula() {
        // Qwen2.5's YaRN settings (factor 4 over 32768 positions), and a small original
        // context whose ramp covers most pairs.
        for (base, dim, factor, original) in [(1e6, 128, 4.0, 32768), (1e4, 64, 8.0, 256)] {
            let rope = Rope::new(RopeParams {
                base: base as f32,
                scaling: RopeScaling::Yarn {
                    factor: factor as f32,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                },
                original_context: original,
                ..params(RopeStyle::Halves, dim, dim)
            });
            let (inv_freq, magnitude) = hf_yarn(base, dim, factor, original as f64);
            // The ramp must be inside the rotated pairs for the test to mean something.
            assert!(inv_freq.first() == Some(&1.0));
            assert!(
                (inv_freq[dim / 2 - 1] * factor - base.powf(-(dim as f64 - 2.0) / dim as f64))
                    .abs()
                    < 1e-12
            );
            for pos in [0, 1, 17, 1000, 100_000] {
                for (i, (cos, sin)) in angles(&rope, pos).into_iter().enumerate() {
                    let theta = pos as f64 * inv_freq[i];
                    let tolerance = 2e-6 * (1.0 + theta.abs() * 1e-1);
                    assert!(
                        (cos as f64 - theta.cos() * magnitude).abs() < tolerance
                            && (sin as f64 - theta.sin() * magnitude).abs() < tolerance,
                        "pos {pos} pair {i}: ({cos}, {sin}) for theta {theta}"
                    );
                }
            }
        }
    }

    #[test]
    fn frequency_factors_and_attention_factor_follow_long_rope() {
        // transformers' LongRoPE: inv_freq = 1 / (factor[i] * base^(2i/dim)), cosines and
        // sines times the attention factor.
        let factors: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 * 0.75).collect();
        let attn_factor = 1.19;
        let rope = Rope::new(RopeParams {
            freq_factors: Some(&factors),
            attn_factor,
            ..params(RopeStyle::Halves, 16, 16)
        });
        for pos in [1, 5, 300] {
            for (i, (cos, sin)) in angles(&rope, pos).into_iter().enumerate() {
                let inv_freq = 1.0 / (factors[i] as f64 * 10_000f64.powf((2 * i) as f64 / 16.0));
                let theta = pos as f64 * inv_freq;
                let magnitude = attn_factor as f64;
                assert!((cos as f64 - theta.cos() * magnitude).abs() < 1e-5);
                assert!((sin as f64 - theta.sin() * magnitude).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn linear_scaling_divides_positions() {
        let plain = Rope::new(params(RopeStyle::Interleaved, 8, 8));
        let linear = Rope::new(RopeParams {
            scaling: RopeScaling::Linear { factor: 4.0 },
            ..params(RopeStyle::Interleaved, 8, 8)
        });
        assert_eq!(angles(&linear, 40), angles(&plain, 10));
    }
}
