//! A checkpoint's tensors as the GGUF holds them: named, laid out and typed as llama.cpp's
//! converter writes them, each converted when it is written.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

use tallow_gguf::{GgmlType, TensorHeader};
use tallow_quant::{dequantize, quantize_row};
use tallow_threads::DisjointSlice;

use crate::arch::{head_dim, rope_dims, Arch, Layout, Mapped};
use crate::config::Config;
use crate::file_type::{FileType, ModelShape};
use crate::safetensors::{Dtype, TensorView};
use crate::{Checkpoint, ConvertError};

/// What the GGUF's tensors are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutType {
    /// Each tensor in the checkpoint's precision (F32, F16 or BF16).
    #[default]
    Keep,
    /// Each matrix in the format this file type gives it, as `llama-quantize` chooses
    /// (vectors and a mixture's routers stay F32, as llama.cpp keeps them).
    File(FileType),
}

impl OutType {
    /// The file type called `name` (`"q8_0"`, `"Q4_K_M"`, `"F16"`: any case).
    pub fn named(name: &str) -> Result<Self, ConvertError> {
        FileType::named(name).map(OutType::File).ok_or_else(|| {
            ConvertError::OutType(format!(
                "tensors are not converted to {name} (they are to {})",
                FileType::names().join(", ")
            ))
        })
    }

    /// The format of the tensor `name` of `dims` (GGML order) from `source`: vectors, biases
    /// and routers stay F32, as llama.cpp keeps them.
    fn of(self, source: GgmlType, dims: &[u64], name: &str, model: &ModelShape) -> GgmlType {
        if dims.len() < 2 || name.contains(".ffn_gate_inp") || !name.ends_with(".weight") {
            return GgmlType::F32;
        }
        match self {
            OutType::Keep => source,
            OutType::File(file) => file.matrix_type(name, dims[0], model),
        }
    }

    /// `general.file_type`: llama.cpp's number of the file type, or for the checkpoint's
    /// own precision that of the format most of the matrices have.
    pub fn file_type(self, plan: &[Planned]) -> u32 {
        if let OutType::File(file) = self {
            return file.id();
        }
        let mut counts: BTreeMap<u32, (usize, GgmlType)> = BTreeMap::new();
        for t in plan.iter().filter(|t| t.header.dims.len() >= 2) {
            counts.entry(t.header.ty.id()).or_insert((0, t.header.ty)).0 += 1;
        }
        let most = counts
            .into_values()
            .max_by_key(|&(n, _)| n)
            .map_or(GgmlType::F32, |(_, ty)| ty);
        match most {
            GgmlType::F16 => FileType::F16,
            GgmlType::BF16 => FileType::BF16,
            _ => FileType::F32,
        }
        .id()
    }
}

/// How a tensor's values change on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transform {
    None,
    /// Rows reordered within each of `heads` heads (see [`Arch::permute_qk`]).
    PermuteHeads {
        heads: u64,
    },
    /// Each value plus one (see [`Arch::norm_plus_one`]).
    PlusOne,
    /// Values gathered from across the checkpoint tensor (see [`Arch::split`]).
    Gather(Layout),
}

enum Source {
    /// Tensors of the checkpoint, each `(the file holding it, its name there)`: one, or a
    /// mixture's experts in order, stacked.
    Checkpoint {
        parts: Vec<(usize, String)>,
        /// The format of the checkpoint's values (F32, F16 or BF16).
        source: GgmlType,
        transform: Transform,
    },
    /// Values computed from the configuration (llama 3's RoPE factors).
    Computed(Vec<f32>),
    /// MXFP4 matrices of the checkpoint, `(file, name)` of their blocks (`[experts, rows,
    /// blocks, 16]` bytes, two values a byte, first value low) and of their E8M0 scales
    /// (`[experts, rows, blocks]`), every `stride`-th row from `offset` (gpt-oss's fused gate
    /// and up), repacked into GGML's MXFP4 blocks.
    Mxfp4 {
        blocks: (usize, String),
        scales: (usize, String),
        stride: u64,
        offset: u64,
    },
}

/// One tensor of the GGUF: what the table says of it and where its values come from.
pub struct Planned {
    pub header: TensorHeader,
    source: Source,
}

/// Checkpoint tensors that the GGUF leaves out: buffers transformers saves that the forward
/// computes itself.
const LEFT_OUT: &[&str] = &["rotary_emb.inv_freq"];

/// One expert's matrix of a checkpoint: the expert's number, the file holding it, its name,
/// its view and the format of its values.
type ExpertMatrix<'a> = (usize, usize, &'a str, &'a TensorView, GgmlType);

