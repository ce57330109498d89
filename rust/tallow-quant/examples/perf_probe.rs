// THROWAWAY perf probe (to be deleted).
use std::time::Instant;
use tallow_quant::{matmul, quantize_row, GgmlType, QuantizedActs};

fn main() {
    let (rows, cols) = (4096usize, 4096usize);
    let mut seed = 1u64;
    let mut next = || { seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (seed >> 33) as u32 };
    let x: Vec<f32> = (0..cols * 64).map(|_| (next() % 2000) as f32 / 1000.0 - 1.0).collect();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16] {
        let row_bytes = cols / ty.block_len() * ty.block_bytes();
        let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| next() as u8).collect();
        // finite small scales
        let fields: &[usize] = match ty { GgmlType::Q4_0 | GgmlType::Q8_0 => &[0], GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2], GgmlType::Q6_K => &[208], _ => &[] };
        for b in w.chunks_exact_mut(ty.block_bytes()) { for &f in fields { b[f..f+2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes()); } }
        if ty == GgmlType::F16 { for b in w.chunks_exact_mut(2) { b.copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes()); } }
        for n_tokens in [1usize, 64] {
            let mut acts = QuantizedActs::new();
            let t0 = Instant::now();
            acts.quantize(ty.vec_dot_type(), &x[..n_tokens * cols], n_tokens, cols).unwrap();
            let tq = t0.elapsed();
            let mut out = vec![0f32; rows * n_tokens];
            matmul(ty, &w, rows, cols, &acts, &mut out).unwrap();
            let reps = if n_tokens == 1 { 20 } else { 2 };
            let t0 = Instant::now();
            for _ in 0..reps { matmul(ty, &w, rows, cols, &acts, &mut out).unwrap(); }
            let dt = t0.elapsed().as_secs_f64() / reps as f64;
            let gmacs = (rows * cols * n_tokens) as f64 / dt / 1e9;
            println!("{ty:5} tokens={n_tokens:3} matmul {:8.3} ms  {:6.1} GMAC/s  {:6.2} GB/s weights  quantize {:7.1} us", dt * 1e3, gmacs, (rows * row_bytes) as f64 / dt / 1e9 * if n_tokens == 1 {1.0} else {0.0}, tq.as_secs_f64()*1e6);
        }
    }
    let _ = quantize_row;
    println!("isa {:?} threads {}", tallow_quant::Isa::detected(), rayon::current_num_threads());
}
