//! Tests of the kernels against their references and of the formats against their error
//! bounds. Random data comes from a seeded generator, so failures reproduce.

mod accuracy;
mod acts;
mod dequantize;
mod golden;
mod kernels;
mod matmul;
mod packed;
