//! The conformance suite on the first adapter wgpu finds (Mesa's llvmpipe where there is no
//! GPU): every operation in every weight format and KV page type, against the suite's f64
//! references, with the kernels laid out for a GPU and for a software adapter, attention split
//! between blocks and not, and matrices and logits cut where buffers are capped.

use tallow_backend_wgpu::{WgpuBackend, WgpuOptions};
use tallow_conformance::{suite, Family, Subject};
use tallow_quant::GgmlType;

struct Wgpu;

fn open(options: WgpuOptions) -> WgpuBackend {
    tallow_backend_wgpu::open_with(0, options)
        .unwrap_or_else(|e| panic!("{e} (install mesa-vulkan-drivers)"))
}

impl Subject for Wgpu {
    type Backend = WgpuBackend;

    fn variants(family: Family) -> impl Iterator<Item = WgpuBackend> {
        let default = open(WgpuOptions::default());
        let variants: Vec<WgpuBackend> = match family {
            // The other layout of the products than the adapter's.
            Family::Products => {
                let other = !default.gpu().software_layout();
                let software = Some(other);
                let other = open(WgpuOptions {
                    software,
                    ..WgpuOptions::default()
                });
                assert_eq!(other.gpu().software_layout(), software == Some(true));
                vec![default, other]
            }
            // Attention split between blocks even over the suite's short contexts.
            Family::Reductions => vec![default.clone(), default.with_attention_span(16)],
            Family::Other => vec![default],
        };
        variants.into_iter()
    }

    fn capped(bytes: u64) -> Option<WgpuBackend> {
        Some(open(WgpuOptions {
            max_part: Some(bytes as usize),
            ..WgpuOptions::default()
        }))
    }

    fn describe(backend: &WgpuBackend) -> String {
        format!(
            "wgpu, kernels for a {}, attention split every {}",
            if backend.gpu().software_layout() {
                "software adapter"
            } else {
                "GPU"
            },
            backend.attention_span()
        )
    }

    fn products_bound(backend: &WgpuBackend, ty: GgmlType) -> f64 {
        backend.products_bound(ty)
    }
}

suite!(Wgpu);
