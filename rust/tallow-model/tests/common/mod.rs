//! What the model tests share.

use std::path::PathBuf;

use tallow_backend_cpu::CpuBackend;
use tallow_model::Model;

/// The default model, from the cache (`tallow pull` puts it there; the test script runs it
/// first).
pub fn model() -> Model<CpuBackend> {
    let home = std::env::var_os("TALLOW_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/tallow"));
    let path = home.join("models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    Model::load(CpuBackend::default(), &path, Default::default())
        .unwrap_or_else(|e| panic!("{e} (run `tallow pull` first)"))
}
