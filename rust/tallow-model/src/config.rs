//! Hyper-parameters of a model, read from GGUF metadata.

use tallow_gguf::{Array, GgufFile, Value};

use crate::arch::{Architecture, FeedForward, SlidingLayers, ARCHITECTURES};
use crate::error::ModelError;
use tallow_backend::{Heads, RopeScaling, Routing};

/// The names of the architectures (`general.architecture`) this crate can run.
pub fn supported_architectures() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|a| a.name).collect()
}

/// The experts of a model whose feed-forward blocks are mixtures of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertConfig {
    /// Experts in each layer (`expert_count`).
    pub count: usize,
    /// Experts each token runs (`expert_used_count`).
    pub used: usize,
    /// The feed-forward width of an expert (`expert_feed_forward_length`, else
    /// `feed_forward_length` as Mixtral has it).
    pub n_ff: usize,
    /// The width of the shared expert that every token also runs, where there is one
    /// (`expert_shared_feed_forward_length`, or the `ffn_up_shexp` tensor's rows).
    pub n_ff_shared: Option<usize>,
    pub routing: Routing,
    /// Layers before the first mixture, each a dense feed-forward of `feed_forward_length`
    /// (`leading_dense_block_count`; DeepSeek, GLM-4.5 MoE).
    pub leading_dense: usize,
}

impl ExpertConfig {
    /// Whether layer `layer`'s feed-forward is the mixture (else a dense one).
    pub fn in_layer(&self, layer: usize) -> bool {
        layer >= self.leading_dense
    }
}