/// The GGUF's tensors, in the checkpoint's order (computed ones first).
pub fn plan(
    checkpoint: &Checkpoint,
    arch: &Arch,
    out: OutType,
) -> Result<Vec<Planned>, ConvertError> {
    let config = &checkpoint.config;
    let mut plan = Vec::new();
    for (name, factors) in rope_factors(config)? {
        plan.push(Planned {
            header: TensorHeader {
                name: name.into(),
                ty: GgmlType::F32,
                dims: vec![factors.len() as u64],
            },
            source: Source::Computed(factors),
        });
    }
    let heads = config.required(&["num_attention_heads"])?;
    let kv_heads = config.uint(&["num_key_value_heads"])?.unwrap_or(heads);
    // Each expert's matrices, gathered by the stacked tensor they make.
    let mut stacks: BTreeMap<String, Vec<ExpertMatrix>> = BTreeMap::new();
    for (index, file) in checkpoint.files.iter().enumerate() {
        for (name, view) in file.tensors() {
            let Some(source) = view.dtype.ggml() else {
                plan.extend(mxfp4_tensors(checkpoint, arch, index, name, view)?);
                continue;
            };
            if let Some(parts) = arch.split_of(name) {
                for (gguf, layout) in parts {
                    let dims = layout
                        .dims(&view.shape)
                        .ok_or_else(|| ConvertError::Tensor {
                            name: name.clone(),
                            reason: format!("shape {:?} does not split as {layout:?}", view.shape),
                        })?;
                    let parts = vec![(index, name.clone())];
                    let transform = Transform::Gather(layout);
                    plan.push(Planned::of(gguf, dims, source, parts, transform));
                }
                continue;
            }
            let gguf = match arch.gguf_name(name) {
                Some(Mapped::Tensor(gguf)) => gguf,
                Some(Mapped::Expert { name: gguf, expert }) => {
                    stacks
                        .entry(gguf)
                        .or_default()
                        .push((expert, index, name, view, source));
                    continue;
                }
                None if LEFT_OUT.iter().any(|suffix| name.ends_with(suffix)) => continue,
                None => {
                    return Err(ConvertError::Tensor {
                        name: name.clone(),
                        reason: format!("not a tensor of {} that tallow knows", arch.classes[0]),
                    })
                }
            };
            let transform =
                if arch.permute_qk && (gguf.contains(".attn_q.") || gguf.contains(".attn_k.")) {
                    let heads = if gguf.contains(".attn_q.") {
                        heads
                    } else {
                        kv_heads
                    };
                    Transform::PermuteHeads { heads }
                } else if arch.norm_plus_one && gguf.ends_with("norm.weight") {
                    Transform::PlusOne
                } else {
                    Transform::None
                };
            let dims: Vec<u64> = view.shape.iter().rev().copied().collect();
            if dims.is_empty() || dims.len() > 2 {
                return Err(ConvertError::Tensor {
                    name: name.clone(),
                    reason: format!("shape {:?}: a vector or a matrix was expected", view.shape),
                });
            }
            if let Transform::PermuteHeads { heads } = transform {
                let rows = *dims.last().expect("not empty");
                if heads == 0 || !rows.is_multiple_of(2 * heads) {
                    return Err(ConvertError::Tensor {
                        name: name.clone(),
                        reason: format!("{rows} rows do not split into {heads} heads of pairs"),
                    });
                }
            }
            let parts = vec![(index, name.clone())];
            plan.push(Planned::of(gguf, dims, source, parts, transform));
        }
    }
    for (gguf, mut experts) in stacks {
        experts.sort_by_key(|&(expert, ..)| expert);
        let (_, _, first, view, source) = experts[0];
        let numbered = experts.iter().enumerate().all(|(i, &(e, ..))| i == e);
        let alike = experts
            .iter()
            .all(|&(_, _, _, v, _)| v.shape == view.shape && v.dtype == view.dtype);
        if !numbered || !alike || view.shape.len() != 2 {
            return Err(ConvertError::Tensor {
                name: first.to_owned(),
                reason: format!(
                    "the experts of {gguf} are not matrices of one shape and type numbered from 0"
                ),
            });
        }
        let dims = vec![view.shape[1], view.shape[0], experts.len() as u64];
        let parts = experts
            .iter()
            .map(|&(_, file, name, ..)| (file, name.to_owned()))
            .collect();
        plan.push(Planned::of(gguf, dims, source, parts, Transform::None));
    }
    let n_layer = config.required(&["num_hidden_layers"])? as usize;
    let model = ModelShape {
        n_layer,
        n_gqa: heads / kv_heads.max(1),
        n_expert: config
            .uint(&["num_local_experts", "num_experts"])?
            .unwrap_or(0),
        tied_embeddings: !plan.iter().any(|t| t.header.name == "output.weight"),
        is_70b: arch.gguf == "llama" && n_layer == 80 && heads != kv_heads,
    };
    for t in &mut plan {
        if let Source::Checkpoint { source, .. } = t.source {
            t.header.ty = out.of(source, &t.header.dims, &t.header.name, &model);
        }
    }
    Ok(plan)
}

