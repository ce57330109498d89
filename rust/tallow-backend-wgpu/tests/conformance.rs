//! The conformance suite on the first adapter wgpu finds (Mesa's llvmpipe where there is no
//! GPU): products in f16 and in f32, each with rows split between a workgroup's invocations
//! and whole rows per invocation (matmul.wgsl); reductions in subgroup operations and in
//! workgroup memory; matrices and logits split where buffers are capped.

use tallow_backend_wgpu::{WgpuBackend, WgpuOptions};
use tallow_conformance::{suite, Family, Subject};
use tallow_quant::GgmlType;

struct Wgpu;

fn open(options: WgpuOptions) -> WgpuBackend {
    WgpuBackend::open_with(0, options)
        .unwrap_or_else(|e| panic!("{e} (install mesa-vulkan-drivers)"))
}

impl Subject for Wgpu {
    type Backend = WgpuBackend;

    fn variants(family: Family) -> impl Iterator<Item = WgpuBackend> {
        let default = WgpuOptions::default();
        let options: Vec<WgpuOptions> = match family {
            Family::Products => [(true, true), (true, false), (false, true), (false, false)]
                .into_iter()
                .map(|(f16, split)| WgpuOptions {
                    f16,
                    split_products: Some(split),
                    ..default
                })
                .collect(),
            // llvmpipe has subgroup operations: both ways run.
            Family::Reductions => [true, false]
                .into_iter()
                .map(|subgroups| WgpuOptions {
                    subgroups,
                    ..default
                })
                .collect(),
            Family::Other => vec![default],
        };
        options.into_iter().map(|options| {
            let gpu = open(options);
            assert_eq!(gpu.uses_f16(), options.f16);
            assert_eq!(gpu.uses_subgroups(), options.subgroups);
            if let Some(split) = options.split_products {
                assert_eq!(gpu.splits_products(), split);
            }
            gpu
        })
    }

    fn capped(bytes: u64) -> Option<WgpuBackend> {
        Some(open(WgpuOptions {
            max_part: bytes,
            ..WgpuOptions::default()
        }))
    }

    fn describe(gpu: &WgpuBackend) -> String {
        format!(
            "f16 {}, split products {}, subgroups {}",
            gpu.uses_f16(),
            gpu.splits_products(),
            gpu.uses_subgroups()
        )
    }

    /// Six f16 roundings where products compute in f16 (F32 weights never do), a few f32
    /// ones otherwise (matmul.wgsl).
    fn products_bound(gpu: &WgpuBackend, ty: GgmlType) -> f64 {
        if gpu.uses_f16() && ty != GgmlType::F32 {
            6.0 / 4096.0
        } else {
            1e-6
        }
    }
}

suite!(Wgpu);
