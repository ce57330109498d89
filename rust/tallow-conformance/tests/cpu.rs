//! The conformance suite on the CPU backend: its products with weights packed for this CPU's
//! kernels and as the file holds them, every other operation as it runs by default.

use tallow_backend::Backend;
use tallow_backend_cpu::CpuBackend;
use tallow_conformance::{suite, Family, Subject};
use tallow_quant::GgmlType;

struct Cpu;

impl Subject for Cpu {
    type Backend = CpuBackend;

    fn variants(family: Family) -> impl Iterator<Item = CpuBackend> {
        let packings: &[bool] = match family {
            Family::Products => &[true, false],
            Family::Reductions | Family::Other => &[true],
        };
        packings
            .iter()
            .map(|&pack_weights| CpuBackend { pack_weights })
    }

    fn capped(_: u64) -> Option<CpuBackend> {
        None
    }

    fn describe(backend: &CpuBackend) -> String {
        format!("{}, packed {}", backend.device().name, backend.pack_weights)
    }

    /// Weights other than F32 meet activations rounded to 8-bit blocks (Q8_0, or Q8_K for
    /// the K-quants) or to 16-bit floats, as llama.cpp's CPU backend does: each activation
    /// moves by up to half a step of its block's scale (within 1.3% of the magnitude on the
    /// suite's inputs).
    fn products_bound(_: &CpuBackend, ty: GgmlType) -> f64 {
        match ty {
            GgmlType::F32 => 1e-6,
            _ => 1.0 / 32.0,
        }
    }
}

suite!(Cpu);
