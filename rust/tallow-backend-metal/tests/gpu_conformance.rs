//! The conformance suite on a real Apple GPU: the Metal backend, its kernels compiled for the
//! device, against the suite's f64 references. It needs a Mac, so `cargo test` leaves it out
//! (`test = false`); run it there with
//! `cargo test --release -p tallow-backend-metal --test gpu_conformance`.

#[cfg(target_os = "macos")]
mod on_a_mac {
    use tallow_backend_metal::{Metal, MetalBackend};
    use tallow_conformance::{suite, Family, Subject};
    use tallow_quant::GgmlType;

    struct RealGpu;

    impl Subject for RealGpu {
        type Backend = MetalBackend;

        fn variants(family: Family) -> impl Iterator<Item = MetalBackend> {
            let metal = Metal::open().unwrap_or_else(|e| panic!("no Metal GPU to test: {e}"));
            let backend = MetalBackend::new(metal);
            // Attention split between threadgroups even over the suite's short contexts.
            let split =
                (family == Family::Reductions).then(|| backend.clone().with_attention_span(16));
            std::iter::once(backend).chain(split)
        }

        fn capped(_: u64) -> Option<MetalBackend> {
            None
        }

        fn describe(backend: &MetalBackend) -> String {
            format!("metal, attention split every {}", backend.attention_span())
        }

        fn products_bound(backend: &MetalBackend, ty: GgmlType) -> f64 {
            backend.products_bound(ty)
        }
    }

    suite!(RealGpu);
}
