//! The architectures a checkpoint converts from, as data: the GGUF architecture each class
//! becomes, how its tensors are named and laid out, and the metadata its `config.json` gives,
//! each as llama.cpp's converter writes it.

use std::path::Path;

use tallow_gguf::Value;

use crate::config::Config;
use crate::ConvertError;

/// One architecture: the transformers classes it converts from, the GGUF name, and what sets
/// it apart.
pub struct Arch {
    /// `architectures` in `config.json`.
    pub classes: &'static [&'static str],
    /// `general.architecture` of the GGUF.
    pub gguf: &'static str,
    /// Q and K rows reordered from transformers' rotate-half RoPE to GGML's adjacent pairs
    /// (llama.cpp's `permute`), for architectures that GGML runs with the normal RoPE.
    pub permute_qk: bool,
    /// Norm gains stored as `w` where the model scales by `1 + w` (Gemma): written as `1 + w`.
    pub norm_plus_one: bool,
    /// Per layer, transformers' module names and the GGUF's (after `model.layers.N.` and
    /// `blk.N.`), beside [`COMMON_LAYER`]; a `*` in a module stands for an expert's number.
    pub layer: &'static [&'static [(&'static str, &'static str)]],
    /// What this architecture's metadata adds to [`common`]'s.
    pub metadata: fn(&Config, &mut Metadata) -> Result<(), ConvertError>,
    /// Whether the tokenizer adds a space before the first word (GGUF's `add_space_prefix`,
    /// written where false: Gemma's SentencePiece vocabulary does not).
    pub space_prefix: bool,
    /// Per layer, tensors that become other tensors laid out anew: transformers' name (after
    /// `model.layers.N.`) and each GGUF tensor (after `blk.N.`) with its [`Layout`].
    pub split: &'static [(&'static str, &'static [(&'static str, Layout)])],
}

/// How a GGUF tensor takes its values from a checkpoint tensor of shape `[..., A, B]`
/// (row-major), the GGUF's rows `i` and columns `j` of each matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every `stride`-th column from `offset`: `out[..][i][j] = src[..][i][stride j + offset]`.
    Columns { stride: u64, offset: u64 },
    /// Transposed, every `stride`-th row of the result from `offset`: `out[m][i][j] =
    /// src[m][j][stride i + offset]` (gpt-oss stores its experts' matrices as `x @ W`).
    Transposed { stride: u64, offset: u64 },
}

impl Layout {
    /// The GGUF dimensions (innermost first) taken from a checkpoint tensor of `shape`
    /// (outermost first); `None` where the shape does not split so.
    pub fn dims(self, shape: &[u64]) -> Option<Vec<u64>> {
        let mut dims: Vec<u64> = shape.iter().rev().copied().collect();
        match self {
            Layout::Columns { stride, .. } => {
                let b = dims.first_mut()?;
                (b.is_multiple_of(stride)).then(|| *b /= stride)?;
            }
            Layout::Transposed { stride, .. } => {
                if dims.len() < 2 || !dims[0].is_multiple_of(stride) {
                    return None;
                }
                dims.swap(0, 1);
                dims[1] /= stride;
            }
        }
        Some(dims)
    }

    /// Where element `j` of row `row` of the GGUF tensor of `dims` is in the checkpoint's.
    pub fn element(self, dims: &[u64], row: usize, j: usize) -> usize {
        match self {
            Layout::Columns { stride, offset } => {
                let b = stride as usize * dims[0] as usize;
                row * b + stride as usize * j + offset as usize
            }
            Layout::Transposed { stride, offset } => {
                let (a, rows) = (dims[0] as usize, dims[1] as usize);
                let (matrix, i) = (row / rows, row % rows);
                let b = stride as usize * rows;
                matrix * a * b + j * b + stride as usize * i + offset as usize
            }
        }
    }
}

/// Metadata under construction: `(key, value)` in order; keys of the architecture are given
/// without their `<arch>.` prefix.
pub struct Metadata {
    arch: &'static str,
    pub entries: Vec<(String, Value)>,
}

impl Metadata {
    fn put(&mut self, key: &str, value: Value) {
        self.entries.push((format!("{}.{key}", self.arch), value));
    }

