//! The parameters of a transformer's operations that differ between architectures.

/// The function of the gate in a gated feed-forward block: `down(act(gate) * up)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU, Gemma).
    GeluTanh,
    /// gpt-oss's experts: `g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)`, `g = min(gate, 7)`.
    /// Backends that run experts run it ([`crate::Capabilities::experts`]).
    ClampedSwiglu,
}

/// How a mixture-of-experts layer turns a token's router logits (one per expert) into the
/// experts it runs and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// The `top_k` largest logits, their softmax among themselves (Mixtral, Qwen 3 MoE: the
    /// same as a softmax over all experts renormalized over the chosen ones).
    TopKSoftmax,
    /// A softmax over all experts; the `top_k` largest probabilities as they are, summing to
    /// less than 1 (Qwen 2 MoE).
    SoftmaxTopK,
}

/// A mixture-of-experts feed-forward block: `top_k` experts per token, chosen and weighted by
/// `routing`, each a gated feed-forward with `activation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    pub top_k: usize,
    pub routing: Routing,
    pub activation: Activation,
}

impl Routing {
    /// The experts of one token and their weights, largest logit first (ties to the lower
    /// index), from its router `logits`: `chosen` and `weights` are `top_k` long. Every
    /// backend routes as this does; the CPU calls it.
    pub fn route(&self, logits: &[f32], chosen: &mut [u32], weights: &mut [f32]) {
        let k = chosen.len();
        debug_assert!(k <= logits.len() && weights.len() == k);
        // Insertion into the k best so far: k is small (2 to 8) and so are the experts.
        let mut n = 0;
        for (e, &l) in logits.iter().enumerate() {
            let mut at = n;
            while at > 0 && logits[chosen[at - 1] as usize] < l {
                at -= 1;
            }
            if at == k {
                continue;
            }
            let end = (n + 1).min(k);
            chosen.copy_within(at..end - 1, at + 1);
            chosen[at] = e as u32;
            n = end;
        }
        let max = logits[chosen[0] as usize];
        let exp = |l: f32| (l - max).exp();
        let total: f32 = match self {
            Routing::TopKSoftmax => chosen.iter().map(|&e| exp(logits[e as usize])).sum(),
            Routing::SoftmaxTopK => logits.iter().map(|&l| exp(l)).sum(),
        };
        for (w, &e) in weights.iter_mut().zip(chosen.iter()) {
            *w = exp(logits[e as usize]) / total;
        }
    }
}

/// The shape of a model's attention: query heads, the KV heads they share (grouped-query
/// attention) and the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

impl Heads {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Floats of one token's queries.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Floats of one token's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// How a layer turns query-key products into weights: causal softmax attention over scaled
/// scores, maybe soft-capped, maybe within a sliding window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// Multiplies every query-key product.
    pub scale: f32,
    /// Scores go through `cap * tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A token sees only the last `window` positions, itself included (sliding-window layers).
    pub window: Option<usize>,
}

impl Scores {
    /// Plain causal attention for heads of `head_dim`.
    pub fn plain(head_dim: usize) -> Scores {
        Scores {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }

    /// The first position a token at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_the_largest_logits_and_weights_them() {
        let logits = [0.5, 2.0, -1.0, 2.0, 1.5, 0.0];
        let (mut chosen, mut weights) = ([0u32; 3], [0f32; 3]);
        Routing::TopKSoftmax.route(&logits, &mut chosen, &mut weights);
        // Ties go to the lower index.
        assert_eq!(chosen, [1, 3, 4]);
        let e = [2f32.exp(), 2f32.exp(), 1.5f32.exp()];
        let sum: f32 = e.iter().sum();
        for (w, e) in weights.iter().zip(e) {
            assert!((w - e / sum).abs() < 1e-6);
        }
        Routing::SoftmaxTopK.route(&logits, &mut chosen, &mut weights);
        assert_eq!(chosen, [1, 3, 4]);
        let all: f32 = logits.iter().map(|l| l.exp()).sum();
        for (w, e) in weights.iter().zip(e) {
            assert!((w - e / all).abs() < 1e-6);
        }
        let (mut one, mut w) = ([0u32; 1], [0f32; 1]);
        Routing::TopKSoftmax.route(&[-3.0, -1.0, -2.0], &mut one, &mut w);
        assert_eq!((one, w), ([1], [1.0]));
    }
}
