//! Hugging Face checkpoints as GGUF models: a folder of `config.json`, `*.safetensors` (one file,
//! or shards with their `model.safetensors.index.json`), `tokenizer.model` and
//! `tokenizer_config.json`, converted as llama.cpp's `convert_hf_to_gguf.py` converts it: the
//! same metadata keys, tensor names and layouts (Q/K rows reordered for Llama's RoPE, Gemma's
//! norm gains stored as `1 + w`), the vocabulary as its tokens, scores and types.
//!
//! [`convert`] streams the GGUF to any writer one tensor at a time, reading the safetensors
//! over a memory map, so that peak memory stays near one tensor beside what is written;
//! [`OutType`] keeps each tensor's precision or rounds it to another format on the way, as
//! `llama-quantize` would for that [`FileType`] (the K-quant mixtures included).

mod arch;
mod config;
mod file_type;
mod safetensors;
mod sentencepiece;
mod tensors;
mod vocab;

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub use file_type::FileType;
pub use safetensors::{Dtype, SafetensorsFile, TensorView};
use tallow_gguf::{write_gguf, Value};
pub use tensors::OutType;

/// What can go wrong reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{file}: {reason}")]
    Config { file: String, reason: String },
    #[error("{file}: {reason}")]
    Tokenizer { file: String, reason: String },
    #[error("architecture {0:?} is not converted (tallow converts {list})", list = arch::names())]
    UnknownArchitecture(String),
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    /// A format the tensors cannot be rounded to.
    #[error("{0}")]
    OutType(String),
    #[error("writing the GGUF: {0}")]
    Write(#[from] io::Error),
}

/// A checkpoint folder, opened: its configuration, tensors and tokenizer files.
pub struct Checkpoint {
    dir: PathBuf,
    config: config::Config,
    files: Vec<SafetensorsFile>,
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`: its `config.json` read, its safetensors files mapped
    /// (those `model.safetensors.index.json` lists, else every `*.safetensors` file).
    pub fn open(dir: &Path) -> Result<Self, ConvertError> {
        let config = config::Config::read(&dir.join("config.json"))?;
        let mut files = Vec::new();
        for path in safetensors_files(dir)? {
            files.push(SafetensorsFile::open(&path)?);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            files,
        })
    }
}

/// The safetensors files of a checkpoint folder, in order.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ConvertError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let json = config::read_json(&index)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ConvertError::Config {
                file: index.display().to_string(),
                reason: "no weight_map".into(),
            })?;
        let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names.iter().any(|n| n.contains('/') || n.contains('\\')) {
            return Err(ConvertError::Config {
                file: index.display().to_string(),
                reason: "a shard outside the folder".into(),
            });
        }
        return Ok(names.into_iter().map(|n| dir.join(n)).collect());
    }
    let io = |source| ConvertError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(ConvertError::Config {
            file: dir.display().to_string(),
            reason: "no *.safetensors file in the folder".into(),
        });
    }
    Ok(paths)
}

/// Writes the GGUF of the checkpoint in `dir` to `out`, each tensor as `out_type` says.
pub fn convert(dir: &Path, out_type: OutType, out: &mut impl Write) -> Result<(), ConvertError> {
    let checkpoint = Checkpoint::open(dir)?;
    let arch = arch::of(&checkpoint.config)?;
    let plan = tensors::plan(&checkpoint, arch, out_type)?;
    let mut metadata = arch::metadata(&checkpoint.config, arch, &checkpoint.dir)?;
    metadata.push((
        "general.file_type".into(),
        Value::U32(out_type.file_type(&plan)),
    ));
    metadata.push(("general.quantization_version".into(), Value::U32(2)));
    metadata.extend(vocab::metadata(
        &checkpoint.dir,
        &checkpoint.config,
        arch.space_prefix,
    )?);
    let headers: Vec<_> = plan.iter().map(|t| t.header.clone()).collect();
    write_gguf(out, &metadata, &headers, |i, w| {
        plan[i].write(&checkpoint, w)
    })
}

/// The GGUF image of the checkpoint in `dir`, in memory.
pub fn convert_to_bytes(dir: &Path, out_type: OutType) -> Result<Vec<u8>, ConvertError> {
    let mut out = Vec::new();
    convert(dir, out_type, &mut out)?;
    Ok(out)
}

/// The GGUF image of the checkpoint in `dir`, written to a file without a name in the folder
/// `scratch` (made if missing), which is gone once closed. A loader maps it: its pages are the
/// file's, which the OS drops as the weights are copied out of them, where an image in memory
/// would stay resident beside those copies.
pub fn convert_to_temp_file(
    dir: &Path,
    out_type: OutType,
    scratch: &Path,
) -> Result<File, ConvertError> {
    let io = |source| ConvertError::Io {
        path: scratch.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(scratch).map_err(io)?;
    let file = tempfile::tempfile_in(scratch).map_err(io)?;
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    convert(dir, out_type, &mut out)?;
    out.into_inner()
        .map_err(|e| ConvertError::Write(e.into_error()))
}
