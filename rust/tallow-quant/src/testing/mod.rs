//! Reproducible random data in every format, for the tests of this crate and of the crates
//! whose kernels read these formats (the `testing` feature).

mod data;
mod rng;

pub use data::{
    dequantized, e8m0_fields, exact_dot, extreme_blocks, f16_fields, iq1m_scale, magnitude,
    random_acts, random_blocks, set_iq1m_scale,
};
pub use rng::Rng;