    fn put_u32(&mut self, key: &str, value: Option<u64>) -> Result<(), ConvertError> {
        if let Some(v) = value {
            let v = u32::try_from(v).map_err(|_| ConvertError::Config {
                file: "config.json".into(),
                reason: format!("{key} {v} is out of range"),
            })?;
            self.put(key, Value::U32(v));
        }
        Ok(())
    }

    fn put_f32(&mut self, key: &str, value: Option<f64>) {
        if let Some(v) = value {
            self.put(key, Value::F32(v as f32));
        }
    }
}

/// Module names every architecture shares.
const COMMON_LAYER: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// Llama's layer: a norm before the feed-forward.
const LLAMA_LAYER: &[(&str, &str)] = &[("post_attention_layernorm", "ffn_norm")];

/// Gemma 2 and 3: norms before and after both the attention and the feed-forward.
const GEMMA_LAYER: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// Phi-3: Q, K and V in one matrix, gate and up in another.
const PHI3_LAYER: &[(&str, &str)] = &[
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.qkv_proj", "attn_qkv"),
    ("mlp.gate_up_proj", "ffn_up"),
];

/// A mixture of experts (Qwen 2 and 3 MoE): the router, each expert's gated feed-forward
/// (stacked into one 3-D tensor per matrix), and Qwen 2 MoE's shared expert with its gate.
const QWEN_MOE_LAYER: &[(&str, &str)] = &[
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.experts.*.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.*.up_proj", "ffn_up_exps"),
    ("mlp.experts.*.down_proj", "ffn_down_exps"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
];

/// Mixtral's mixture: `w1` the gate, `w3` up, `w2` down.
const MIXTRAL_LAYER: &[(&str, &str)] = &[
    ("block_sparse_moe.gate", "ffn_gate_inp"),
    ("block_sparse_moe.experts.*.w1", "ffn_gate_exps"),
    ("block_sparse_moe.experts.*.w3", "ffn_up_exps"),
    ("block_sparse_moe.experts.*.w2", "ffn_down_exps"),
];

/// gpt-oss: norms named as Gemma's, the attention sinks, and the router.
const GPT_OSS_LAYER: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("mlp.router", "ffn_gate_inp"),
];

/// gpt-oss's experts: stacked 3-D tensors, each matrix transposed, gate and up fused with
/// their rows interleaved (gate's even, up's odd), as are their biases.
const GPT_OSS_SPLIT: &[(&str, &[(&str, Layout)])] = &[
    (
        "mlp.experts.gate_up_proj",
        &[
            (
                "ffn_gate_exps.weight",
                Layout::Transposed {
                    stride: 2,
                    offset: 0,
                },
            ),
            (
                "ffn_up_exps.weight",
                Layout::Transposed {
                    stride: 2,
                    offset: 1,
                },
            ),
        ],
    ),
    (
        "mlp.experts.gate_up_proj_bias",
        &[
            (
                "ffn_gate_exps.bias",
                Layout::Columns {
                    stride: 2,
                    offset: 0,
                },
            ),
            (
                "ffn_up_exps.bias",
                Layout::Columns {
                    stride: 2,
                    offset: 1,
                },
            ),
        ],
    ),
    (
        "mlp.experts.down_proj",
        &[(
            "ffn_down_exps.weight",
            Layout::Transposed {
                stride: 1,
                offset: 0,
            },
        )],
    ),
    (
        "mlp.experts.down_proj_bias",
        &[(
            "ffn_down_exps.bias",
            Layout::Columns {
                stride: 1,
                offset: 0,
            },
        )],
    ),
    (
        "self_attn.sinks",
        &[(
            "attn_sinks.weight",
            Layout::Columns {
                stride: 1,
                offset: 0,
            },
        )],
    ),
];