impl Planned {
    /// The tensor `name` of `dims` made of the checkpoint's `parts` of values in `source`'s
    /// format, kept in that precision until [`plan`] gives it its format.
    fn of(
        name: String,
        dims: Vec<u64>,
        source: GgmlType,
        parts: Vec<(usize, String)>,
        transform: Transform,
    ) -> Self {
        Planned {
            header: TensorHeader {
                ty: source,
                name,
                dims,
            },
            source: Source::Checkpoint {
                parts,
                source,
                transform,
            },
        }
    }

    /// Writes the tensor's data in its GGUF format.
    pub fn write(&self, checkpoint: &Checkpoint, out: &mut dyn Write) -> Result<(), ConvertError> {
        let (parts, source_type, transform) = match &self.source {
            Source::Computed(values) => {
                for v in values {
                    out.write_all(&v.to_le_bytes())?;
                }
                return Ok(());
            }
            Source::Mxfp4 {
                blocks,
                scales,
                stride,
                offset,
            } => return write_mxfp4(checkpoint, blocks, scales, *stride, *offset, out),
            Source::Checkpoint {
                parts,
                source,
                transform,
            } => (parts, *source, *transform),
        };
        let row_len = self.header.dims[0] as usize;
        let n_rows = self.header.dims[1..].iter().product::<u64>() as usize / parts.len();
        // The source formats are floats: one value a block.
        let elem = source_type.block_bytes();
        let row_bytes = row_len * elem;
        let ty = self.header.ty;
        let packed_bytes = ty.bytes_for(row_len as u64).expect("planned sizes fit") as usize;
        let rows_per_batch = (BATCH_VALUES / row_len).max(1);
        let mut packed = Vec::new();
        for (file, name) in parts {
            let file = &checkpoint.files[*file];
            let view = &file.tensors()[name];
            let bytes = file.data(view);
            let dims = &self.header.dims;
            // Row `row` of the source as this tensor takes it: a slice of it, or its values
            // gathered from across it.
            let source_row = |row: usize| -> Cow<'_, [u8]> {
                let from = match transform {
                    Transform::PermuteHeads { heads } => permuted_row(row, n_rows, heads as usize),
                    Transform::Gather(layout) => {
                        let values = (0..row_len).map(|j| layout.element(dims, row, j));
                        let gathered = values.flat_map(|e| &bytes[e * elem..(e + 1) * elem]);
                        return Cow::Owned(gathered.copied().collect());
                    }
                    Transform::None | Transform::PlusOne => row,
                };
                Cow::Borrowed(&bytes[from * row_bytes..(from + 1) * row_bytes])
            };
            if source_type == ty && transform != Transform::PlusOne {
                for row in 0..n_rows {
                    out.write_all(&source_row(row))?;
                }
            } else {
                for first in (0..n_rows).step_by(rows_per_batch) {
                    let rows = first..(first + rows_per_batch).min(n_rows);
                    packed.resize(rows.len() * packed_bytes, 0);
                    let convert = |row: usize, dst: &mut [u8], values: &mut [f32]| {
                        let src = source_row(row);
                        dequantize(source_type, &src, values)?;
                        if transform == Transform::PlusOne {
                            values.iter_mut().for_each(|v| *v += 1.0);
                        }
                        quantize_row(ty, values, dst)
                    };
                    in_parallel(rows, packed_bytes, row_len, &mut packed, convert).map_err(
                        |e| ConvertError::Tensor {
                            name: name.clone(),
                            reason: e.to_string(),
                        },
                    )?;
                    out.write_all(&packed)?;
                }
            }
            file.release(view);
        }
        Ok(())
    }
}

/// Values converted per batch of rows: a few MiB of output at a time.
const BATCH_VALUES: usize = 1 << 20;

/// Rows a task of [`in_parallel`] converts.
const ROWS_PER_TASK: usize = 16;

