//! Errors of the quantization kernels.

use crate::GgmlType;

/// Everything a caller can get wrong when handing buffers to this crate. Kernels validate
/// sizes up front and return one of these rather than panicking.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    #[error("{what}: {len} elements is not a multiple of the {ty} block length {block_len}")]
    NotWholeBlocks {
        what: &'static str,
        ty: GgmlType,
        len: usize,
        block_len: usize,
    },
    #[error("{what}: {len} bytes is not a multiple of the {ty} block size {block_bytes}")]
    PartialBlock {
        what: &'static str,
        ty: GgmlType,
        len: usize,
        block_bytes: usize,
    },
    #[error("{what}: expected {expected}, got {actual}")]
    SizeMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("{what}: needs {needed}, got {actual}")]
    BufferTooSmall {
        what: &'static str,
        needed: usize,
        actual: usize,
    },
    #[error("{what}: size overflows usize")]
    SizeOverflow { what: &'static str },
    #[error("{op} is not supported for {ty}")]
    Unsupported { op: &'static str, ty: GgmlType },
    #[error("activations are {actual}, but {weights} weights need {expected}")]
    ActivationType {
        weights: GgmlType,
        expected: GgmlType,
        actual: GgmlType,
    },
}
