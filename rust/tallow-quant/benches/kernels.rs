//! Criterion benches of the tallow-quant kernels: matvec (one token) and matmul (16 and 128
//! tokens) for every weight format, each beside its scalar reference (`Isa::Scalar`), plus
//! activation quantization and dequantization. Throughput is reported to criterion in bytes
//! (weight bytes for products and dequantize, f32 input bytes for activation quantization).
//! Formats that can be packed ([`PackedMatrix`]) get a third line, the packed layout's
//! kernels. After the run a summary table adds GFLOP/s (2 * rows * cols * tokens / time) and
//! the speedup over the scalar reference. See `benches/README.md`.
//!
//! `cargo bench -p tallow-quant --bench kernels` runs everything in a few minutes; pass a
//! criterion filter (`-- matvec_1536`) or `--quick` for less.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use tallow_quant::{
    dequantize, matmul_with, quantize_row, testing, ActsBuffer, GgmlType, Isa, PackedMatrix,
    QuantizedActs, PACKED_FORMATS,
};

/// (rows, cols): SmolLM2-135M's FFN down projection (1536 -> 576; its inputs must be whole
/// 256-element K-quant blocks, which the 576-wide hidden state is not), and a 7B-sized
/// square matrix whose weights do not fit in any cache.
const SMALL: (usize, usize) = (576, 1536);
const LARGE: (usize, usize) = (4096, 4096);
/// Token counts of the matmul groups (batched decode and a prefill chunk), at `SMALL`.
const MATMUL_TOKENS: [usize; 2] = [16, 128];
/// (rows, cols) of the streamed group: SmolLM2-135M's output matrix (49152 x 576). The other
/// groups' matrices stay in the L3 cache from one iteration to the next; this one cycles
/// through copies of itself, at least `STREAM_BYTES` in all (twice the largest L3 cache of the
/// machines it runs on, a 480 MiB one), so that its weights come from memory as a 1B-8B model's
/// do in decode.
const STREAMED: (usize, usize) = (49152, 576);
/// The streamed shape for the K-quants, whose rows are whole blocks of 256: as many weights.
const STREAMED_K: (usize, usize) = (36864, 768);
const STREAM_BYTES: usize = 1 << 30;
/// (rows, cols) of the prefill group: a 1B Llama's FFN up (or gate) and down projections,
/// against [`PREFILL_TOKENS`] tokens, the weights and activations of a real prompt's products
/// (the activations of the down projection, 8192 wide, do not fit in a 2 MiB L2 cache).
const PREFILL: [(usize, usize); 2] = [(8192, 2048), (2048, 8192)];
const PREFILL_TOKENS: usize = 512;

/// SplitMix64: reproducible data without extra crates.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed_unit()).collect()
    }
}

fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_len() * ty.block_bytes()
}

/// A `rows` x `cols` weight matrix of `ty`: random floats in [-1, 1) through the crate's own
/// `quantize_row` where it has one, otherwise (K-quants, the codebook formats) random blocks
/// with finite scales (`tallow_quant::testing`).
fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = row_bytes(ty, cols);
    if quantize_row(ty, &[0.0; 256], &mut vec![0; row_bytes(ty, 256)]).is_err() {
        let mut blocks_rng = testing::Rng::new(rng.next_u64());
        return testing::random_blocks(&mut blocks_rng, ty, rows * cols / ty.block_len());
    }
    let mut out = vec![0u8; rows * rb];
    let mut x = vec![0f32; cols];
    for row in out.chunks_exact_mut(rb) {
        x.iter_mut().for_each(|v| *v = rng.signed_unit());
        quantize_row(ty, &x, row).unwrap();
    }
    out
}

/// Activations for weights of type `ty`, in buffers kept for the whole run.
fn acts(ty: GgmlType, n_tokens: usize, cols: usize, rng: &mut Rng) -> QuantizedActs<'static> {
    let buffer = Box::leak(Box::new(ActsBuffer::new()));
    let x = rng.floats(n_tokens * cols);
    buffer
        .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
        .unwrap()
}

/// One benchmark's line in the summary: what it moves and computes per iteration, and the
/// per-iteration time of every batch criterion timed.
struct Record {
    group: String,
    format: &'static str,
    variant: String,
    bytes: u64,
    /// Floating-point operations (2 per multiply-add) of a product.
    flops: Option<f64>,
    /// Elements converted, for quantize and dequantize.
    elements: Option<u64>,
    per_iter: Vec<f64>,
}

