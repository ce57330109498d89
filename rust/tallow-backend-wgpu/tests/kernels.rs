//! Each WGSL kernel against a reference on random inputs of awkward shapes: the quantized
//! products and the embedding against the scalar dequantization of tallow-quant (in f64), the
//! other operations against the CPU backend running the same operation. Runs on any adapter
//! wgpu finds (Mesa's llvmpipe where there is no GPU).

use std::sync::Arc;

use tallow_backend::{
    Activation, Backend, Batch, Heads, Logits, MatrixSpec, MatrixUse, Rope, RopeParams,
    RopeScaling, RopeStyle, Scores, Step, StepInput,
};
use tallow_backend_cpu::CpuBackend;
use tallow_backend_wgpu::WgpuBackend;
use tallow_gguf::{tensors_image, GgmlType, GgufFile, TensorData};
use tallow_kv::{KvLayout, LayerGroups, PagedKvCache, SeqId};
use tallow_quant::testing::{dequantized, magnitude, random_blocks, Rng};

/// `n` activation-like values from a fixed seed.
fn random(seed: u64, n: usize) -> Vec<f32> {
    Rng::new(seed).activations(n)
}

fn gpu() -> WgpuBackend {
    WgpuBackend::open(0).unwrap_or_else(|e| panic!("{e} (install mesa-vulkan-drivers)"))
}

/// The formats the WGSL kernels read.
const FORMATS: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// A matrix of `rows` x `cols` random weights in `ty`, as a one-tensor file, and the values
/// its blocks hold.
fn matrix_file(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Arc<GgufFile>, Vec<f32>) {
    let data = random_blocks(&mut Rng::new(seed), ty, rows * cols / ty.block_len());
    let held = dequantized(ty, &data);
    let image = tensors_image(&[TensorData {
        name: "w",
        ty,
        dims: &[cols as u64, rows as u64],
        data: &data,
    }]);
    (Arc::new(GgufFile::from_bytes(image).unwrap()), held)
}

fn upload<B: Backend>(backend: &B, file: &Arc<GgufFile>, rows: usize, cols: usize) -> B::Matrix {
    let spec = MatrixSpec {
        tensor: file.tensor("w").unwrap().clone(),
        rows,
        cols,
        usage: MatrixUse::RowsAndProduct,
    };
    backend
        .upload_matrices(file, &[spec])
        .unwrap()
        .pop()
        .unwrap()
}

/// One sequence of `tokens`, none producing logits.
fn batch(tokens: &[u32]) -> Batch {
    let mut b = Batch::new();
    b.push(SeqId(0), tokens, Logits::None);
    b
}

fn input<'a, B: Backend>(
    batch: &'a Batch,
    first_pos: &'a [usize],
    ropes: &'a B::Ropes,
) -> StepInput<'a, B> {
    StepInput {
        batch,
        first_pos,
        heads: Heads {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 64,
        },
        page_size: 16,
        ropes,
    }
}

/// Each of `got` within `tolerance` times `scale[i]` of `want`.
fn assert_close(got: &[f32], want: &[f64], scale: &[f64], tolerance: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tolerance * scale[i],
            "{what}: value {i} is {g}, expected {w}"
        );
    }
}

/// `x · Wᵀ` in f64 for `n` tokens, and the scale of each value's rounding error.
fn reference_products(w: &[f32], x: &[f32], n: usize, rows: usize) -> (Vec<f64>, Vec<f64>) {
    let cols = x.len() / n;
    (0..n * rows)
        .map(|i| {
            let (t, r) = (i / rows, i % rows);
            let (w, x) = (&w[r * cols..][..cols], &x[t * cols..][..cols]);
            let exact: f64 = w
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            (exact, magnitude(w, x))
        })
        .unzip()
}

/// `x · Wᵀ` on `backend`.
fn products<B: Backend>(backend: &B, m: &B::Matrix, x: &[f32], n: usize, rows: usize) -> Vec<f32> {
    let tokens = vec![0u32; n];
    let batch = batch(&tokens);
    let ropes = backend.upload_ropes(Vec::new()).unwrap();
    let mut out = vec![0f32; n * rows];
    let mut scratch = B::Scratch::default();
    backend
        .run_step(&mut scratch, &input(&batch, &[0], &ropes), |step| {
            let x = step.upload(x, x.len() / n)?;
            let mut y = step.rows(n, rows)?;
            step.matmul(&x, [m], [&mut y])?;
            step.read(&y, &mut out)
        })
        .unwrap();
    out
}

#[test]
fn products_match_the_dequantized_weights_in_every_format() {
    let gpu = gpu();
    for (f, ty) in FORMATS.into_iter().enumerate() {
        // Rows whose bytes are not whole words (3 Q4_0 blocks are 54 bytes), 37 rows, and
        // token counts around the kernel's blocks of 8.
        let cols = if ty.block_len() == 256 { 512 } else { 96 };
        let rows = 37;
        let (file, w) = matrix_file(ty, rows, cols, f as u64 + 1);
        let m = upload(&gpu, &file, rows, cols);
        for n in [1, 5, 11] {
            let x = random(100 + n as u64, n * cols);
            let got = products(&gpu, &m, &x, n, rows);
            let (want, scale) = reference_products(&w, &x, n, rows);
            assert_close(&got, &want, &scale, 1e-6, &format!("{} x{n}", ty.name()));
        }
    }
}

/// A matrix larger than one buffer may be is split by rows, with the same products.
#[test]
fn matrices_past_the_buffer_limit_are_split_by_rows() {
    let (ty, rows, cols) = (GgmlType::Q8_0, 50, 64);
    // 68 bytes a row: parts of 7 rows under a limit of 500 bytes.
    let capped = WgpuBackend::open_capped(0, 500).unwrap();
    let (file, w) = matrix_file(ty, rows, cols, 7);
    let m = upload(&capped, &file, rows, cols);
    let x = random(8, 3 * cols);
    let got = products(&capped, &m, &x, 3, rows);
    let (want, scale) = reference_products(&w, &x, 3, rows);
    assert_close(&got, &want, &scale, 1e-6, "split Q8_0");
}
