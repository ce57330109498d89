//! Running one operation as a step of any backend, and the inputs the checks give it.

use std::sync::Arc;

use tallow_backend::{
    Backend, BackendError, Batch, Draw, Heads, Logits, MatrixSpec, MatrixUse, Step, StepInput,
    StepPlan,
};
use tallow_gguf::{tensors_image, GgmlType, GgufFile, TensorData};
use tallow_kv::testing::TablesOnly;
use tallow_kv::{KvLayout, LayerGroups, PagedKvCache, SeqId};
use tallow_quant::testing::{dequantized, random_blocks, Rng};

/// `n` activation-like values from a fixed seed.
pub fn random(seed: u64, n: usize) -> Vec<f32> {
    Rng::new(seed).activations(n)
}

/// `values` in f64, as the references compute.
pub fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// Each of `got` within `tolerance` times `scale[i]` of `want`.
pub fn assert_close(got: &[f32], want: &[f64], scale: &[f64], tolerance: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tolerance * scale[i],
            "{what}: value {i} is {g}, expected {w}"
        );
    }
}

/// A matrix of `rows` x `cols` random weights in `ty`, as a one-tensor file, and the values
/// its blocks hold.
pub(crate) fn matrix_file(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (Arc<GgufFile>, Vec<f32>) {
    let data = random_blocks(&mut Rng::new(seed), ty, rows * cols / ty.block_len());
    let held = dequantized(ty, &data);
    (file_of(ty, rows, cols, &data), held)
}

/// A one-tensor file holding the `rows` x `cols` weights `data` of type `ty`, named `w`.
pub(crate) fn file_of(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Arc<GgufFile> {
    let image = tensors_image(&[TensorData {
        name: "w",
        ty,
        dims: &[cols as u64, rows as u64],
        data,
    }]);
    Arc::new(GgufFile::from_bytes(image).expect("a file written here reads back"))
}

/// The three matrices of `count` experts (gate, up and down, each `shapes[i]` rows by cols) in
/// random weights of `ty`, each kind stacked in one 3-D tensor as a model file holds them
/// (`gate`, `up`, `down`), and the values each expert's matrices hold.
pub(crate) fn expert_stacks(
    ty: GgmlType,
    shapes: [(usize, usize); 3],
    count: usize,
    seed: u64,
) -> (Arc<GgufFile>, Vec<[Vec<f32>; 3]>) {
    let mut rng = Rng::new(seed);
    let data = shapes
        .map(|(rows, cols)| random_blocks(&mut rng, ty, count * rows * cols / ty.block_len()));
    let dims = shapes.map(|(rows, cols)| [cols as u64, rows as u64, count as u64]);
    let names = ["gate", "up", "down"];
    let tensors: Vec<TensorData<'_>> = (0..3)
        .map(|i| TensorData {
            name: names[i],
            ty,
            dims: &dims[i],
            data: &data[i],
        })
        .collect();
    let file =
        GgufFile::from_bytes(tensors_image(&tensors)).expect("a file written here reads back");
    let values = data.each_ref().map(|d| dequantized(ty, d));
    let held = (0..count)
        .map(|e| {
            [0, 1, 2].map(|i| {
                let per_expert = shapes[i].0 * shapes[i].1;
                values[i][e * per_expert..][..per_expert].to_vec()
            })
        })
        .collect();
    (Arc::new(file), held)
}

/// The specs of every expert's gate, then every expert's up, then every down, of
/// [`expert_stacks`]'s file.
pub(crate) fn stack_specs(file: &GgufFile, count: usize) -> Vec<MatrixSpec> {
    ["gate", "up", "down"]
        .iter()
        .flat_map(|name| {
            let whole = file.tensor(name).expect("written above");
            let (cols, rows) = (whole.dims[0] as usize, whole.dims[1] as usize);
            (0..count).map(move |e| MatrixSpec::row_run(whole, e * rows, rows, cols))
        })
        .collect()
}

/// The tensor `w` of `file` on `backend`.
pub(crate) fn upload<B: Backend>(
    backend: &B,
    file: &Arc<GgufFile>,
    rows: usize,
    cols: usize,
) -> B::Matrix {
    let spec = MatrixSpec {
        tensor: file.tensor("w").expect("the file's one tensor").clone(),
        rows,
        cols,
        usage: MatrixUse::RowsAndProduct,
    };
    let mut matrices = backend.upload_matrices(file, &[spec]).unwrap();
    matrices.pop().expect("one matrix per spec")
}

/// One sequence of `tokens`, none producing logits.
pub(crate) fn batch(tokens: &[u32]) -> Batch {
    let mut b = Batch::new();
    b.push(SeqId(0), tokens, Logits::None);
    b
}

/// The plan of `batch`, whose chunks start at `first_pos`, over page tables of one layer made
/// for it.
pub(crate) fn plan(batch: &Batch, first_pos: &[usize]) -> StepPlan {
    let layout = KvLayout::new(1, 1, 64);
    let pages = (batch.chunks.iter().zip(first_pos))
        .map(|(c, &first)| layout.pages_for_tokens(first + c.len))
        .sum();
    let groups = LayerGroups::global(1).unwrap();
    let mut cache = PagedKvCache::over(groups, TablesOnly::new(layout, pages)).unwrap();
    for (chunk, &first) in batch.chunks.iter().zip(first_pos) {
        assert_eq!(cache.create(), chunk.seq);
        cache.append_slots(chunk.seq, first + chunk.len).unwrap();
    }
    let mut plan = StepPlan::new();
    plan.build(batch, &cache).unwrap();
    plan
}

/// Heads of one step that runs no attention.
const NO_HEADS: Heads = Heads {
    n_head: 1,
    n_head_kv: 1,
    head_dim: 64,
};

/// Runs `f` as one step of `backend` over `batch` (chunks starting at `first_pos`).
pub(crate) fn run<B: Backend>(
    backend: &B,
    batch: &Batch,
    first_pos: &[usize],
    ropes: &B::Ropes,
    f: impl for<'s> FnOnce(&mut B::Step<'s>) -> Result<(), BackendError>,
) {
    run_drawing(backend, batch, first_pos, ropes, None, f)
}

/// [`run`] for a step that ends by drawing tokens by `draws`, known to the step ahead
/// (`StepInput::draws`) where given.
fn run_drawing<B: Backend>(
    backend: &B,
    batch: &Batch,
    first_pos: &[usize],
    ropes: &B::Ropes,
    draws: Option<&[Draw]>,
    f: impl for<'s> FnOnce(&mut B::Step<'s>) -> Result<(), BackendError>,
) {
    let mut scratch = B::Scratch::default();
    let plan = plan(batch, first_pos);
    let input = StepInput {
        batch,
        plan: &plan,
        heads: NO_HEADS,
        page_size: 16,
        ropes,
        draws,
    };
    backend.run_step(&mut scratch, &input, f).unwrap();
}

