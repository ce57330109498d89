//! The tensors of a model, located in the GGUF file, checked against the configuration and
//! uploaded to the backend when the model is loaded.

use std::sync::Arc;

use tallow_backend::{Backend, Experts, MatrixSpec, MatrixUse};
use tallow_gguf::{GgufFile, TensorInfo};

use crate::arch::{GateUpTensors, QkvTensors};
use crate::config::{ExpertConfig, ModelConfig};
use crate::error::ModelError;

pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Vector,
    pub wq: B::Matrix,
    pub wk: B::Matrix,
    pub wv: B::Matrix,
    /// Added to the Q, K and V projections, where the file has them.
    pub q_bias: Option<B::Vector>,
    pub k_bias: Option<B::Vector>,
    pub v_bias: Option<B::Vector>,
    /// RMSNorm gains over each head of Q and of K (`head_dim` values), where the architecture
    /// has them.
    pub q_norm: Option<B::Vector>,
    pub k_norm: Option<B::Vector>,
    pub wo: B::Matrix,
    pub o_bias: Option<B::Vector>,
    /// A logit per query head that joins each softmax's denominator, where the file has them.
    pub sinks: Option<B::Vector>,
    /// Normalizes the attention output before the residual add, where the architecture does.
    pub post_attn_norm: Option<B::Vector>,
    pub ffn_norm: B::Vector,
    pub ffn: FeedForward<B>,
    /// Normalizes the feed-forward output before the residual add.
    pub post_ffn_norm: Option<B::Vector>,
}

/// A gated feed-forward: `down(act(gate · x) * (up · x))`.
pub struct Dense<B: Backend> {
    pub gate: B::Matrix,
    pub up: B::Matrix,
    pub down: B::Matrix,
}

pub enum FeedForward<B: Backend> {
    Dense(Dense<B>),
    Experts(Box<ExpertLayer<B>>),
}

/// A mixture-of-experts feed-forward block.
pub struct ExpertLayer<B: Backend> {
    /// One row of logits per expert (`ffn_gate_inp`), and their biases.
    pub router: B::Matrix,
    pub router_bias: Option<B::Vector>,
    pub experts: Experts<B>,
    /// The expert every token runs, scaled by the sigmoid of its gate (a one-row matrix).
    pub shared: Option<(Dense<B>, B::Matrix)>,
}

pub struct Weights<B: Backend> {
    pub token_embd: B::Matrix,
    pub layers: Vec<LayerWeights<B>>,
    pub output_norm: B::Vector,
    /// The LM head, unless the model ties it to the token embedding.
    output: Option<B::Matrix>,
    /// Per-dimension RoPE frequency divisors (Llama 3.1 style long-context scaling).
    pub rope_freqs: Option<Vec<f32>>,
    /// Phi-3's RoPE frequency divisors for short and for long contexts.
    pub long_rope: Option<LongRopeFactors>,
}

const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

/// RoPE frequency divisors of models trained to stretch their context (Phi-3 128k, LongRoPE):
/// `short` up to the original training context, `long` beyond it.
pub struct LongRopeFactors {
    pub short: Vec<f32>,
    pub long: Vec<f32>,
}

impl<B: Backend> Weights<B> {
    /// The RoPE frequency divisors of the global layers for contexts of up to `context`
    /// positions (long-context factors beyond the original context, as transformers and
    /// llama.cpp choose).
    pub fn rope_factors(&self, config: &ModelConfig, context: usize) -> Option<&[f32]> {
        match &self.long_rope {
            Some(f) if context > config.rope_original_context => Some(&f.long),
            Some(f) => Some(&f.short),
            None => self.rope_freqs.as_deref(),
        }
    }

