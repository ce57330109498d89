//! The conformance suite on the CUDA backend, its kernels run by the emulation: every
//! operation in every weight format it reads, against the suite's f64 references.

use tallow_backend_cuda::CudaBackend;
use tallow_conformance::{suite, Family, Subject};
use tallow_cuda_emulation::Emulated;
use tallow_quant::GgmlType;

struct Cuda;

impl Subject for Cuda {
    type Backend = CudaBackend<Emulated>;

    fn variants(_: Family) -> impl Iterator<Item = CudaBackend<Emulated>> {
        std::iter::once(Emulated::backend())
    }

    fn capped(_: u64) -> Option<CudaBackend<Emulated>> {
        None
    }

    fn describe(_: &CudaBackend<Emulated>) -> String {
        "cuda (emulated)".into()
    }

    fn products_bound(_: &CudaBackend<Emulated>, ty: GgmlType) -> f64 {
        tallow_backend_cuda::products_bound(ty)
    }
}

suite!(Cuda);