/// The shape of a transformer, and its architecture's description.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub arch: &'static Architecture,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Number of leading dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    /// How the layers that attend globally stretch RoPE past `rope_original_context`.
    pub rope_scaling: RopeScaling,
    /// The context the model was trained on before its RoPE was stretched
    /// (`rope.scaling.original_context_length`; the training context when absent).
    pub rope_original_context: usize,
    /// Multiplies RoPE's cosines and sines (`rope.scaling.attn_factor`).
    pub rope_attn_factor: f32,
    /// The RoPE base of sliding-window layers.
    pub rope_base_swa: f32,
    /// Positions a sliding-window layer sees (itself included); `None` when no layer slides.
    pub sliding_window: Option<usize>,
    /// Multiplies the query-key products.
    pub attn_scale: f32,
    /// Attention scores go through `cap * tanh(score / cap)`.
    pub attn_softcap: Option<f32>,
    /// The logits go through `cap * tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// Where the feed-forward blocks are mixtures of experts.
    pub experts: Option<ExpertConfig>,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let architecture = file
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::MissingMetadata("general.architecture".into()))?
            .to_string();
        let Some(arch) = crate::arch::architecture(&architecture) else {
            return Err(ModelError::UnknownArchitecture(architecture));
        };
        let prefix = architecture.clone();
        let md = Metadata {
            file,
            prefix: &prefix,
        };
        let n_embd = md.usize("embedding_length")?;
        let n_head = md.usize("attention.head_count")?;
        let n_head_kv = md.usize_or("attention.head_count_kv", n_head)?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(md.bad(
                "attention.head_count_kv",
                format!("{n_head} heads cannot be grouped over {n_head_kv} KV heads"),
            ));
        }
        if n_embd % n_head != 0 {
            return Err(md.bad(
                "attention.head_count",
                format!("{n_head} heads do not divide the embedding length {n_embd}"),
            ));
        }
        let head_dim = md.usize_or("attention.key_length", n_embd / n_head)?;
        if head_dim == 0 {
            return Err(md.bad("attention.key_length", "must be positive".into()));
        }
        let rope_dim = md.usize_or("rope.dimension_count", head_dim)?;
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(md.bad(
                "rope.dimension_count",
                format!("{rope_dim} must be even and at most the head size {head_dim}"),
            ));
        }
        let n_vocab = match md.get("vocab_size") {
            Some(_) => md.usize("vocab_size")?,
            None => file
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(Array::len)
                .ok_or_else(|| ModelError::MissingMetadata(format!("{architecture}.vocab_size")))?,
        };
        let n_ctx_train = md.usize_or("context_length", 2048)?;
        if md.get("attention.causal").and_then(Value::as_bool) == Some(false) {
            // Encoder-style embedding models: every token sees the whole text.
            return Err(ModelError::Unsupported(format!(
                "bidirectional attention ({architecture}.attention.causal = false): tallow's \
                 attention is causal"
            )));
        }
        let sliding_window = match arch.sliding {
            SlidingLayers::None => None,
            _ => Some(md.usize("attention.sliding_window")?).filter(|&w| w > 0),
        };
        let optional = |key: &str| -> Result<Option<f32>, ModelError> {
            md.get(key).map(|_| md.f32_or(key, 1.0)).transpose()
        };
        let n_ff = md.usize("feed_forward_length")?;
        let n_layer = md.usize("block_count")?;
        let experts = experts(&md, arch.feed_forward, n_ff, n_layer)?;
        let config = ModelConfig {
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps: md.f32_or("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base: md.f32_or("rope.freq_base", 10_000.0)?,
            rope_dim,
            rope_scaling: rope_scaling(&md)?,
            rope_original_context: md
                .usize_or("rope.scaling.original_context_length", n_ctx_train)?,
            rope_attn_factor: md.f32_or("rope.scaling.attn_factor", 1.0)?,
            rope_base_swa: md.f32_or("rope.freq_base_swa", 10_000.0)?,
            sliding_window,
            attn_scale: md.f32_or("attention.scale", 1.0 / (head_dim as f32).sqrt())?,
            attn_softcap: optional("attn_logit_softcapping")?,
            final_softcap: optional("final_logit_softcapping")?,
            experts,
            architecture,
            arch,
        };
        for (key, value) in [
            ("block_count", config.n_layer),
            ("feed_forward_length", config.n_ff),
            ("vocab_size", config.n_vocab),
            ("context_length", config.n_ctx_train),
            (
                "rope.scaling.original_context_length",
                config.rope_original_context,
            ),
        ] {
            if value == 0 {
                return Err(md.bad(key, "must be positive".into()));
            }
        }
        Ok(config)
    }

    /// What the model does differently from the plain Llama shape, in words.
    pub fn features(&self) -> Vec<String> {
        let mut out: Vec<String> = self.arch.features().into_iter().map(Into::into).collect();
        if let Some(e) = &self.experts {
            out.push(format!("{} experts, {} per token", e.count, e.used));
            if e.n_ff_shared.is_some() {
                out.push("a shared expert".into());
            }
            match e.leading_dense {
                0 => {}
                1 => out.push("the first layer dense".into()),
                n => out.push(format!("the first {n} layers dense")),
            }
        }
        out
    }

    /// The width of the layers' dense feed-forward blocks, where some layers have one: every
    /// layer's in a dense model, the leading layers' in a mixture of experts that begins dense.
    pub fn dense_ff(&self) -> Option<usize> {
        match &self.experts {
            Some(e) if e.leading_dense == 0 => None,
            _ => Some(self.n_ff),
        }
    }

    /// Whether layer `layer` attends within the sliding window.
    pub fn slides(&self, layer: usize) -> bool {
        self.sliding_window.is_some() && self.arch.sliding.slides(layer)
    }

    /// The positions layer `layer` sees (itself included), `None` for global attention.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.slides(layer))
    }

    /// Width of the K (and V) rows of one layer: all KV heads side by side.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the Q rows of one layer.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The shape of the attention.
    pub fn heads(&self) -> Heads {
        Heads {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
        }
    }
}