/// Tensors outside the layers: transformers' name and the GGUF's.
pub const GLOBAL: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Every architecture a checkpoint converts from.
pub const ARCHITECTURES: &[Arch] = &[
    Arch {
        classes: &["LlamaForCausalLM", "MistralForCausalLM"],
        gguf: "llama",
        permute_qk: true,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER],
        metadata: llama,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Qwen2ForCausalLM"],
        gguf: "qwen2",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER],
        metadata: no_more,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Qwen3ForCausalLM"],
        gguf: "qwen3",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER],
        metadata: no_more,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["MixtralForCausalLM"],
        gguf: "llama",
        permute_qk: true,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER, MIXTRAL_LAYER],
        metadata: mixtral,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Qwen2MoeForCausalLM"],
        gguf: "qwen2moe",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER, QWEN_MOE_LAYER],
        metadata: experts,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Qwen3MoeForCausalLM"],
        gguf: "qwen3moe",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[LLAMA_LAYER, QWEN_MOE_LAYER],
        metadata: experts,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Phi3ForCausalLM"],
        gguf: "phi3",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[PHI3_LAYER],
        metadata: phi3,
        space_prefix: true,
        split: &[],
    },
    Arch {
        classes: &["Gemma2ForCausalLM"],
        gguf: "gemma2",
        permute_qk: false,
        norm_plus_one: true,
        layer: &[GEMMA_LAYER],
        metadata: gemma2,
        space_prefix: false,
        split: &[],
    },
    Arch {
        classes: &["Gemma3ForCausalLM"],
        gguf: "gemma3",
        permute_qk: false,
        norm_plus_one: true,
        layer: &[GEMMA_LAYER],
        metadata: gemma3,
        space_prefix: false,
        split: &[],
    },
    Arch {
        classes: &["GptOssForCausalLM"],
        gguf: "gpt-oss",
        permute_qk: false,
        norm_plus_one: false,
        layer: &[GPT_OSS_LAYER],
        metadata: gpt_oss,
        space_prefix: true,
        split: GPT_OSS_SPLIT,
    },
];

/// The transformers classes tallow converts, for messages.
pub fn names() -> String {
    let names: Vec<&str> = ARCHITECTURES
        .iter()
        .flat_map(|a| a.classes)
        .copied()
        .collect();
    names.join(", ")
}

/// The architecture of a configuration (its first class that tallow converts).
pub fn of(config: &Config) -> Result<&'static Arch, ConvertError> {
    let classes = config.architectures();
    classes
        .iter()
        .find_map(|c| ARCHITECTURES.iter().find(|a| a.classes.contains(c)))
        .ok_or_else(|| {
            ConvertError::UnknownArchitecture(classes.first().copied().unwrap_or("").to_owned())
        })
}

/// Where a checkpoint tensor goes in the GGUF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// A tensor of its own.
    Tensor(String),
    /// Expert `expert`'s matrix, one slice of a 3-D tensor that stacks every expert's.
    Expert { name: String, expert: usize },
}

impl Arch {
    /// The GGUF tensors a checkpoint tensor is split into, each with its layout; `None` for
    /// one that is not split.
    pub fn split_of(&self, name: &str) -> Option<Vec<(String, Layout)>> {
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, module) = rest.split_once('.')?;
        let layer: u32 = layer.parse().ok()?;
        let (_, parts) = self.split.iter().find(|(hf, _)| *hf == module)?;
        Some(
            parts
                .iter()
                .map(|&(gguf, layout)| (format!("blk.{layer}.{gguf}"), layout))
                .collect(),
        )
    }

    /// Where a tensor of the checkpoint goes in the GGUF; `None` for one this architecture
    /// does not have.
    pub fn gguf_name(&self, name: &str) -> Option<Mapped> {
        if let Some((_, gguf)) = GLOBAL.iter().find(|(hf, _)| *hf == name) {
            return Some(Mapped::Tensor((*gguf).to_owned()));
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: u32 = layer.parse().ok()?;
        let (module, kind) = rest.rsplit_once('.')?;
        if kind != "weight" && kind != "bias" {
            return None;
        }
        // An expert's number becomes the pattern's `*`.
        let (module, expert) = match module.split_once(".experts.") {
            Some((before, after)) => {
                let (number, after) = after.split_once('.')?;
                (
                    format!("{before}.experts.*.{after}"),
                    Some(number.parse().ok()?),
                )
            }
            None => (module.to_owned(), None),
        };
        let (_, gguf) = self
            .layer
            .iter()
            .copied()
            .chain([COMMON_LAYER])
            .flatten()
            .find(|(hf, _)| *hf == module)?;
        let name = format!("blk.{layer}.{gguf}.{kind}");
        Some(match expert {
            Some(expert) => Mapped::Expert { name, expert },
            None => Mapped::Tensor(name),
        })
    }
}

