//! The parameters of a transformer's operations that differ between architectures.

/// The function of the gate in a gated feed-forward block: `down(act(gate) * up)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU, Gemma).
    GeluTanh,
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
