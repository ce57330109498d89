//! The CUDA backend: weights uploaded once in their GGUF block formats, KV pages in device
//! memory, and each operation of a step a kernel of `kernels-cuda/`, launched by name on a
//! [`Gpu`]: an NVIDIA GPU through the driver, or the CPU through the emulation that runs the
//! same kernels in the tests.

#[cfg(feature = "driver")]
mod driver;
mod gpu;
mod kernels;
#[cfg(feature = "driver")]
mod nvrtc;
mod pages;
mod step;

use std::sync::Arc;

use tallow_backend::{
    Backend, BackendError, Capabilities, DeviceInfo, DeviceMemory, MatrixSpec, Rope, StepInput,
};
use tallow_gguf::GgufFile;
use tallow_kv::{KvDtype, KvLayout, LayerGroups};
use tallow_quant::GgmlType;

#[cfg(feature = "driver")]
pub use driver::{cubins, devices, kernel_usage, Driver, KernelUsage};
pub use gpu::{Args, DevicePtr, Gpu};
pub use kernels::SOURCES;
pub use pages::Pages;
pub use step::CudaStep;

use gpu::{bytes_of, Buffer, Device};

/// The weight formats the kernels read (formats.cuh).
pub const WEIGHT_FORMATS: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Most dimensions of an attention head (attention.cu).
pub const MAX_HEAD_DIM: usize = 256;

/// The CUDA backend on the device `G` drives.
pub struct CudaBackend<G: Gpu> {
    device: Arc<Device<G>>,
}

impl<G: Gpu> Clone for CudaBackend<G> {
    fn clone(&self) -> Self {
        CudaBackend {
            device: Arc::clone(&self.device),
        }
    }
}

impl<G: Gpu> CudaBackend<G> {
    /// The backend on `gpu`.
    pub fn new(gpu: G) -> Self {
        CudaBackend {
            device: Arc::new(Device::new(gpu)),
        }
    }

    /// The device.
    pub fn gpu(&self) -> &G {
        &self.device.gpu
    }
}

/// The bound of the rounding error of the products of `ty` weights, relative to their
/// magnitude `Σ|w·x|` (the conformance suite's `products_bound`). Products sum f32 values of
/// the decoded weights (a row's runs of 32 in f32). Those of the quantized formats
/// take the activations quantized to bytes a run of 32 (matvec.cu, tiles.cu), each rounded by
/// up to max|x| / 254, which a run with one large value makes large for the others: the CPU
/// backend's bound, as its products round the activations alike. The emulation's kernel
/// tests check those products exactly against the rounded activations.
pub fn products_bound(ty: GgmlType) -> f64 {
    if is_quantized(ty) {
        1.0 / 32.0
    } else {
        1e-5
    }
}

/// Whether `ty` is one of the quantized formats of [`WEIGHT_FORMATS`], whose products are
/// the integer kernels' (formats.cuh's FOR_EACH_QUANTIZED_FORMAT); the others are floats.
pub fn is_quantized(ty: GgmlType) -> bool {
    WEIGHT_FORMATS.contains(&ty) && !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// A weight matrix in its GGUF block format, row after row.
pub struct Matrix<G: Gpu> {
    buffer: Buffer<G>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// A vector of f32.
pub struct Vector<G: Gpu> {
    buffer: Buffer<G>,
    len: usize,
}

/// Nothing is kept between steps: each step's buffers are its own.
#[derive(Debug, Default)]
pub struct Scratch;

impl<G: Gpu> Backend for CudaBackend<G> {
    type Matrix = Matrix<G>;
    type Vector = Vector<G>;
    type Ropes = Vec<Rope>;
    type Pages = Pages<G>;
    type Scratch = Scratch;
    type Step<'s> = CudaStep<'s, G>;

    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.device.gpu.name(),
            backend: "cuda".into(),
            memory: self.device.gpu.total_memory(),
        }
    }

    fn memory(&self) -> Option<DeviceMemory> {
        let (in_use, peak) = self.device.usage.now();
        Some(DeviceMemory { in_use, peak })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "cuda",
            weight_formats: WEIGHT_FORMATS.to_vec(),
            kv_dtypes: vec![KvDtype::F16, KvDtype::Q8_0],
            max_head_dim: MAX_HEAD_DIM,
            head_dim_multiple: 1,
            experts: true,
        }
    }

    fn upload_matrices(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Matrix<G>>, BackendError> {
        specs
            .iter()
            .map(|spec| self.upload_matrix(file, spec))
            .collect()
    }

    fn upload_vector(&self, values: &[f32]) -> Result<Vector<G>, BackendError> {
        Ok(Vector {
            buffer: Buffer::with(&self.device, &bytes_of(values))?,
            len: values.len(),
        })
    }

    fn upload_ropes(&self, ropes: Vec<Rope>) -> Result<Vec<Rope>, BackendError> {
        Ok(ropes)
    }

    fn new_pages(
        &self,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Pages<G>, BackendError> {
        let capabilities = self.capabilities();
        capabilities.check_kv(layout.dtype)?;
        capabilities.check_head_dim(layout.head_dim)?;
        Pages::new(&self.device, layout, groups, n_pages)
    }

    fn run_step<F>(
        &self,
        _: &mut Scratch,
        input: &StepInput<'_, Self>,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: for<'s> FnOnce(&mut CudaStep<'s, G>) -> Result<(), BackendError>,
    {
        let mut step = CudaStep::new(&self.device, input)?;
        f(&mut step)
    }
}

impl<G: Gpu> CudaBackend<G> {
    fn upload_matrix(
        &self,
        file: &Arc<GgufFile>,
        spec: &MatrixSpec,
    ) -> Result<Matrix<G>, BackendError> {
        let ty = spec.tensor.ty;
        // The kernels take rows a run of 32 values at a time.
        if !WEIGHT_FORMATS.contains(&ty) || !spec.cols.is_multiple_of(ty.block_len().max(32)) {
            return Err(BackendError::Unsupported(format!(
                "{} ({} weights, rows of {}) on cuda",
                spec.tensor.name,
                ty.name(),
                spec.cols
            )));
        }
        let data = file.tensor_data(&spec.tensor);
        Ok(Matrix {
            buffer: Buffer::with(&self.device, data)?,
            ty,
            rows: spec.rows,
            cols: spec.cols,
            row_bytes: data.len() / spec.rows.max(1),
        })
    }
}