/// The architecture's metadata, from its configuration; `dir`'s name is the model's name, as
/// llama.cpp's converter names it.
pub fn metadata(
    config: &Config,
    arch: &Arch,
    dir: &Path,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let mut m = Metadata {
        arch: arch.gguf,
        entries: vec![
            (
                "general.architecture".into(),
                Value::String(arch.gguf.into()),
            ),
            ("general.type".into(), Value::String("model".into())),
        ],
    };
    if let Some(name) = dir.file_name().and_then(|n| n.to_str()) {
        m.entries
            .push(("general.name".into(), Value::String(title(name))));
    }
    common(config, &mut m)?;
    (arch.metadata)(config, &mut m)?;
    Ok(m.entries)
}

/// A folder's name as a model's: words split at `-` and `_`, each capitalised.
fn title(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars
                .next()
                .map_or(String::new(), |c| c.to_uppercase().chain(chars).collect())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What every architecture writes.
fn common(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    let heads = config.required(&["num_attention_heads"])?;
    m.put_u32(
        "block_count",
        Some(config.required(&["num_hidden_layers"])?),
    )?;
    m.put_u32("context_length", config.uint(&["max_position_embeddings"])?)?;
    m.put_u32("embedding_length", Some(config.required(&["hidden_size"])?))?;
    m.put_u32("feed_forward_length", config.uint(&["intermediate_size"])?)?;
    m.put_u32("attention.head_count", Some(heads))?;
    let kv = config.uint(&["num_key_value_heads"])?.unwrap_or(heads);
    m.put_u32("attention.head_count_kv", Some(kv))?;
    m.put_f32("rope.freq_base", config.rope().theta()?);
    m.put_f32(
        "attention.layer_norm_rms_epsilon",
        config.number(&["rms_norm_eps"])?,
    );
    let head_dim = config.uint(&["head_dim"])?;
    m.put_u32("attention.key_length", head_dim)?;
    m.put_u32("attention.value_length", head_dim)?;
    Ok(())
}

fn no_more(_: &Config, _: &mut Metadata) -> Result<(), ConvertError> {
    Ok(())
}

/// The width of one attention head.
pub fn head_dim(config: &Config) -> Result<u64, ConvertError> {
    if let Some(d) = config.uint(&["head_dim"])? {
        return Ok(d);
    }
    let heads = config.required(&["num_attention_heads"])?;
    Ok(config.required(&["hidden_size"])? / heads.max(1))
}

fn llama(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    m.put_u32("vocab_size", config.uint(&["vocab_size"])?)?;
    m.put_u32("rope.dimension_count", Some(head_dim(config)?))?;
    let rope = config.rope();
    match rope.kind() {
        None | Some("llama3") => {} // llama3's factors are the rope_freqs tensor
        Some("linear") => {
            m.put("rope.scaling.type", Value::String("linear".into()));
            m.put_f32("rope.scaling.factor", Some(rope.required("factor")?));
        }
        Some(other) => return Err(config.error(format!("rope type {other:?} is not converted"))),
    }
    Ok(())
}

/// A mixture of experts' sizes.
fn experts(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    m.put_u32(
        "expert_count",
        Some(config.required(&["num_local_experts", "num_experts"])?),
    )?;
    m.put_u32(
        "expert_used_count",
        Some(config.required(&["num_experts_per_tok"])?),
    )?;
    m.put_u32(
        "expert_feed_forward_length",
        config.uint(&["moe_intermediate_size"])?,
    )?;
    m.put_u32(
        "expert_shared_feed_forward_length",
        config.uint(&["shared_expert_intermediate_size"])?,
    )?;
    // Qwen's dense layers among sparse ones are not converted (llama.cpp has no key for them).
    let step = config.uint(&["decoder_sparse_step"])?.unwrap_or(1);
    let dense = config
        .get("mlp_only_layers")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|layers| !layers.is_empty());
    if step != 1 || dense {
        return Err(config.error(
            "dense layers among the sparse ones (decoder_sparse_step, mlp_only_layers) are not \
             converted"
                .into(),
        ));
    }
    Ok(())
}

