//! Choosing the device a model runs on: `"cpu"`, `"gpu"` (the first GPU) or `"wgpu:N"`.

use std::path::Path;
use std::sync::Arc;

use pyo3::prelude::*;
use tallow_backend::DeviceInfo;
use tallow_model::{AnyModel, CpuBackend, LoadOptions, Model, ModelError};

use crate::errors::invalid_argument;

enum Device {
    Cpu,
    Wgpu(usize),
}

fn parse(device: &str) -> PyResult<Device> {
    let bad = || {
        invalid_argument(format!(
            "device must be 'cpu', 'gpu' or 'wgpu:N' (N a GPU's number in `tallow info \
             --devices`), got {device:?}"
        ))
    };
    match device.trim().to_ascii_lowercase().as_str() {
        "cpu" => Ok(Device::Cpu),
        "gpu" | "wgpu" => Ok(Device::Wgpu(0)),
        other => match other.strip_prefix("wgpu:") {
            Some(n) => n.parse().map(Device::Wgpu).map_err(|_| bad()),
            None => Err(bad()),
        },
    }
}

/// The device's canonical name (`"cpu"`, `"wgpu:N"`), checked before anything is loaded.
pub(crate) fn canonical(device: &str) -> PyResult<String> {
    Ok(match parse(device)? {
        Device::Cpu => "cpu".into(),
        Device::Wgpu(n) => format!("wgpu:{n}"),
    })
}

/// Loads the model at `path` on `device`.
pub(crate) fn load(
    path: &Path,
    options: LoadOptions,
    device: &str,
) -> PyResult<Result<Arc<dyn AnyModel>, ModelError>> {
    Ok(match parse(device)? {
        Device::Cpu => Model::load_on(CpuBackend::default(), path, options)
            .map(|m| Arc::new(m) as Arc<dyn AnyModel>),
        Device::Wgpu(index) => load_wgpu(path, options, index),
    })
}

#[cfg(feature = "wgpu")]
fn load_wgpu(
    path: &Path,
    options: LoadOptions,
    index: usize,
) -> Result<Arc<dyn AnyModel>, ModelError> {
    // TALLOW_WGPU_SUBGROUPS=0 and TALLOW_WGPU_F16=0 keep subgroup operations and f16
    // arithmetic off, for a driver that gets them wrong.
    let on = |name: &str| std::env::var(name).map_or(true, |v| v != "0");
    let gpu_options = tallow_backend_wgpu::WgpuOptions {
        subgroups: on("TALLOW_WGPU_SUBGROUPS"),
        f16: on("TALLOW_WGPU_F16"),
        ..Default::default()
    };
    let backend = tallow_backend_wgpu::WgpuBackend::open_with(index, gpu_options)?;
    Ok(Arc::new(Model::load_on(backend, path, options)?))
}

#[cfg(not(feature = "wgpu"))]
fn load_wgpu(
    _path: &Path,
    _options: LoadOptions,
    _index: usize,
) -> Result<Arc<dyn AnyModel>, ModelError> {
    Err(ModelError::Device(
        "this build of tallow has no GPU support (it was built without the wgpu feature)".into(),
    ))
}

/// The CPU and every GPU found: `(device name to pass, what it is, backend, memory in bytes)`.
#[pyfunction]
pub(crate) fn devices(py: Python<'_>) -> Vec<(String, String, String, Option<u64>)> {
    let row = |id: String, d: DeviceInfo| (id, d.name, d.backend, d.memory);
    let cpu = row(
        "cpu".into(),
        tallow_backend::Backend::device(&CpuBackend::default()),
    );
    #[cfg(feature = "wgpu")]
    {
        let gpus = py.detach(tallow_backend_wgpu::devices);
        let gpus = gpus
            .into_iter()
            .enumerate()
            .map(|(i, d)| row(format!("wgpu:{i}"), d));
        std::iter::once(cpu).chain(gpus).collect()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = py;
        vec![cpu]
    }
}