/// Converts `rows` into consecutive `row_bytes`-byte slices of `out` on the thread pool (the
/// K-quants' scale searches make quantizing them the slow part of a conversion); each task
/// has its own `row_len` values to work in.
fn in_parallel(
    rows: std::ops::Range<usize>,
    row_bytes: usize,
    row_len: usize,
    out: &mut [u8],
    convert: impl Fn(usize, &mut [u8], &mut [f32]) -> Result<(), tallow_quant::QuantError> + Sync,
) -> Result<(), tallow_quant::QuantError> {
    let n_rows = rows.len();
    let out = DisjointSlice::new(out);
    let failure = Mutex::new(None);
    tallow_threads::global().run(n_rows.div_ceil(ROWS_PER_TASK), &|task, _| {
        let first = task * ROWS_PER_TASK;
        let end = n_rows.min(first + ROWS_PER_TASK);
        // SAFETY: each task writes the bytes of its own rows.
        let dst = unsafe { out.range_mut(first * row_bytes..end * row_bytes) };
        let mut values = vec![0f32; row_len];
        for (k, dst) in dst.chunks_exact_mut(row_bytes).enumerate() {
            if let Err(e) = convert(rows.start + first + k, dst, &mut values) {
                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                return;
            }
        }
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The GGUF tensors of a checkpoint's byte tensor: for the blocks of an MXFP4 matrix
/// (`<module>_blocks`, with `<module>_scales` beside them), the tensors `module` splits into;
/// nothing for the scales (read with the blocks); an error for any other.
fn mxfp4_tensors(
    checkpoint: &Checkpoint,
    arch: &Arch,
    file: usize,
    name: &str,
    view: &TensorView,
) -> Result<Vec<Planned>, ConvertError> {
    let refuse = |reason: String| ConvertError::Tensor {
        name: name.to_owned(),
        reason,
    };
    if let Some(module) = name.strip_suffix("_scales") {
        if find(checkpoint, &format!("{module}_blocks")).is_some() {
            return Ok(Vec::new());
        }
    }
    let parts = name
        .strip_suffix("_blocks")
        .and_then(|module| Some((module, arch.split_of(module)?)));
    let Some((module, parts)) = parts else {
        return Err(refuse(
            "a byte (U8) tensor that is not an MXFP4 matrix's blocks or scales".into(),
        ));
    };
    let scales_name = format!("{module}_scales");
    let (scales_file, scales) =
        find(checkpoint, &scales_name).ok_or_else(|| refuse(format!("no {scales_name}")))?;
    let [experts, rows, blocks, 16] = view.shape[..] else {
        return Err(refuse(format!(
            "shape {:?} is not MXFP4 blocks",
            view.shape
        )));
    };
    if scales.dtype != Dtype::U8 || scales.shape != [experts, rows, blocks] {
        return Err(refuse(format!("{scales_name} does not fit the blocks")));
    }
    parts
        .into_iter()
        .map(|(gguf, layout)| {
            let (Layout::Transposed { stride, offset } | Layout::Columns { stride, offset }) =
                layout;
            if !rows.is_multiple_of(stride) {
                return Err(refuse(format!("{rows} rows do not split in {stride}")));
            }
            Ok(Planned {
                header: TensorHeader {
                    name: gguf,
                    ty: GgmlType::MXFP4,
                    dims: vec![blocks * 32, rows / stride, experts],
                },
                source: Source::Mxfp4 {
                    blocks: (file, name.to_owned()),
                    scales: (scales_file, scales_name.clone()),
                    stride,
                    offset,
                },
            })
        })
        .collect()
}

/// The file holding the checkpoint tensor `name`, and the tensor.
fn find<'a>(checkpoint: &'a Checkpoint, name: &str) -> Option<(usize, &'a TensorView)> {
    checkpoint
        .files
        .iter()
        .enumerate()
        .find_map(|(i, f)| f.tensors().get(name).map(|v| (i, v)))
}

/// Writes an MXFP4 matrix of the checkpoint as GGML's blocks: each block's scale byte, then
/// its 32 values in Q4_0's order (element j in the low nibble of byte j, element j + 16 in
/// its high nibble) where the checkpoint packs them in pairs.
fn write_mxfp4(
    checkpoint: &Checkpoint,
    (blocks_file, blocks_name): &(usize, String),
    (scales_file, scales_name): &(usize, String),
    stride: u64,
    offset: u64,
    out: &mut dyn Write,
) -> Result<(), ConvertError> {
    let (blocks_file, scales_file) = (
        &checkpoint.files[*blocks_file],
        &checkpoint.files[*scales_file],
    );
    let (blocks_view, scales_view) = (
        &blocks_file.tensors()[blocks_name],
        &scales_file.tensors()[scales_name],
    );
    let (packed, scales) = (blocks_file.data(blocks_view), scales_file.data(scales_view));
    let [experts, rows, n_blocks, _] = blocks_view.shape[..] else {
        unreachable!("checked when planned")
    };
    let (rows, n_blocks) = (rows as usize, n_blocks as usize);
    let mut row = Vec::with_capacity(n_blocks * 17);
    for expert in 0..experts as usize {
        for r in (offset as usize..rows).step_by(stride as usize) {
            row.clear();
            for b in 0..n_blocks {
                let at = (expert * rows + r) * n_blocks + b;
                let pairs = &packed[16 * at..16 * (at + 1)];
                let value = |k: usize| (pairs[k / 2] >> (4 * (k % 2))) & 0xf;
                row.push(scales[at]);
                row.extend((0..16).map(|j| value(j) | (value(j + 16) << 4)));
            }
            out.write_all(&row)?;
        }
    }
    blocks_file.release(blocks_view);
    scales_file.release(scales_view);
    Ok(())
}

/// Which row of a head-major Q or K matrix (or bias) lands at `row` once each head's rows go
/// from transformers' halves (`x0..x(d/2), y0..y(d/2)`) to GGML's pairs (`x0, y0, x1, y1, ...`):
/// llama.cpp's `permute`, `reshape(heads, 2, d/2, ...).swapaxes(1, 2)`.
fn permuted_row(row: usize, n_rows: usize, heads: usize) -> usize {
    let d = n_rows / heads;
    let (head, within) = (row / d, row % d);
    let (i, half) = (within / 2, within % 2);
    head * d + half * (d / 2) + i
}

/// The RoPE factors the GGUF holds as tensors: Llama 3's `rope_freqs`, or LongRoPE's (Phi-3
/// 128k, Phi-4-mini) `rope_factors_long` and `rope_factors_short`, each factor of the
/// configuration rounded to f32 as llama.cpp's converter writes them.
fn rope_factors(config: &Config) -> Result<Vec<(&'static str, Vec<f32>)>, ConvertError> {
    if let Some(factors) = llama3_rope_factors(config)? {
        return Ok(vec![("rope_freqs.weight", factors)]);
    }
    let rope = config.rope();
    if !matches!(rope.kind(), Some("longrope" | "su")) {
        return Ok(Vec::new());
    }
    let pairs = (rope_dims(config)? / 2) as usize;
    let mut tensors = Vec::new();
    for (name, key) in [
        ("rope_factors_long.weight", "long_factor"),
        ("rope_factors_short.weight", "short_factor"),
    ] {
        let factors = rope.numbers(key)?;
        if factors.len() != pairs {
            return Err(config.error(format!(
                "rope {key} has {} factors where the rotary dimensions make {pairs}",
                factors.len()
            )));
        }
        tensors.push((name, factors.into_iter().map(|f| f as f32).collect()));
    }
    Ok(tensors)
}

/// Llama 3's RoPE frequency factors (the GGUF's `rope_freqs`), computed from its scaling
/// parameters in f32 as llama.cpp's converter computes them; `None` for other RoPE.
fn llama3_rope_factors(config: &Config) -> Result<Option<Vec<f32>>, ConvertError> {
    let rope = config.rope();
    if rope.kind() != Some("llama3") {
        return Ok(None);
    }
    let base = rope.theta()?.unwrap_or(10_000.0) as f32;
    let dim = head_dim(config)? as usize;
    let factor = rope.number("factor")?.unwrap_or(8.0) as f32;
    let low = rope.number("low_freq_factor")?.unwrap_or(1.0) as f32;
    let high = rope.number("high_freq_factor")?.unwrap_or(4.0) as f32;
    let old = rope
        .number("original_max_position_embeddings")?
        .unwrap_or(8192.0) as f32;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    // torch divides a number by a tensor as the tensor's reciprocal times the number: done
    // the same way here, the factors come out with the converter's bits.
    let factors = (0..dim)
        .step_by(2)
        .map(|i| {
            let freq = 1.0 / base.powf(i as f32 / dim as f32);
            let wavelen = (1.0 / freq) * std::f32::consts::TAU;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = ((1.0 / wavelen) * old - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Ok(Some(factors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_go_from_halves_to_pairs() {
        // One head of 6 rows: x0 x1 x2 y0 y1 y2 becomes x0 y0 x1 y1 x2 y2.
        let rows: Vec<usize> = (0..6).map(|r| permuted_row(r, 6, 1)).collect();
        assert_eq!(rows, [0, 3, 1, 4, 2, 5]);
        // Two heads of 4: each head on its own.
        let rows: Vec<usize> = (0..8).map(|r| permuted_row(r, 8, 2)).collect();
        assert_eq!(rows, [0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
