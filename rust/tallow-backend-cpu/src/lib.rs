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

pub use bandwidth::{read_bandwidth, ReadProbe};
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

/// The flush is x86's (see `tallow_threads::FlushSubnormals`).
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tallow_backend::{Backend, Batch, Heads, Logits, StepInput, StepPlan};
    use tallow_kv::{KvLayout, LayerGroups, PagedKvCache, SeqId};

    use super::{CpuBackend, KvStorage, Scratch};

    /// Whether this thread writes zero for a subnormal result.
    fn flushes() -> bool {
        black_box(f32::MIN_POSITIVE) / black_box(2.0) == 0.0
    }

    #[test]
    fn a_step_flushes_subnormals_on_every_thread_and_only_while_it_runs() {
        let layout = KvLayout::new(1, 1, 64);
        let groups = LayerGroups::global(1).unwrap();
        let storage = KvStorage::grouped(layout, &groups, 1).unwrap();
        let mut cache = PagedKvCache::over(groups, storage).unwrap();
        let seq = cache.create();
        cache.append_slots(seq, 4).unwrap();
        let mut batch = Batch::new();
        batch.push(SeqId(0), &[1, 2, 3, 4], Logits::None);
        let mut plan = StepPlan::new();
        plan.build(&batch, &cache).unwrap();
        let backend = CpuBackend::default();
        let ropes = backend.upload_ropes(Vec::new()).unwrap();
        let input = StepInput {
            batch: &batch,
            plan: &plan,
            heads: Heads {
                n_head: 1,
                n_head_kv: 1,
                head_dim: 64,
            },
            page_size: 16,
            ropes: &ropes,
            draws: None,
        };
        let flushed = AtomicUsize::new(0);
        assert!(!flushes());
        backend
            .run_step(&mut Scratch::default(), &input, |_| {
                assert!(flushes(), "the step's thread flushes");
                tallow_threads::global().run(32, &|_, _| {
                    if flushes() {
                        flushed.fetch_add(1, Ordering::Relaxed);
                    }
                });
                Ok(())
            })
            .unwrap();
        assert_eq!(flushed.into_inner(), 32, "so does every task of its loops");
        assert!(!flushes(), "the thread's own mode is back after the step");
    }
}
