//! Errors of the GGUF reader.

use std::path::PathBuf;

/// Everything that can be wrong with a GGUF file. Each message names the problem and, where
/// it helps, the byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("model file not found: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "file is truncated: {what} at byte {offset} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("invalid metadata value type {type_id} for key '{key}'")]
    InvalidValueType { key: String, type_id: u32 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key '{0}' appears twice")]
    DuplicateKey(String),
    #[error("metadata key '{key}' should be {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("general.alignment is {0}: it must be a power of two")]
    BadAlignment(u64),
    #[error("tensor '{0}' appears twice")]
    DuplicateTensor(String),
    #[error("tensor '{name}' has {n_dims} dimensions (at most 4 are allowed)")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor '{name}' has an invalid shape {dims:?}")]
    InvalidShape { name: String, dims: Vec<u64> },
    #[error("tensor '{name}' has unsupported type id {type_id}")]
    UnsupportedTensorType { name: String, type_id: u32 },
    #[error(
        "tensor '{name}' data (offset {offset}, {size} bytes) lies outside the file's \
         {available} bytes of tensor data"
    )]
    TensorOutOfRange {
        name: String,
        offset: u64,
        size: u64,
        available: u64,
    },
    #[error("tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "{} is part {} of a model split into {count} files: load its first part, {}",
        path.display(), no + 1, first.display()
    )]
    NotFirstSplitPart {
        path: PathBuf,
        /// Counted from 0, as in the file's `split.no`.
        no: u64,
        count: u64,
        first: PathBuf,
    },
    #[error(
        "{} is part of a split model, but its name does not end in {suffix}, so its other parts \
         cannot be found",
        path.display()
    )]
    SplitName { path: PathBuf, suffix: String },
    #[error("part {} of {count} of the split model is missing: {}", no + 1, path.display())]
    MissingSplitPart {
        path: PathBuf,
        /// Counted from 0, as in the file's `split.no`.
        no: u64,
        count: u64,
    },
    #[error("{}: {reason}", path.display())]
    BadSplitPart { path: PathBuf, reason: String },
}