/// The experts, where the architecture's feed-forward blocks are mixtures of them.
fn experts(
    md: &Metadata<'_>,
    feed_forward: FeedForward,
    n_ff: usize,
    n_layer: usize,
) -> Result<Option<ExpertConfig>, ModelError> {
    let routing = match feed_forward {
        FeedForward::Dense => return Ok(None),
        FeedForward::DenseOrExperts(_) if md.usize_or("expert_count", 0)? == 0 => return Ok(None),
        FeedForward::Experts(routing) | FeedForward::DenseOrExperts(routing) => routing,
    };
    let count = md.usize("expert_count")?;
    let used = md.usize("expert_used_count")?;
    if used == 0 || used > count {
        return Err(md.bad(
            "expert_used_count",
            format!("{used} experts per token out of {count}"),
        ));
    }
    let n_ff = md.usize_or("expert_feed_forward_length", n_ff)?;
    let shared_key = "expert_shared_feed_forward_length";
    let n_ff_shared = match md.get(shared_key) {
        Some(_) => Some(md.usize(shared_key)?),
        None => md
            .file
            .tensor("blk.0.ffn_up_shexp.weight")
            .and_then(|t| t.dims.get(1))
            .map(|&rows| rows as usize),
    };
    for (key, value) in [
        ("expert_feed_forward_length", n_ff),
        (shared_key, n_ff_shared.unwrap_or(1)),
    ] {
        if value == 0 {
            return Err(md.bad(key, "must be positive".into()));
        }
    }
    let leading_dense = md.usize_or("leading_dense_block_count", 0)?;
    if leading_dense > n_layer {
        return Err(md.bad(
            "leading_dense_block_count",
            format!("{leading_dense} dense layers of {n_layer}"),
        ));
    }
    Ok(Some(ExpertConfig {
        count,
        used,
        n_ff,
        n_ff_shared,
        routing,
        leading_dense,
    }))
}

/// `rope.scaling.type` and the parameters of that type.
fn rope_scaling(md: &Metadata<'_>) -> Result<RopeScaling, ModelError> {
    let key = "rope.scaling.type";
    let kind = match md.get(key) {
        None => return Ok(RopeScaling::None),
        Some(value) => value
            .as_str()
            .ok_or_else(|| md.bad(key, format!("expected a string, found {value:?}")))?,
    };
    let factor = || md.f32_or("rope.scaling.factor", 1.0);
    match kind {
        // Phi-3's long-context factors are tensors (`rope_factors_long`), read with the weights.
        "none" | "longrope" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "yarn" => {
            // DeepSeek's variant of the YaRN magnitude; no architecture here uses it.
            let log_mul = "rope.scaling.yarn_log_multiplier";
            if md
                .get(log_mul)
                .and_then(Value::as_f64)
                .is_some_and(|v| v != 0.0)
            {
                return Err(ModelError::Unsupported(format!(
                    "YaRN with {}",
                    md.key(log_mul)
                )));
            }
            Ok(RopeScaling::Yarn {
                factor: factor()?,
                beta_fast: md.f32_or("rope.scaling.yarn_beta_fast", 32.0)?,
                beta_slow: md.f32_or("rope.scaling.yarn_beta_slow", 1.0)?,
            })
        }
        other => Err(ModelError::Unsupported(format!("RoPE scaling '{other}'"))),
    }
}

/// Reads `<architecture>.<key>` values with type checks.
struct Metadata<'a> {
    file: &'a GgufFile,
    prefix: &'a str,
}

impl Metadata<'_> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.file.get(&self.key(key))
    }

    fn bad(&self, key: &str, reason: String) -> ModelError {
        ModelError::BadMetadata {
            key: self.key(key),
            reason,
        }
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let value = self
            .get(key)
            .ok_or_else(|| ModelError::MissingMetadata(self.key(key)))?;
        value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v <= 1 << 24)
            .ok_or_else(|| self.bad(key, format!("expected a count, found {value:?}")))
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value
                .as_f64()
                .map(|v| v as f32)
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    self.bad(key, format!("expected a positive number, found {value:?}"))
                }),
        }
    }
}
