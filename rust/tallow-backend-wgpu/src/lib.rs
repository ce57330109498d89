//! The wgpu backend: NVIDIA, AMD and Intel GPUs through Vulkan, Apple GPUs through Metal,
//! Windows through DX12, and Mesa's software rasterizer (llvmpipe) where there is no GPU.
//! Weights stay in their GGUF block formats in GPU memory and the WGSL kernels (the
//! repository's `kernels-wgsl/`) read them as they are; a step's operations are recorded into
//! one command encoder and the logits alone come back to the host.

mod device;
mod gpu;
mod kernels;
mod matrix;
mod pages;
mod profile;
mod step;

use std::sync::Arc;

use tallow_backend::{
    Backend, BackendError, Capabilities, DeviceInfo, DeviceMemory, MatrixSpec, Rope, StepInput,
};
use tallow_gguf::GgufFile;
use tallow_kv::{KvDtype, KvLayout, LayerGroups};

pub use device::devices;
pub use kernels::weight_formats;
pub use matrix::Matrix;
pub use pages::Pages;
pub use step::{Rows, Scratch, WgpuStep};

use gpu::Gpu;
use kernels::{Kernels, ProductShape};

/// The largest attention head the attention kernel takes (its workgroup memory holds one
/// query head).
const MAX_HEAD_DIM: usize = 512;

/// One GPU, through wgpu.
#[derive(Clone)]
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    kernels: Arc<Kernels>,
    /// The most bytes of one part of a matrix (larger ones are split by rows) or of one block
    /// of logits.
    max_part: u64,
    /// Whether each step prints its kernels' GPU times (see profile.rs).
    profile: bool,
}

/// How [`WgpuBackend::open_with`] opens a GPU. The default takes everything it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgpuOptions {
    /// The most bytes of one part of a weight matrix (larger ones are split by rows) and of one
    /// block of logits; the adapter's binding limit where that is less.
    pub max_part: u64,
    /// Workgroup reductions (norms, attention's softmax, argmax) with subgroup operations
    /// where the adapter has them; through workgroup memory otherwise.
    pub subgroups: bool,
    /// Products of quantized weights in f16 arithmetic where the adapter has it (see
    /// matmul.wgsl); in f32 otherwise.
    pub f16: bool,
    /// Each step prints the GPU time of each kernel to stderr (needs timestamp queries).
    pub profile: bool,
    /// Whether the invocations of a product split each row's weights between them (true: the
    /// shape for GPUs) or take whole rows each (false: for software adapters, whose
    /// invocations are a CPU's SIMD lanes); `None` picks by the adapter (see matmul.wgsl).
    pub split_products: Option<bool>,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            max_part: u64::MAX,
            subgroups: true,
            f16: true,
            profile: false,
            split_products: None,
        }
    }
}

impl WgpuBackend {
    /// Opens GPU `index` of [`devices`].
    pub fn open(index: usize) -> Result<Self, BackendError> {
        Self::open_with(index, WgpuOptions::default())
    }

    /// Opens GPU `index` of [`devices`] as `options` say.
    pub fn open_with(index: usize, options: WgpuOptions) -> Result<Self, BackendError> {
        let mut wanted = wgpu::Features::empty();
        wanted.set(wgpu::Features::SUBGROUP, options.subgroups);
        wanted.set(wgpu::Features::SHADER_F16, options.f16);
        wanted.set(wgpu::Features::TIMESTAMP_QUERY, options.profile);
        let gpu = device::open(index, wanted)?;
        let features = gpu.device.features();
        if options.profile && !features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(BackendError::Unsupported(format!(
                "profiling on {}: it has no timestamp queries",
                gpu.info.name
            )));
        }
        let shape = if options.split_products.unwrap_or(!gpu.software) {
            ProductShape::SPLIT
        } else {
            ProductShape::WHOLE
        };
        Ok(WgpuBackend {
            max_part: gpu.max_binding.min(options.max_part),
            profile: options.profile,
            gpu: Arc::new(gpu),
            kernels: Arc::new(Kernels::new(
                features.contains(wgpu::Features::SUBGROUP),
                features.contains(wgpu::Features::SHADER_F16),
                shape,
            )),
        })
    }

    /// Whether its reductions use subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.kernels.subgroups()
    }

    /// Whether the invocations of its products split each row's weights (see
    /// [`WgpuOptions::split_products`]).
    pub fn splits_products(&self) -> bool {
        self.kernels.product_shape() == ProductShape::SPLIT
    }

    /// Whether its products of quantized weights compute in f16.
    pub fn uses_f16(&self) -> bool {
        self.kernels.f16()
    }
}

impl Backend for WgpuBackend {
    type Matrix = Matrix;
    type Vector = Rows;
    type Ropes = Vec<Rope>;
    type Pages = Pages;
    type Scratch = Scratch;
    type Step<'s> = WgpuStep<'s>;

    fn device(&self) -> DeviceInfo {
        self.gpu.info.clone()
    }

    fn memory(&self) -> Option<DeviceMemory> {
        Some(self.gpu.memory())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "wgpu",
            weight_formats: weight_formats().collect(),
            kv_dtypes: vec![KvDtype::F16],
            max_head_dim: MAX_HEAD_DIM,
            head_dim_multiple: 2,
            experts: true,
        }
    }

    fn upload_matrices(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Matrix>, BackendError> {
        let mut matrices = Vec::with_capacity(specs.len());
        let mut start = 0;
        while start < specs.len() {
            let len = 1
                + (specs[start + 1..].iter().zip(&specs[start..]))
                    .take_while(|(spec, prev)| spec.follows(prev))
                    .count();
            let stack = &specs[start..start + len];
            matrices.extend(matrix::upload_stack(&self.gpu, file, stack, self.max_part)?);
            start += len;
        }
        // Reading a matrix maps the file's pages around it too, some of them a neighbour's
        // already released: a last sweep gives back every matrix's pages.
        for spec in specs {
            file.release(&spec.tensor, 0..spec.tensor.size as usize);
        }
        Ok(matrices)
    }

    fn upload_vector(&self, values: &[f32]) -> Result<Rows, BackendError> {
        step::upload(&self.gpu, values)
    }

    fn upload_ropes(&self, ropes: Vec<Rope>) -> Result<Vec<Rope>, BackendError> {
        Ok(ropes)
    }

    fn new_pages(
        &self,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Pages, BackendError> {
        let capabilities = self.capabilities();
        capabilities.check_kv(layout.dtype)?;
        capabilities.check_head_dim(layout.head_dim)?;
        Pages::new(Arc::clone(&self.gpu), layout, groups, n_pages)
    }

    fn run_step<F>(
        &self,
        scratch: &mut Scratch,
        input: &StepInput<'_, Self>,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: for<'s> FnOnce(&mut WgpuStep<'s>) -> Result<(), BackendError>,
    {
        let mut step = WgpuStep::begin(self, scratch, input)?;
        f(&mut step)?;
        step.finish()
    }
}
