//! The devices a model runs on, by name: `"cpu"`, `"gpu"` (the first GPU), `"wgpu:N"`,
//! `"cuda:N"` or `"metal"`.
//! Each backend built in is one entry of [`BACKENDS`]: how to list its devices and how to load
//! a model on one of them.

use std::path::Path;
use std::sync::Arc;

use pyo3::prelude::*;
use tallow_backend::{Backend, DeviceInfo};
use tallow_backend_cpu::CpuBackend;
use tallow_model::{AnyModel, LoadOptions, Model, ModelError};

use crate::errors::invalid_argument;

type Loaded = Result<Arc<dyn AnyModel>, ModelError>;

/// A backend built into this module.
struct Entry {
    /// Its devices' names: `name` alone for the one device, `name:N` for numbered ones.
    name: &'static str,
    /// Whether its devices are GPUs (numbered, and what `"gpu"` names).
    gpus: bool,
    devices: fn() -> Vec<DeviceInfo>,
    /// Loads a model on device `index`.
    load: fn(usize, &Path, LoadOptions) -> Loaded,
}

impl Entry {
    /// The name of its device `index` (`"N"` for the pattern).
    fn device(&self, index: impl std::fmt::Display) -> String {
        match self.gpus {
            true => format!("{}:{index}", self.name),
            false => self.name.into(),
        }
    }
}

const BACKENDS: &[Entry] = &[
    Entry {
        name: "cpu",
        gpus: false,
        devices: || vec![CpuBackend::default().device()],
        load: |_, path, options| Ok(Arc::new(Model::load(CpuBackend::default(), path, options)?)),
    },
    Entry {
        name: "wgpu",
        gpus: true,
        devices: wgpu_devices,
        load: load_wgpu,
    },
    Entry {
        name: "cuda",
        gpus: true,
        devices: cuda_devices,
        load: load_cuda,
    },
    Entry {
        name: "metal",
        gpus: true,
        devices: metal_devices,
        load: load_metal,
    },
];

#[cfg(all(feature = "metal", target_os = "macos"))]
fn metal_devices() -> Vec<DeviceInfo> {
    tallow_backend_metal::devices()
}

#[cfg(all(feature = "metal", target_os = "macos"))]
fn load_metal(index: usize, path: &Path, options: LoadOptions) -> Loaded {
    if index != 0 {
        return Err(ModelError::Device(format!(
            "metal:{index}: tallow runs on the system's default Metal GPU, metal:0"
        )));
    }
    let backend = tallow_backend_metal::MetalBackend::new(tallow_backend_metal::Metal::open()?);
    Ok(Arc::new(Model::load(backend, path, options)?))
}

#[cfg(not(all(feature = "metal", target_os = "macos")))]
fn metal_devices() -> Vec<DeviceInfo> {
    Vec::new()
}

#[cfg(not(all(feature = "metal", target_os = "macos")))]
fn load_metal(_index: usize, _path: &Path, _options: LoadOptions) -> Loaded {
    Err(ModelError::Unsupported(
        "Metal needs an Apple GPU on macOS (a build for macOS with the metal feature)".into(),
    ))
}

#[cfg(feature = "cuda")]
fn cuda_devices() -> Vec<DeviceInfo> {
    tallow_backend_cuda::devices()
}

#[cfg(feature = "cuda")]
fn load_cuda(index: usize, path: &Path, options: LoadOptions) -> Loaded {
    let backend = tallow_backend_cuda::open(index)?;
    Ok(Arc::new(Model::load(backend, path, options)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices() -> Vec<DeviceInfo> {
    Vec::new()
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(_index: usize, _path: &Path, _options: LoadOptions) -> Loaded {
    Err(ModelError::Device(
        "this build of tallow has no CUDA support (it was built without the cuda feature)".into(),
    ))
}

#[cfg(feature = "wgpu")]
fn wgpu_devices() -> Vec<DeviceInfo> {
    tallow_backend_wgpu::devices()
}

#[cfg(feature = "wgpu")]
fn load_wgpu(index: usize, path: &Path, options: LoadOptions) -> Loaded {
    let backend = tallow_backend_wgpu::open(index)?;
    Ok(Arc::new(Model::load(backend, path, options)?))
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_devices() -> Vec<DeviceInfo> {
    Vec::new()
}

#[cfg(not(feature = "wgpu"))]
fn load_wgpu(_index: usize, _path: &Path, _options: LoadOptions) -> Loaded {
    Err(ModelError::Device(
        "this build of tallow has no GPU support (it was built without the wgpu feature)".into(),
    ))
}

/// The backend and device number `device` names.
fn parse(device: &str) -> PyResult<(&'static Entry, usize)> {
    let device = device.trim().to_ascii_lowercase();
    let (name, index) = match device.split_once(':') {
        Some((name, n)) => (name, Some(n)),
        None => (device.as_str(), None),
    };
    let gpu = name == "gpu";
    let found = BACKENDS
        .iter()
        .find(|e| if gpu { e.gpus } else { e.name == name });
    let mut names: Vec<String> = (BACKENDS.iter())
        .map(|e| format!("'{}'", e.device("N")))
        .collect();
    names.insert(1, "'gpu'".into());
    let Some(entry) = found else {
        return Err(invalid_argument(format!(
            "device must be one of {} (N a GPU's number in `tallow info --devices`), got \
             {device:?}",
            names.join(", ")
        )));
    };
    let index = match (index, entry.gpus) {
        (None, _) => 0,
        (Some(n), true) => n.parse().map_err(|_| {
            invalid_argument(format!("{device:?}: a GPU's number must follow the ':'"))
        })?,
        (Some(_), false) => {
            return Err(invalid_argument(format!(
                "{device:?}: the {} device has no number",
                entry.name
            )))
        }
    };
    Ok((entry, index))
}

/// The device's canonical name (`"cpu"`, `"wgpu:N"`), checked before anything is loaded.
pub(crate) fn canonical(device: &str) -> PyResult<String> {
    let (entry, index) = parse(device)?;
    Ok(entry.device(index))
}

/// Loads the model at `path` on `device`.
pub(crate) fn load(path: &Path, options: LoadOptions, device: &str) -> PyResult<Loaded> {
    let (entry, index) = parse(device)?;
    Ok((entry.load)(index, path, options))
}

/// Every device of every backend: `(device name to pass, what it is, backend, memory in
/// bytes)`.
#[pyfunction]
pub(crate) fn devices(py: Python<'_>) -> Vec<(String, String, String, Option<u64>)> {
    let mut rows = Vec::new();
    for entry in BACKENDS {
        let found = py.detach(entry.devices);
        for (i, d) in found.into_iter().enumerate() {
            rows.push((entry.device(i), d.name, d.backend, d.memory));
        }
    }
    rows
}
