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
