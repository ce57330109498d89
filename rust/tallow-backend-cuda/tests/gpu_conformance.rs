//! The conformance suite on a real NVIDIA GPU: the CUDA backend over the driver, its kernels
//! compiled by NVRTC for the device, against the suite's f64 references. It needs a GPU, so
//! `cargo test` leaves it out (`test = false`); run it where there is one with
//! `cargo test --release --features driver --test gpu_conformance` (device 0, or
//! `TALLOW_CUDA_DEVICE=N`).

use tallow_backend_cuda::CudaBackend;
use tallow_conformance::{suite, Family, Subject};
use tallow_quant::GgmlType;

struct RealGpu;

fn ordinal() -> usize {
    std::env::var("TALLOW_CUDA_DEVICE").map_or(0, |n| {
        n.parse().expect("TALLOW_CUDA_DEVICE: a GPU's number")
    })
}

impl Subject for RealGpu {
    type Backend = CudaBackend;

    fn variants(family: Family) -> impl Iterator<Item = CudaBackend> {
        let backend = tallow_backend_cuda::open(ordinal())
            .unwrap_or_else(|e| panic!("no CUDA device to test: {e}"));
        // Attention split between blocks even over the suite's short contexts.
        let split = (family == Family::Reductions).then(|| backend.clone().with_attention_span(16));
        std::iter::once(backend).chain(split)
    }

    fn capped(_: u64) -> Option<CudaBackend> {
        None
    }

    fn describe(backend: &CudaBackend) -> String {
        let span = backend.attention_span();
        format!("cuda:{}, attention split every {span}", ordinal())
    }

    fn products_bound(backend: &CudaBackend, ty: GgmlType) -> f64 {
        backend.products_bound(ty)
    }
}

suite!(RealGpu);
