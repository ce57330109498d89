//! The tensors of a llama-family model, located in the GGUF file and checked against the
//! configuration when the model is loaded.

use std::sync::Arc;

use tallow_gguf::{GgmlType, GgufFile, TensorInfo};
use tallow_quant::{PackedMatrix, QuantError, QuantizedActs, WeightSource};

use crate::arch::{GateUpTensors, QkvTensors};
use crate::config::ModelConfig;
use crate::error::ModelError;

/// A weight matrix of `rows` output features by `cols` input features: row-major in a GGML
/// block format inside the model file, or packed at load time for this CPU's kernels
/// ([`PackedMatrix`]), after which the file's copy is no longer read.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    tensor: TensorInfo,
    /// Shared by the token embedding and the LM head when the model ties them.
    packed: Option<Arc<PackedMatrix>>,
}

impl Matrix {
    /// `out[t * rows + r] = dot(row r, activations of token t)`.
    pub fn matmul(
        &self,
        file: &GgufFile,
        acts: &QuantizedActs<'_>,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        match &self.packed {
            Some(packed) => packed.matmul(acts, out),
            None => {
                let bytes = file.tensor_data(&self.tensor);
                tallow_quant::matmul(self.ty, bytes, self.rows, self.cols, acts, out)
            }
        }
    }

    /// [`Matrix::matmul`] of several matrices that read the same activations: in one
    /// parallel loop when all are packed, else one after the other.
    pub fn matmul_many<const N: usize>(
        matrices: [&Matrix; N],
        file: &GgufFile,
        acts: &QuantizedActs<'_>,
        outs: [&mut [f32]; N],
    ) -> Result<(), QuantError> {
        if matrices.iter().all(|m| m.packed.is_some()) {
            let packed = matrices.map(|m| m.packed.as_deref().expect("all are packed"));
            return PackedMatrix::matmul_many(packed, acts, outs);
        }
        for (m, out) in matrices.into_iter().zip(outs) {
            m.matmul(file, acts, out)?;
        }
        Ok(())
    }

    /// Row `row` as f32 values (`cols` of them).
    pub fn dequantize_row(
        &self,
        file: &GgufFile,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        match &self.packed {
            Some(packed) => packed.dequantize_row(row, out),
            None => {
                let row_bytes = self.tensor.size as usize / self.rows;
                let bytes = &file.tensor_data(&self.tensor)[row * row_bytes..][..row_bytes];
                tallow_quant::dequantize(self.ty, bytes, out)
            }
        }
    }

    fn source<'a>(&self, file: &'a GgufFile) -> WeightSource<'a> {
        WeightSource {
            ty: self.ty,
            bytes: file.tensor_data(&self.tensor),
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Packs every matrix this CPU can pack into one allocation ([`PackedMatrix::pack_many`]),
/// letting the OS drop the file's pages of each part as soon as it is packed: the file's copy
/// and the packed one are never both resident, beyond a MiB or so.
fn pack_all(file: &GgufFile, matrices: &mut [&mut Matrix]) -> Result<(), ModelError> {
    let sources: Vec<WeightSource<'_>> = matrices.iter().map(|m| m.source(file)).collect();
    // A read maps the pages around it too (the kernel's fault-around), some of them already
    // released: each release starts from the beginning of the tensor, and a last sweep
    // catches pages that reading one tensor mapped in its neighbour.
    let packed = PackedMatrix::pack_many(&sources, |i, bytes| {
        file.release(&matrices[i].tensor, 0..bytes.end)
    })?;
    for (m, packed) in matrices.iter_mut().zip(packed) {
        if packed.is_some() {
            file.release(&m.tensor, 0..m.tensor.size as usize);
        }
        m.packed = packed.map(Arc::new);
    }
    Ok(())
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    /// Added to the Q, K and V projections, where the file has them.
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// RMSNorm gains over each head of Q and of K (`head_dim` values), where the architecture
    /// has them.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Matrix,
    /// Normalizes the attention output before the residual add, where the architecture does.
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    /// Normalizes the feed-forward output before the residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The LM head; the token embedding itself when the model ties them.
    pub output: Matrix,
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

impl Weights {
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
}

impl Weights {
    /// Locates and checks every tensor; with `pack`, packs the matrices that this CPU has
    /// packed kernels for (all but the token embedding, unless it is also the LM head).
    pub fn load(file: &GgufFile, config: &ModelConfig, pack: bool) -> Result<Self, ModelError> {
        let (d, ff, vocab) = (config.n_embd, config.n_ff, config.n_vocab);
        let mut token_embd = matrix(file, "token_embd.weight", vocab, d)?;
        let tied = file.tensor("output.weight").is_none();
        let mut output = if tied {
            token_embd.clone()
        } else {
            matrix(file, "output.weight", vocab, d)?
        };
        let arch = config.arch;
        let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
        let mut layers: Vec<LayerWeights> = (0..config.n_layer)
            .map(|i| {
                let name = |t: &str| format!("blk.{i}.{t}.weight");
                let bias = |t: &str, len: usize| {
                    let name = format!("blk.{i}.{t}.bias");
                    file.tensor(&name)
                        .map(|_| vector(file, &name, len))
                        .transpose()
                };
                let [wq, wk, wv] = match arch.qkv {
                    QkvTensors::Separate => [
                        matrix(file, &name("attn_q"), q_dim, d)?,
                        matrix(file, &name("attn_k"), kv_dim, d)?,
                        matrix(file, &name("attn_v"), kv_dim, d)?,
                    ],
                    QkvTensors::Fused => {
                        split_rows(file, &name("attn_qkv"), d, [q_dim, kv_dim, kv_dim])?
                    }
                };
                let [w_gate, w_up] = match arch.gate_up {
                    GateUpTensors::Separate => [
                        matrix(file, &name("ffn_gate"), ff, d)?,
                        matrix(file, &name("ffn_up"), ff, d)?,
                    ],
                    GateUpTensors::Fused => split_rows(file, &name("ffn_up"), d, [ff, ff])?,
                };
                let post_norm = |t: &str| {
                    arch.post_norms
                        .then(|| vector(file, &name(t), d))
                        .transpose()
                };
                let head_norm = |t: &str| {
                    arch.qk_norm
                        .then(|| vector(file, &name(t), config.head_dim))
                        .transpose()
                };
                Ok(LayerWeights {
                    attn_norm: vector(file, &name("attn_norm"), d)?,
                    wq,
                    wk,
                    wv,
                    q_bias: bias("attn_q", q_dim)?,
                    k_bias: bias("attn_k", kv_dim)?,
                    v_bias: bias("attn_v", kv_dim)?,
                    q_norm: head_norm("attn_q_norm")?,
                    k_norm: head_norm("attn_k_norm")?,
                    wo: matrix(file, &name("attn_output"), d, q_dim)?,
                    post_attn_norm: post_norm("post_attention_norm")?,
                    ffn_norm: vector(file, &name("ffn_norm"), d)?,
                    w_gate,
                    w_up,
                    w_down: matrix(file, &name("ffn_down"), d, ff)?,
                    post_ffn_norm: post_norm("post_ffw_norm")?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        if pack {
            let mut matrices: Vec<&mut Matrix> = layers
                .iter_mut()
                .flat_map(|l| {
                    [
                        &mut l.wq,
                        &mut l.wk,
                        &mut l.wv,
                        &mut l.wo,
                        &mut l.w_gate,
                        &mut l.w_up,
                        &mut l.w_down,
                    ]
                })
                .collect();
            matrices.push(&mut output);
            pack_all(file, &mut matrices)?;
            if tied {
                token_embd.packed = output.packed.clone();
            }
        }
        let pairs = config.rope_dim / 2;
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(file, "rope_freqs.weight", pairs)?),
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
                long: vector(file, LONG_FACTORS, pairs)?,
                short: vector(file, SHORT_FACTORS, pairs)?,
            }),
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", d)?,
            output,
            rope_freqs,
            long_rope,
        })
    }
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

fn matrix(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
    let info = tensor(file, name, &[cols as u64, rows as u64])?;
    Ok(Matrix {
        ty: info.ty,
        rows,
        cols,
        tensor: info.clone(),
        packed: None,
    })
}

/// The matrices stacked in the rows of one tensor (a fused QKV or gate/up projection): each
/// part is a run of whole rows, so it is a matrix of its own over the same bytes.
fn split_rows<const N: usize>(
    file: &GgufFile,
    name: &str,
    cols: usize,
    parts: [usize; N],
) -> Result<[Matrix; N], ModelError> {
    let whole = matrix(file, name, parts.iter().sum(), cols)?;
    let row_bytes = whole.tensor.size / whole.rows as u64;
    let mut first = 0;
    Ok(parts.map(|rows| {
        let mut tensor = whole.tensor.clone();
        tensor.offset += first as u64 * row_bytes;
        tensor.size = rows as u64 * row_bytes;
        tensor.dims = vec![cols as u64, rows as u64];
        first += rows;
        Matrix {
            rows,
            tensor,
            ..whole.clone()
        }
    }))
}

/// A one-dimensional tensor, converted to f32 (norm weights are small and read every step).
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let info = tensor(file, name, &[len as u64])?;
    let mut out = vec![0.0; len];
    tallow_quant::dequantize(info.ty, file.tensor_data(info), &mut out)?;
    Ok(out)
}