    /// The LM head.
    pub fn output(&self) -> &B::Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Locates and checks every tensor and uploads it to `backend`.
    pub fn load(
        backend: &B,
        file: &Arc<GgufFile>,
        config: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let (d, vocab) = (config.n_embd, config.n_vocab);
        let tied = file.tensor("output.weight").is_none();
        let embd_use = if tied {
            MatrixUse::RowsAndProduct
        } else {
            MatrixUse::Rows
        };
        // Every matrix, uploaded at once: the embedding, the LM head unless tied, then each
        // layer's: Q, K, V, the attention's output and the feed-forward's (see `ffn_specs`).
        let mut specs = vec![matrix(file, "token_embd.weight", vocab, d, embd_use)?];
        if !tied {
            specs.push(matrix(file, "output.weight", vocab, d, MatrixUse::Product)?);
        }
        let arch = config.arch;
        let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
        let product = MatrixUse::Product;
        for i in 0..config.n_layer {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            let qkv = match arch.qkv {
                QkvTensors::Separate => [
                    matrix(file, &name("attn_q"), q_dim, d, product)?,
                    matrix(file, &name("attn_k"), kv_dim, d, product)?,
                    matrix(file, &name("attn_v"), kv_dim, d, product)?,
                ],
                QkvTensors::Fused => {
                    split_rows(file, &name("attn_qkv"), d, [q_dim, kv_dim, kv_dim])?
                }
            };
            specs.extend(qkv);
            specs.push(matrix(file, &name("attn_output"), d, q_dim, product)?);
            ffn_specs(file, config, i, &mut specs)?;
        }
        if config.experts.is_some() {
            backend.capabilities().check_experts()?;
        }
        // The vectors are read (and copied) before the matrices are uploaded, so that the
        // matrices' upload is the last read of the file: a read maps the file's pages around
        // it too (fault-around, large folios), and a backend that copies the matrices releases
        // them after its last read.
        let vector = |name: &str, len: usize| {
            backend
                .upload_vector(&host_vector(file, name, len)?)
                .map_err(ModelError::from)
        };
        let layers: Vec<_> = (0..config.n_layer)
            .map(|i| {
                let name = |t: &str| format!("blk.{i}.{t}.weight");
                let bias = |t: &str, len: usize| {
                    let name = format!("blk.{i}.{t}.bias");
                    file.tensor(&name).map(|_| vector(&name, len)).transpose()
                };
                let post_norm = |t: &str| arch.post_norms.then(|| vector(&name(t), d)).transpose();
                let head_norm = |t: &str| {
                    arch.qk_norm
                        .then(|| vector(&name(t), config.head_dim))
                        .transpose()
                };
                let attn_norm = vector(&name("attn_norm"), d)?;
                let q_bias = bias("attn_q", q_dim)?;
                let k_bias = bias("attn_k", kv_dim)?;
                let v_bias = bias("attn_v", kv_dim)?;
                let q_norm = head_norm("attn_q_norm")?;
                let k_norm = head_norm("attn_k_norm")?;
                let o_bias = bias("attn_output", d)?;
                let sinks = match file.tensor(&name("attn_sinks")) {
                    Some(_) => Some(vector(&name("attn_sinks"), config.n_head)?),
                    None => None,
                };
                let post_attn_norm = post_norm("post_attention_norm")?;
                let ffn_norm = vector(&name(arch.ffn_norm), d)?;
                let expert_vectors = match config.experts.as_ref().filter(|e| e.in_layer(i)) {
                    Some(e) => Some(ExpertVectors {
                        router_bias: bias("ffn_gate_inp", e.count)?,
                        biases: expert_biases(backend, file, e, d, i)?,
                    }),
                    None => None,
                };
                let post_ffn_norm = post_norm("post_ffw_norm")?;
                // The layer, once its matrices (in the order of `specs`) are uploaded.
                Ok(move |next: &mut dyn FnMut() -> B::Matrix| LayerWeights {
                    attn_norm,
                    wq: next(),
                    wk: next(),
                    wv: next(),
                    q_bias,
                    k_bias,
                    v_bias,
                    q_norm,
                    k_norm,
                    wo: next(),
                    o_bias,
                    sinks,
                    post_attn_norm,
                    ffn_norm,
                    ffn: feed_forward(
                        config.experts.as_ref().filter(|e| e.in_layer(i)),
                        expert_vectors,
                        next,
                    ),
                    post_ffn_norm,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        let output_norm = vector("output_norm.weight", d)?;
        let pairs = config.rope_dim / 2;
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(host_vector(file, "rope_freqs.weight", pairs)?),
            None => None,
        };
        let long_rope = match (file.tensor(LONG_FACTORS), file.tensor(SHORT_FACTORS)) {
            (None, None) => None,
            (Some(_), _) | (_, Some(_)) if rope_freqs.is_some() => {
                return Err(ModelError::Unsupported(
                    "both rope_freqs and long-context RoPE factors".into(),
                ))
            }
            _ => Some(LongRopeFactors {
                long: host_vector(file, LONG_FACTORS, pairs)?,
                short: host_vector(file, SHORT_FACTORS, pairs)?,
            }),
        };
        let capabilities = backend.capabilities();
        for spec in &specs {
            capabilities.check_weights(&spec.tensor.name, spec.tensor.ty)?;
        }
        let mut matrices = backend.upload_matrices(file, &specs)?.into_iter();
        let mut next = || matrices.next().expect("one matrix per spec");
        let token_embd = next();
        let output = (!tied).then(&mut next);
        let layers = layers.into_iter().map(|layer| layer(&mut next)).collect();
        Ok(Weights {
            token_embd,
            layers,
            output_norm,
            output,
            rope_freqs,
            long_rope,
        })
    }
}

/// The matrices of layer `layer`'s feed-forward block, in the order [`feed_forward`] takes
/// them: gate, up and down (a dense model's layers, a mixture's leading dense ones); or the
/// router, every expert's gates, ups and downs, and the shared expert's gate, up, down and
/// sigmoid gate.
fn ffn_specs(
    file: &GgufFile,
    config: &ModelConfig,
    layer: usize,
    specs: &mut Vec<MatrixSpec>,
) -> Result<(), ModelError> {
    let name = |t: &str| format!("blk.{layer}.{t}.weight");
    let (d, product) = (config.n_embd, MatrixUse::Product);
    let dense = |specs: &mut Vec<MatrixSpec>, suffix: &str, ff: usize| {
        let gate_up = match config.arch.gate_up {
            GateUpTensors::Separate => [
                matrix(file, &name(&format!("ffn_gate{suffix}")), ff, d, product)?,
                matrix(file, &name(&format!("ffn_up{suffix}")), ff, d, product)?,
            ],
            GateUpTensors::Fused => split_rows(file, &name("ffn_up"), d, [ff, ff])?,
        };
        specs.extend(gate_up);
        specs.push(matrix(
            file,
            &name(&format!("ffn_down{suffix}")),
            d,
            ff,
            product,
        )?);
        Ok::<_, ModelError>(())
    };
    let Some(e) = config.experts.as_ref().filter(|e| e.in_layer(layer)) else {
        return dense(specs, "", config.n_ff);
    };
    specs.push(matrix(file, &name("ffn_gate_inp"), e.count, d, product)?);
    for (t, rows, cols) in [
        ("ffn_gate_exps", e.n_ff, d),
        ("ffn_up_exps", e.n_ff, d),
        ("ffn_down_exps", d, e.n_ff),
    ] {
        specs.extend(expert_matrices(file, &name(t), rows, cols, e.count)?);
    }
    if let Some(ff) = e.n_ff_shared {
        dense(specs, "_shexp", ff)?;
        specs.push(matrix(file, &name("ffn_gate_inp_shexp"), 1, d, product)?);
    }
    Ok(())
}

/// The vectors of a mixture-of-experts layer, where the file has them.
struct ExpertVectors<B: Backend> {
    router_bias: Option<B::Vector>,
    biases: Option<[B::Vector; 3]>,
}

/// Every expert's gate, up and down biases in layer `layer` (`ffn_*_exps.bias`, GGML shape
/// `[width, count]`), where the file has them: all three or none.
fn expert_biases<B: Backend>(
    backend: &B,
    file: &GgufFile,
    e: &ExpertConfig,
    n_embd: usize,
    layer: usize,
) -> Result<Option<[B::Vector; 3]>, ModelError> {
    let name = |t: &str| format!("blk.{layer}.ffn_{t}_exps.bias");
    if file.tensor(&name("gate")).is_none() {
        return Ok(None);
    }
    let part = |t: &str, len: usize| -> Result<B::Vector, ModelError> {
        let values = host_tensor(file, &name(t), &[len as u64, e.count as u64])?;
        Ok(backend.upload_vector(&values)?)
    };
    Ok(Some([
        part("gate", e.n_ff)?,
        part("up", e.n_ff)?,
        part("down", n_embd)?,
    ]))
}

/// A layer's feed-forward block from its matrices, taken from `next` in the order of
/// [`ffn_specs`], and its vectors.
fn feed_forward<B: Backend>(
    experts: Option<&ExpertConfig>,
    vectors: Option<ExpertVectors<B>>,
    next: &mut dyn FnMut() -> B::Matrix,
) -> FeedForward<B> {
    let dense = |next: &mut dyn FnMut() -> B::Matrix| Dense {
        gate: next(),
        up: next(),
        down: next(),
    };
    let Some(e) = experts else {
        return FeedForward::Dense(dense(next));
    };
    let ExpertVectors {
        router_bias,
        biases,
    } = vectors.unwrap_or(ExpertVectors {
        router_bias: None,
        biases: None,
    });
    let router = next();
    let mut stack = || (0..e.count).map(|_| next()).collect::<Vec<_>>();
    let experts = Experts {
        gate: stack(),
        up: stack(),
        down: stack(),
        biases,
    };
    let shared = e.n_ff_shared.map(|_| (dense(next), next()));
    FeedForward::Experts(Box::new(ExpertLayer {
        router,
        router_bias,
        experts,
        shared,
    }))
}

fn tensor<'a>(file: &'a GgufFile, name: &str, dims: &[u64]) -> Result<&'a TensorInfo, ModelError> {
    let info = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    if info.dims != dims {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: dims.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(info)
}

fn matrix(
    file: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
    usage: MatrixUse,
) -> Result<MatrixSpec, ModelError> {
    let info = tensor(file, name, &[cols as u64, rows as u64])?;
    Ok(MatrixSpec {
        tensor: info.clone(),
        rows,
        cols,
        usage,
    })
}

/// The matrices stacked in the rows of one tensor (a fused QKV or gate/up projection): each
/// part is a run of whole rows, so it is a matrix of its own over the same bytes.
fn split_rows<const N: usize>(
    file: &GgufFile,
    name: &str,
    cols: usize,
    parts: [usize; N],
) -> Result<[MatrixSpec; N], ModelError> {
    let whole = tensor(
        file,
        name,
        &[cols as u64, parts.iter().sum::<usize>() as u64],
    )?;
    let mut first = 0;
    Ok(parts.map(|rows| {
        let spec = MatrixSpec::row_run(whole, first, rows, cols);
        first += rows;
        spec
    }))
}

/// The `count` matrices of `rows` by `cols` stacked in a 3-D tensor of experts (GGML shape
/// `[cols, rows, count]`): each is a run of whole rows of the stack.
fn expert_matrices(
    file: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
    count: usize,
) -> Result<Vec<MatrixSpec>, ModelError> {
    let stack = tensor(file, name, &[cols as u64, rows as u64, count as u64])?;
    Ok((0..count)
        .map(|e| MatrixSpec::row_run(stack, e * rows, rows, cols))
        .collect())
}

/// A one-dimensional tensor, converted to f32 in host memory (the file's pages released).
fn host_vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    host_tensor(file, name, &[len as u64])
}

/// A tensor of dimensions `dims`, converted to f32 in host memory (the file's pages released).
fn host_tensor(file: &GgufFile, name: &str, dims: &[u64]) -> Result<Vec<f32>, ModelError> {
    let info = tensor(file, name, dims)?;
    let mut out = vec![0.0; dims.iter().product::<u64>() as usize];
    tallow_quant::dequantize(info.ty, file.tensor_data(info), &mut out)?;
    file.release(info, 0..info.size as usize);
    Ok(out)
}
