//! What tells one transformer architecture from another, as data: the forward pass
//! ([`crate::forward`]) is written once and reads these descriptions, as llama.cpp keeps its
//! architecture tables apart from its graph.

pub use tallow_backend::{Activation, RopeStyle, Routing};

/// Where a layer's Q, K and V projections are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvTensors {
    /// `attn_q`, `attn_k` and `attn_v`.
    Separate,
    /// One `attn_qkv` matrix whose rows are Q's, then K's, then V's.
    Fused,
}

/// Where a layer's gated feed-forward projections are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateUpTensors {
    /// `ffn_gate` and `ffn_up`.
    Separate,
    /// One `ffn_up` matrix whose rows are the gate's, then the up projection's.
    Fused,
}

/// Whether the feed-forward blocks are dense or mixtures of experts (3-D `ffn_*_exps`
/// tensors and a router, `ffn_gate_inp`), and how a token's experts are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedForward {
    Dense,
    /// Every layer's is a mixture of experts.
    Experts(Routing),
    /// A mixture of experts where the file says it has experts (`expert_count`, as Mixtral
    /// under `llama`), else dense.
    DenseOrExperts(Routing),
}

/// Which layers attend only within the sliding window (`attention.sliding_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidingLayers {
    None,
    /// Layers 0, 2, 4, ... (Gemma 2).
    Even,
    /// All but every `n`-th: layer `i` slides unless `i % n == n - 1` (Gemma 3, n = 6).
    AllButEvery(usize),
}

impl SlidingLayers {
    pub fn slides(&self, layer: usize) -> bool {
        match *self {
            SlidingLayers::None => false,
            SlidingLayers::Even => layer.is_multiple_of(2),
            SlidingLayers::AllButEvery(n) => layer % n != n - 1,
        }
    }
}

/// One architecture (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    pub name: &'static str,
    pub rope: RopeStyle,
    pub qkv: QkvTensors,
    pub gate_up: GateUpTensors,
    /// Every layer has `attn_q_norm` and `attn_k_norm`: RMSNorm over each head of Q and K,
    /// before RoPE.
    pub qk_norm: bool,
    pub activation: Activation,
    /// The token embeddings are multiplied by `sqrt(n_embd)`.
    pub embed_scale: bool,
    /// The outputs of attention and of the feed-forward block are normalized
    /// (`post_attention_norm`, `post_ffw_norm`) before they join the residual stream.
    pub post_norms: bool,
    pub sliding: SlidingLayers,
    /// Sliding-window layers rotate by a RoPE of their own (`rope.freq_base_swa`, unscaled),
    /// as Gemma's do; else by the global layers'.
    pub sliding_rope: bool,
    pub feed_forward: FeedForward,
    /// The tensor of the norm in front of the feed-forward block.
    pub ffn_norm: &'static str,
}

const LLAMA: Architecture = Architecture {
    name: "llama",
    rope: RopeStyle::Interleaved,
    qkv: QkvTensors::Separate,
    gate_up: GateUpTensors::Separate,
    qk_norm: false,
    activation: Activation::Silu,
    embed_scale: false,
    post_norms: false,
    sliding: SlidingLayers::None,
    sliding_rope: false,
    feed_forward: FeedForward::DenseOrExperts(Routing::TopKSoftmax),
    ffn_norm: "ffn_norm",
};

const GEMMA2: Architecture = Architecture {
    name: "gemma2",
    feed_forward: FeedForward::Dense,
    rope: RopeStyle::Halves,
    activation: Activation::GeluTanh,
    embed_scale: true,
    post_norms: true,
    sliding: SlidingLayers::Even,
    sliding_rope: true,
    ..LLAMA
};

/// Every architecture tallow runs. Biases (`attn_q.bias` ...) are used by any of them where
/// the file has them (Qwen 2 does).
pub const ARCHITECTURES: &[Architecture] = &[
    LLAMA,
    Architecture {
        name: "qwen2",
        rope: RopeStyle::Halves,
        feed_forward: FeedForward::Dense,
        ..LLAMA
    },
    // A shared expert beside the routed ones, gated by its own sigmoid (`ffn_*_shexp`).
    Architecture {
        name: "qwen2moe",
        rope: RopeStyle::Halves,
        feed_forward: FeedForward::Experts(Routing::SoftmaxTopK),
        ..LLAMA
    },
    Architecture {
        name: "qwen3",
        rope: RopeStyle::Halves,
        qk_norm: true,
        feed_forward: FeedForward::Dense,
        ..LLAMA
    },
    Architecture {
        name: "qwen3moe",
        rope: RopeStyle::Halves,
        qk_norm: true,
        feed_forward: FeedForward::Experts(Routing::TopKSoftmax),
        ..LLAMA
    },
    Architecture {
        name: "phi3",
        rope: RopeStyle::Halves,
        qkv: QkvTensors::Fused,
        gate_up: GateUpTensors::Fused,
        feed_forward: FeedForward::Dense,
        ..LLAMA
    },
    GEMMA2,
    // Every layer's biases (attention output, router, experts), attention sinks
    // (`attn_sinks`), sliding windows on alternate layers with the global RoPE (YaRN), and
    // the norm in front of the experts stored as `post_attention_norm`.
    Architecture {
        name: "gpt-oss",
        rope: RopeStyle::Halves,
        activation: Activation::ClampedSwiglu,
        sliding: SlidingLayers::Even,
        feed_forward: FeedForward::Experts(Routing::TopKSoftmax),
        ffn_norm: "post_attention_norm",
        ..LLAMA
    },
    Architecture {
        name: "gemma3",
        qk_norm: true,
        sliding: SlidingLayers::AllButEvery(6),
        ..GEMMA2
    },
];

impl Architecture {
    /// What this architecture does differently from the plain Llama shape, in words.
    pub fn features(&self) -> Vec<&'static str> {
        let mut out = vec![match self.rope {
            RopeStyle::Interleaved => "interleaved RoPE",
            RopeStyle::Halves => "NeoX RoPE",
        }];
        if self.qkv == QkvTensors::Fused {
            out.push("fused QKV");
        }
        if self.gate_up == GateUpTensors::Fused {
            out.push("fused gate/up");
        }
        if self.qk_norm {
            out.push("Q/K head norms");
        }
        match self.activation {
            Activation::Silu => {}
            Activation::GeluTanh => out.push("GELU-tanh gates"),
            Activation::ClampedSwiglu => out.push("clamped SwiGLU"),
        }
        if self.embed_scale {
            out.push("scaled embeddings");
        }
        if self.post_norms {
            out.push("post-norms");
        }
        match self.sliding {
            SlidingLayers::None => {}
            SlidingLayers::Even => out.push("sliding window on alternate layers"),
            SlidingLayers::AllButEvery(_) => out.push("sliding window on most layers"),
        }
        out
    }
}

/// The description of `name`, if tallow runs it.
pub fn architecture(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}
