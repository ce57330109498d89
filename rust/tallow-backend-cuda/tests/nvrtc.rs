//! NVRTC, loaded at run time, compiles every kernel source to a cubin for each generation from
//! Turing to Blackwell, each kernel the backend launches in it under its own name (no GPU or
//! driver needed; the test script points `TALLOW_NVRTC` at the PyPI wheel's library), and no
//! kernel spills registers to local memory on Ampere or Hopper (ptxas's report:
//! `cargo run -p tallow-backend-cuda --features driver --example kernel_usage` prints it).

use tallow_backend_cuda::{cubins, kernel_usage, product, SOURCES};
use tallow_backend_gpu::kernels;

/// Every kernel the backend launches on CUDA, by name: the cubins must export each
/// (`extern "C"`).
fn kernel_names() -> Vec<String> {
    kernels::names(product, true)
}

#[test]
fn every_kernel_compiles_for_each_generation() {
    let kernels = SOURCES.iter().filter(|(n, _)| n.ends_with(".cu")).count();
    for arch in [75, 80, 86, 89, 90, 120] {
        let compiled = cubins(arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        assert_eq!(compiled.len(), kernels);
        for (source, cubin) in &compiled {
            assert_eq!(&cubin[..4], b"\x7fELF", "{source} for sm_{arch}");
        }
        for name in kernel_names() {
            let symbol = format!("\0{name}\0").into_bytes();
            let exported =
                (compiled.iter()).any(|(_, c)| c.windows(symbol.len()).any(|w| w == symbol));
            assert!(exported, "{name} for sm_{arch}");
        }
    }
}

#[test]
fn no_kernel_spills_registers_on_ampere_or_hopper() {
    for arch in [80, 90] {
        let usage = kernel_usage(arch).unwrap();
        let mut reported: Vec<&str> = usage.iter().map(|k| k.kernel.as_str()).collect();
        reported.sort();
        let mut launched = kernel_names();
        launched.sort();
        assert_eq!(reported, launched, "sm_{arch}");
        for k in &usage {
            assert!(k.registers > 0, "{k:?}");
            assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "sm_{arch}: {k:?}");
        }
    }
}
