//! The conformance suite on the GPU backend with each API's kernels run by the emulation
//! (CUDA's and Metal's): every operation in every weight format it reads, against the
//! suite's f64 references.

use tallow_backend_gpu::GpuBackend;
use tallow_conformance::{Family, Subject};
use tallow_gpu_emulation::{Api, Emulated};
use tallow_quant::GgmlType;

/// The backend with `API`'s kernels on an emulated device.
struct Kernels<const API: u8>;

const CUDA: u8 = 0;
const METAL: u8 = 1;

fn api(id: u8) -> Api {
    match id {
        CUDA => Api::Cuda,
        _ => Api::Metal,
    }
}

impl<const API: u8> Subject for Kernels<API> {
    type Backend = GpuBackend<Emulated>;

    fn variants(family: Family) -> impl Iterator<Item = GpuBackend<Emulated>> {
        let backend = Emulated::backend(api(API));
        // Attention split between blocks even over the suite's short contexts.
        let split = (family == Family::Reductions).then(|| backend.clone().with_attention_span(16));
        std::iter::once(backend).chain(split)
    }

    fn capped(_: u64) -> Option<GpuBackend<Emulated>> {
        None
    }

    fn describe(backend: &GpuBackend<Emulated>) -> String {
        let span = backend.attention_span();
        format!(
            "{} (emulated), attention split every {span}",
            api(API).name()
        )
    }

    fn products_bound(backend: &GpuBackend<Emulated>, ty: GgmlType) -> f64 {
        backend.products_bound(ty)
    }
}

mod cuda {
    tallow_conformance::suite!(super::Kernels<{ super::CUDA }>);
}

mod metal {
    tallow_conformance::suite!(super::Kernels<{ super::METAL }>);
}