/// Runs `f` as one step of `backend` over one sequence of `n` tokens from position 0, with
/// no RoPE; a step that ends by drawing tokens by `draws`, known to it ahead, where given.
pub(crate) fn run_rows_drawing<B: Backend>(
    backend: &B,
    n: usize,
    draws: Option<&[Draw]>,
    f: impl for<'s> FnOnce(&mut B::Step<'s>) -> Result<(), BackendError>,
) {
    let ropes = backend.upload_ropes(Vec::new()).unwrap();
    run_drawing(backend, &batch(&vec![0; n]), &[0], &ropes, draws, f);
}

/// [`run_rows_drawing`] with no draws known ahead.
pub(crate) fn run_rows<B: Backend>(
    backend: &B,
    n: usize,
    f: impl for<'s> FnOnce(&mut B::Step<'s>) -> Result<(), BackendError>,
) {
    run_rows_drawing(backend, n, None, f)
}

/// `x · Wᵀ` on `backend` for `n` tokens of `x`.
pub(crate) fn products<B: Backend>(
    backend: &B,
    m: &B::Matrix,
    x: &[f32],
    n: usize,
    rows: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; n * rows];
    run_rows(backend, n, |step| {
        let x = step.upload(x, x.len() / n)?;
        let mut y = step.rows(n, rows)?;
        step.matmul(&x, [m], [&mut y])?;
        step.read(&y, &mut out)
    });
    out
}
