//! One-token row products of the formats named on the command line, timed as
//! `benches/ggml_vec_dot.c` times llama.cpp's: 576 rows of 1536 random values against one
//! token, the median of 2001 products, on the calling thread with the best kernels of this
//! CPU (`TALLOW_ISA` caps them).
//!
//! ```text
//! TALLOW_NUM_THREADS=1 cargo run --release -p tallow-quant --features testing \
//!     --example row_products -- IQ2_XXS IQ3_S Q3_K
//! ```

use std::time::Instant;

use tallow_quant::{matmul_with, testing, ActsBuffer, GgmlType, Isa};

const ROWS: usize = 576;
const COLS: usize = 1536;
const RUNS: usize = 2001;

fn main() {
    let isa = Isa::detected();
    for name in std::env::args().skip(1) {
        let Some(ty) = GgmlType::WEIGHTS.into_iter().find(|t| t.name() == name) else {
            eprintln!("unknown weight format {name}");
            std::process::exit(2);
        };
        let mut rng = testing::Rng::new(0x70c5);
        let w = testing::random_blocks(&mut rng, ty, ROWS * COLS / ty.block_len());
        let x: Vec<f32> = (0..COLS).map(|_| rng.range(-1.0, 1.0)).collect();
        let mut buffer = ActsBuffer::new();
        let acts = buffer.quantize(ty.vec_dot_type(), &x, 1, COLS).unwrap();
        let mut out = vec![0f32; ROWS];
        let mut times: Vec<f64> = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                matmul_with(isa, ty, &w, ROWS, COLS, &acts, &mut out).unwrap();
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let median = times[RUNS / 2];
        println!(
            "{name:<8} {isa:?}: {:8.2} us per product, {:.2} ns per 32 values",
            median * 1e6,
            median * 1e9 / (ROWS * COLS / 32) as f64
        );
    }
}
