//! Reproducible random data in every format, for the tests of this crate and of the crates
//! whose kernels read these formats (the `testing` feature).

mod data;
mod rng;

pub use data::{
    dequantized, e8m0_fields, exact_dot, extreme_blocks, f16_fields, iq1m_scale, magnitude,
    random_acts, random_blocks, set_iq1m_scale,
};
pub use rng::Rng;

/// The codebooks of the IQ1, IQ2 and IQ3 formats as the CPU's kernels read them, by their
/// names in ggml (upper case): values per entry (4 or 8, a byte each), and the entries, each
/// widened to a u64. What other copies (the GPU kernels') must hold.
pub fn codebooks() -> Vec<(&'static str, usize, Vec<u64>)> {
    use crate::blocks::grids::*;
    let wide = |grid: &[u32]| grid.iter().map(|&e| u64::from(e)).collect();
    vec![
        ("IQ2XXS_GRID", 8, IQ2XXS_GRID.to_vec()),
        ("IQ2XS_GRID", 8, IQ2XS_GRID.to_vec()),
        ("IQ2S_GRID", 8, IQ2S_GRID.to_vec()),
        ("IQ3XXS_GRID", 4, wide(&IQ3XXS_GRID)),
        ("IQ3S_GRID", 4, wide(&IQ3S_GRID)),
        ("IQ1S_GRID", 8, IQ1S_GRID.to_vec()),
    ]
}