fn gpt_oss(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    experts(config, m)?;
    m.put_u32(
        "expert_feed_forward_length",
        config.uint(&["intermediate_size"])?,
    )?;
    m.put_u32(
        "attention.sliding_window",
        config.uint(&["sliding_window"])?,
    )?;
    let rope = config.rope();
    match rope.kind() {
        None => {}
        Some("yarn") => {
            m.put("rope.scaling.type", Value::String("yarn".into()));
            m.put_f32("rope.scaling.factor", Some(rope.required("factor")?));
            m.put_u32(
                "rope.scaling.original_context_length",
                Some(rope.required("original_max_position_embeddings")? as u64),
            )?;
            m.put_f32("rope.scaling.yarn_beta_fast", rope.number("beta_fast")?);
            m.put_f32("rope.scaling.yarn_beta_slow", rope.number("beta_slow")?);
        }
        Some(other) => return Err(config.error(format!("rope type {other:?} is not converted"))),
    }
    Ok(())
}

fn mixtral(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    llama(config, m)?;
    experts(config, m)
}

fn phi3(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    let rope = config.rope();
    let context = config.uint(&["max_position_embeddings"])?;
    let original = match rope.number("original_max_position_embeddings")? {
        Some(n) => Some(n as u64),
        None => config.uint(&["original_max_position_embeddings"])?,
    }
    .or(context);
    m.put_u32("rope.scaling.original_context_length", original)?;
    m.put_u32("rope.dimension_count", Some(rope_dims(config)?))?;
    m.put_u32(
        "attention.sliding_window",
        Some(config.uint(&["sliding_window"])?.unwrap_or(0)),
    )?;
    match rope.kind() {
        None => {}
        // LongRoPE: the factors are tensors (see `tensors::rope_factors`); the magnitude of
        // the rotated values grows with how far the context is stretched.
        Some("longrope" | "su") => {
            let scale = context.unwrap_or(0) as f64 / original.unwrap_or(1) as f64;
            let attn_factor = if scale > 1.0 {
                (1.0 + scale.ln() / (original.unwrap_or(1) as f64).ln()).sqrt()
            } else {
                1.0
            };
            m.put_f32("rope.scaling.attn_factor", Some(attn_factor));
        }
        Some(kind) => {
            return Err(config.error(format!("rope type {kind:?} is not converted for Phi-3")))
        }
    }
    Ok(())
}

/// The dimensions of each head that RoPE rotates (`partial_rotary_factor` of them).
pub fn rope_dims(config: &Config) -> Result<u64, ConvertError> {
    let rotary = match config.rope().number("partial_rotary_factor")? {
        Some(r) => Some(r),
        None => config.number(&["partial_rotary_factor"])?,
    };
    Ok((head_dim(config)? as f64 * rotary.unwrap_or(1.0)) as u64)
}

fn gemma2(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    m.put_f32(
        "attn_logit_softcapping",
        config.number(&["attn_logit_softcapping"])?,
    );
    m.put_f32(
        "final_logit_softcapping",
        config.number(&["final_logit_softcapping"])?,
    );
    m.put_u32(
        "attention.sliding_window",
        config.uint(&["sliding_window"])?,
    )?;
    Ok(())
}

fn gemma3(config: &Config, m: &mut Metadata) -> Result<(), ConvertError> {
    let global = config.rope_of("full_attention");
    match global.kind() {
        None => {}
        Some("linear") => {
            m.put("rope.scaling.type", Value::String("linear".into()));
            m.put_f32("rope.scaling.factor", Some(global.required("factor")?));
        }
        Some(other) => return Err(config.error(format!("rope type {other:?} is not converted"))),
    }
    // The local layers' base: version 4's rope_local_base_freq, version 5's parameters of
    // the sliding layers.
    let local = match config.number(&["rope_local_base_freq"])? {
        Some(base) => Some(base),
        None => config.rope_of("sliding_attention").theta()?,
    };
    m.put_f32("rope.freq_base_swa", local);
    m.put_u32(
        "attention.sliding_window",
        config.uint(&["sliding_window"])?,
    )?;
    m.put_f32(
        "attn_logit_softcapping",
        config.number(&["attn_logit_softcapping"])?,
    );
    m.put_f32(
        "final_logit_softcapping",
        config.number(&["final_logit_softcapping"])?,
    );
    Ok(())
}