impl Record {
    /// The median per-iteration time in seconds; robust to criterion's warm-up batches.
    fn seconds(&self) -> Option<f64> {
        let mut t = self.per_iter.clone();
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied()
    }
}

#[derive(Default)]
struct Summary(Vec<Record>);

impl Summary {
    /// Benchmarks `f` in `g` as `format/variant`, with `bytes` of throughput, recording
    /// its times for the summary.
    #[allow(clippy::too_many_arguments)]
    fn bench(
        &mut self,
        g: &mut BenchmarkGroup<'_, WallTime>,
        group: &str,
        format: &'static str,
        variant: &str,
        bytes: u64,
        flops: Option<f64>,
        elements: Option<u64>,
        mut f: impl FnMut(),
    ) {
        let mut per_iter = Vec::new();
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new(format, variant), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    f();
                }
                let elapsed = start.elapsed();
                per_iter.push(elapsed.as_secs_f64() / iters.max(1) as f64);
                elapsed
            })
        });
        self.0.push(Record {
            group: group.to_owned(),
            format,
            variant: variant.to_owned(),
            bytes,
            flops,
            elements,
            per_iter,
        });
    }

    /// Prints one Markdown table: time, GB/s, GFLOP/s or Gelem/s, and the speedup of each
    /// SIMD line over the scalar line of the same group and format.
    fn print(&self) {
        println!("\n## tallow-quant kernels (median time per iteration)\n");
        println!("| group | format | kernels | time | GB/s | GFLOP/s | Gelem/s | vs scalar |");
        println!("|---|---|---|--:|--:|--:|--:|--:|");
        for r in &self.0 {
            let Some(s) = r.seconds() else { continue };
            let scalar = self
                .0
                .iter()
                .find(|o| o.group == r.group && o.format == r.format && o.variant == "Scalar")
                .filter(|_| r.variant != "Scalar")
                .and_then(Record::seconds);
            let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
            println!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                r.group,
                r.format,
                r.variant,
                human_time(s),
                r.bytes as f64 / s / 1e9,
                opt(r.flops.map(|f| f / s / 1e9)),
                opt(r.elements.map(|e| e as f64 / s / 1e9)),
                scalar.map_or(String::new(), |t| format!("{:.1}x", t / s)),
            );
        }
    }
}

