//! The CPU backend: weights packed at load into the interleaved layouts of this CPU's
//! quantized kernels (picked at run time per instruction set, in tallow-quant), attention over
//! f16 pages in host memory, and every step's buffers from two arenas reused between steps.

mod attention;
mod bandwidth;
mod matrix;
mod ops;
mod pages;
mod scratch;
mod step;

use std::sync::Arc;

use tallow_backend::{
    Backend, BackendError, Capabilities, DeviceInfo, DeviceMemory, MatrixSpec, Rope, StepInput,
};
use tallow_gguf::GgufFile;
use tallow_kv::{KvDtype, KvLayout, LayerGroups};
use tallow_quant::GgmlType;

pub use bandwidth::read_bandwidth;
pub use matrix::Matrix;
pub use pages::{host_cache, HostPages, KvStorage};
pub use scratch::Scratch;
pub use step::CpuStep;

/// The CPU, with this machine's best kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuBackend {
    /// Repack the weight matrices that this CPU has packed kernels for into its interleaved
    /// layout ([`tallow_quant::PackedMatrix`]): faster products, as much memory as the
    /// file's copy (whose pages are then released). On by default.
    pub pack_weights: bool,
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend { pack_weights: true }
    }
}

impl Backend for CpuBackend {
    type Matrix = Matrix;
    type Vector = Vec<f32>;
    type Ropes = Vec<Rope>;
    type Pages = KvStorage;
    type Scratch = Scratch;
    type Step<'s> = CpuStep<'s>;

    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: format!("CPU ({})", tallow_quant::Isa::detected().name()),
            backend: "cpu".into(),
            memory: None,
        }
    }

    fn memory(&self) -> Option<DeviceMemory> {
        None
    }

    /// The compute threads' read of `bytes` ([`read_bandwidth`], best of three).
    fn read_rate(&self, bytes: usize) -> Result<f64, BackendError> {
        Ok(read_bandwidth(bytes, 3))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: "the CPU",
            weight_formats: GgmlType::WEIGHTS.to_vec(),
            kv_dtypes: KvDtype::ALL.to_vec(),
            max_head_dim: attention::MAX_HEAD_DIM,
            head_dim_multiple: 1,
            experts: true,
        }
    }

    fn upload_matrices(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Matrix>, BackendError> {
        let capabilities = self.capabilities();
        for spec in specs {
            capabilities.check_weights(&spec.tensor.name, spec.tensor.ty)?;
        }
        matrix::upload(file, specs, self.pack_weights)
    }

    fn upload_vector(&self, values: &[f32]) -> Result<Vec<f32>, BackendError> {
        Ok(values.to_vec())
    }

    fn upload_ropes(&self, ropes: Vec<Rope>) -> Result<Vec<Rope>, BackendError> {
        Ok(ropes)
    }

    fn new_pages(
        &self,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<KvStorage, BackendError> {
        Ok(KvStorage::grouped(layout, groups, n_pages)?)
    }

    fn run_step<F>(
        &self,
        scratch: &mut Scratch,
        input: &StepInput<'_, Self>,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: for<'s> FnOnce(&mut CpuStep<'s>) -> Result<(), BackendError>,
    {
        // The step's arithmetic flushes subnormals, on this thread and (as its loops follow
        // the caller) on the pool's.
        let _flush = tallow_threads::FlushSubnormals::new();
        let Scratch { step, layer } = scratch;
        let result = CpuStep::begin(step, layer, input).and_then(|mut s| f(&mut s));
        // Resets size the arenas to hold all that this step took, for the next.
        scratch::reset(step)?;
        scratch::reset(layer)?;
        result
    }
}
