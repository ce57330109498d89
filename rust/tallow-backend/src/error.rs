//! Errors of the backends.

use tallow_gguf::GgufError;
use tallow_kv::KvError;
use tallow_quant::QuantError;

/// Why a backend could not load weights or run a step.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The model needs something this backend's kernels do not do.
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device failed: out of memory, lost, or no such device.
    #[error("device error: {0}")]
    Device(String),
}

/// Why an operation of a step stopped.
#[derive(Debug)]
pub enum StepError {
    /// A backend that takes a step's memory from fixed arenas ran out of arena `arena`, which
    /// must hold `needed` bytes: it grows the arena and runs the step again (a step only
    /// writes the KV rows of its own tokens, so running it twice gives the same result).
    OutOfScratch {
        arena: usize,
        needed: usize,
    },
    Failed(BackendError),
}

impl<E: Into<BackendError>> From<E> for StepError {
    fn from(e: E) -> Self {
        StepError::Failed(e.into())
    }
}