fn human_time(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// The best instruction set of this CPU and the scalar reference (once, on a CPU without
/// SIMD kernels).
fn isas() -> Vec<Isa> {
    let mut isas = vec![Isa::detected(), Isa::Scalar];
    isas.dedup();
    isas
}

/// The SIMD instruction sets of this CPU that pack, best first: the detected one and each
/// lesser x86 set (AVX-512 without VNNI, AVX2), so that one machine measures the kernels of the
/// CPUs it stands for.
fn packing_isas() -> Vec<Isa> {
    let mut isas = Vec::new();
    for isa in [Isa::detected(), Isa::Avx512, Isa::Avx2] {
        if isa != Isa::Scalar && isa.is_available() && !isas.contains(&isa) {
            isas.push(isa);
        }
    }
    isas
}

/// `tokens` x (`rows` x `cols`) products for every weight format, SIMD beside scalar.
fn products(
    c: &mut Criterion,
    summary: &mut Summary,
    name: &str,
    (rows, cols): (usize, usize),
    tokens: usize,
) {
    let group = format!("{name}_{rows}x{cols}");
    let group = if name == "matmul" {
        format!("{group}_t{tokens}")
    } else {
        group
    };
    let mut g = c.benchmark_group(&group);
    if tokens > 1 || rows * cols > 1 << 20 {
        // The scalar products take up to a tenth of a second: time a fixed count per sample,
        // and fewer samples, so that they fit in the measurement time.
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
    }
    let mut rng = Rng(0x7a11 ^ (rows * cols * tokens) as u64);
    let mut out = vec![0f32; rows * tokens];
    for ty in GgmlType::WEIGHTS {
        let w = weights(ty, rows, cols, &mut rng);
        let a = acts(ty, tokens, cols, &mut rng);
        let flops = 2.0 * (rows * cols * tokens) as f64;
        for isa in isas() {
            summary.bench(
                &mut g,
                &group,
                ty.name(),
                &format!("{isa:?}"),
                w.len() as u64,
                Some(flops),
                None,
                || {
                    matmul_with(isa, ty, black_box(&w), rows, cols, &a, &mut out).unwrap();
                    black_box(&mut out);
                },
            );
        }
        if let Some(packed) = PackedMatrix::pack(ty, &w, rows, cols).unwrap() {
            summary.bench(
                &mut g,
                &group,
                ty.name(),
                &format!("{:?} packed", Isa::detected()),
                w.len() as u64,
                Some(flops),
                None,
                || {
                    packed.matmul(&a, &mut out).unwrap();
                    black_box(&mut out);
                },
            );
        }
    }
    g.finish();
}

/// One-token products of a matrix whose weights come from memory (see [`STREAMED`]), for the
/// packable formats: row-major SIMD beside packed, for each instruction set of
/// [`packing_isas`] (the scalar reference would only time its arithmetic).
fn streamed(c: &mut Criterion, summary: &mut Summary) {
    let mut rng = Rng(0x5eed_57ea);
    let simd = packing_isas();
    for ty in PACKED_FORMATS {
        let (rows, cols) = if ty.block_len() == 256 {
            STREAMED_K
        } else {
            STREAMED
        };
        let group = format!("matvec_streamed_{rows}x{cols}");
        let mut g = c.benchmark_group(&group);
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        let mut out = vec![0f32; rows];
        let n_copies = STREAM_BYTES.div_ceil(rows * row_bytes(ty, cols));
        let copies = vec![weights(ty, rows, cols, &mut rng); n_copies];
        let a = acts(ty, 1, cols, &mut rng);
        let (bytes, flops) = (copies[0].len() as u64, Some(2.0 * (rows * cols) as f64));
        let mut next = 0;
        for &isa in &simd {
            let variant = format!("{isa:?}");
            summary.bench(
                &mut g,
                &group,
                ty.name(),
                &variant,
                bytes,
                flops,
                None,
                || {
                    matmul_with(isa, ty, &copies[next], rows, cols, &a, &mut out).unwrap();
                    next = (next + 1) % n_copies;
                    black_box(&mut out);
                },
            );
            let packed: Vec<PackedMatrix> = copies
                .iter()
                .filter_map(|w| PackedMatrix::pack_with(isa, ty, w, rows, cols).unwrap())
                .collect();
            if packed.is_empty() {
                continue;
            }
            let variant = format!("{isa:?} packed");
            summary.bench(
                &mut g,
                &group,
                ty.name(),
                &variant,
                bytes,
                flops,
                None,
                || {
                    packed[next % packed.len()].matmul(&a, &mut out).unwrap();
                    next = (next + 1) % n_copies;
                    black_box(&mut out);
                },
            );
        }
        g.finish();
    }
}

/// The formats whose rows a product of many tokens decodes once into packed groups (there is
/// no packed layout at load for them).
const DECODED_FORMATS: [GgmlType; 9] = [
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

/// Prefill-sized products ([`PREFILL`] against [`PREFILL_TOKENS`] tokens) of every packed
/// format, packed kernels only (the scalar reference would take seconds), and of every
/// [`DECODED_FORMATS`] one, for each instruction set of [`packing_isas`].
fn prefill(c: &mut Criterion, summary: &mut Summary) {
    let mut rng = Rng(0x9ef1_1000);
    let simd = packing_isas();
    for (rows, cols) in PREFILL {
        let group = format!("prefill_{rows}x{cols}_t{PREFILL_TOKENS}");
        let mut g = c.benchmark_group(&group);
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        let mut out = vec![0f32; rows * PREFILL_TOKENS];
        for ty in PACKED_FORMATS {
            let w = weights(ty, rows, cols, &mut rng);
            let a = acts(ty, PREFILL_TOKENS, cols, &mut rng);
            let flops = Some(2.0 * (rows * cols * PREFILL_TOKENS) as f64);
            for &isa in &simd {
                let Some(packed) = PackedMatrix::pack_with(isa, ty, &w, rows, cols).unwrap() else {
                    continue;
                };
                summary.bench(
                    &mut g,
                    &group,
                    ty.name(),
                    &format!("{isa:?} packed"),
                    w.len() as u64,
                    flops,
                    None,
                    || {
                        packed.matmul(&a, &mut out).unwrap();
                        black_box(&mut out);
                    },
                );
            }
        }
        for ty in DECODED_FORMATS {
            let w = weights(ty, rows, cols, &mut rng);
            let a = acts(ty, PREFILL_TOKENS, cols, &mut rng);
            let flops = Some(2.0 * (rows * cols * PREFILL_TOKENS) as f64);
            for &isa in &simd {
                summary.bench(
                    &mut g,
                    &group,
                    ty.name(),
                    &format!("{isa:?} decoded"),
                    w.len() as u64,
                    flops,
                    None,
                    || {
                        matmul_with(isa, ty, &w, rows, cols, &a, &mut out).unwrap();
                        black_box(&mut out);
                    },
                );
            }
        }
        g.finish();
    }
}

/// Activation quantization: one 4096-element row (a decoded token of a 1B model's FFN width)
/// and 128 tokens of 1536 (a prefill chunk of SmolLM2's FFN width), each split over the pool.
fn quantize_acts(c: &mut Criterion, summary: &mut Summary) {
    let group = "quantize_acts";
    let mut g = c.benchmark_group(group);
    let mut rng = Rng(0xac75);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        for (tokens, cols) in [(1, 4096), (128, SMALL.1)] {
            let x = rng.floats(tokens * cols);
            let mut acts = ActsBuffer::new();
            let n = (tokens * cols) as u64;
            summary.bench(
                &mut g,
                group,
                ty.name(),
                &format!("{tokens}x{cols}"),
                4 * n,
                None,
                Some(n),
                || {
                    black_box(acts.quantize(ty, black_box(&x), tokens, cols).unwrap());
                },
            );
        }
    }
    g.finish();
}

/// Weight quantization (what a checkpoint's conversion spends): one 4096-element row of
/// every weight format tallow quantizes to, on the calling thread.
fn quantize_weights(c: &mut Criterion, summary: &mut Summary) {
    let group = "quantize_weights";
    let mut g = c.benchmark_group(group);
    let mut rng = Rng(0x9e17);
    let cols = 4096;
    let x = rng.floats(cols);
    for ty in GgmlType::WEIGHTS {
        let mut row = vec![0u8; row_bytes(ty, cols)];
        if quantize_row(ty, &x, &mut row).is_err() {
            continue;
        }
        summary.bench(
            &mut g,
            group,
            ty.name(),
            &format!("1x{cols}"),
            4 * cols as u64,
            None,
            Some(cols as u64),
            || {
                quantize_row(ty, black_box(&x), &mut row).unwrap();
                black_box(&mut row);
            },
        );
    }
    g.finish();
}

/// Dequantization of a whole `SMALL` matrix of every weight format to f32.
fn dequantize_all(c: &mut Criterion, summary: &mut Summary) {
    let (rows, cols) = SMALL;
    let group = format!("dequantize_{rows}x{cols}");
    let mut g = c.benchmark_group(&group);
    let mut rng = Rng(0xde9);
    let mut out = vec![0f32; rows * cols];
    for ty in GgmlType::WEIGHTS {
        let w = weights(ty, rows, cols, &mut rng);
        summary.bench(
            &mut g,
            &group,
            ty.name(),
            "Scalar",
            w.len() as u64,
            None,
            Some((rows * cols) as u64),
            || {
                dequantize(ty, black_box(&w), &mut out).unwrap();
                black_box(&mut out);
            },
        );
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20)
        .configure_from_args();
    let mut summary = Summary::default();
    products(&mut c, &mut summary, "matvec", SMALL, 1);
    products(&mut c, &mut summary, "matvec", LARGE, 1);
    streamed(&mut c, &mut summary);
    for tokens in MATMUL_TOKENS {
        products(&mut c, &mut summary, "matmul", SMALL, tokens);
    }
    prefill(&mut c, &mut summary);
    quantize_acts(&mut c, &mut summary);
    quantize_weights(&mut c, &mut summary);
    dequantize_all(&mut c, &mut summary);
    c.final_summary();
    // Only when benchmarking: in test mode (`cargo test --benches`) every bench runs once.
    if std::env::args().any(|a| a == "--bench") {
        summary.print();
    }
}
