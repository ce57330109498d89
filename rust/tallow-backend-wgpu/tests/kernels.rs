//! Each WGSL kernel against a reference on random inputs of awkward shapes: the quantized
//! products and the embedding against the scalar dequantization of tallow-quant (in f64), the
//! other operations against the CPU backend running the same operation. Runs on any adapter
//! wgpu finds (Mesa's llvmpipe where there is no GPU).

use std::sync::Arc;

use tallow_backend::BackendError;
use tallow_backend::{
    argmax, Activation, Backend, Batch, Heads, Logits, MatrixSpec, MatrixUse, Output, Rope,
    RopeParams, RopeScaling, RopeStyle, Scores, Step, StepInput, StepPlan,
};
use tallow_backend_cpu::{host_cache, CpuBackend};
use tallow_backend_wgpu::{weight_formats, WgpuBackend, WgpuOptions};
use tallow_gguf::{tensors_image, GgmlType, GgufFile, TensorData};
use tallow_kv::{KvBudget, KvLayout, LayerGroups, PagedKvCache, SeqId};
use tallow_quant::testing::{dequantized, magnitude, random_blocks, Rng};

/// `n` activation-like values from a fixed seed.
fn random(seed: u64, n: usize) -> Vec<f32> {
    Rng::new(seed).activations(n)
}

fn gpu() -> WgpuBackend {
    WgpuBackend::open(0).unwrap_or_else(|e| panic!("{e} (install mesa-vulkan-drivers)"))
}

/// The GPU with its reductions in subgroup operations (llvmpipe has them), and without.
fn both_reductions() -> [WgpuBackend; 2] {
    let without = WgpuOptions {
        subgroups: false,
        ..WgpuOptions::default()
    };
    let gpus = [gpu(), WgpuBackend::open_with(0, without).unwrap()];
    assert!(gpus[0].uses_subgroups() && !gpus[1].uses_subgroups());
    gpus
}

/// The GPU with its products in f16 and in f32, each in both shapes (matmul.wgsl): rows
/// split between a workgroup's invocations, and whole rows per invocation. Opened one at a
/// time: llvmpipe's devices each keep their own threads busy.
fn every_product_kernel() -> impl Iterator<Item = WgpuBackend> {
    [(true, true), (true, false), (false, true), (false, false)]
        .into_iter()
        .map(|(f16, split)| {
            let options = WgpuOptions {
                f16,
                split_products: Some(split),
                ..WgpuOptions::default()
            };
            let gpu = WgpuBackend::open_with(0, options).unwrap();
            assert_eq!((gpu.uses_f16(), gpu.splits_products()), (f16, split));
            gpu
        })
}

/// The bound of the rounding error of `gpu`'s products of `ty` weights, relative to their
/// magnitude (matmul.wgsl): six f16 roundings where they compute in f16 (F32 weights never
/// do), a few f32 ones otherwise.
fn products_bound(gpu: &WgpuBackend, ty: GgmlType) -> f64 {
    if gpu.uses_f16() && ty != GgmlType::F32 {
        6.0 / 4096.0
    } else {
        1e-6
    }
}

fn capped(max_part: u64) -> WgpuBackend {
    let options = WgpuOptions {
        max_part,
        ..WgpuOptions::default()
    };
    WgpuBackend::open_with(0, options).unwrap()
}

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

/// The plan of `batch`, whose chunks start at `first_pos`, over a host cache of one layer
/// made for it.
fn plan(batch: &Batch, first_pos: &[usize]) -> StepPlan {
    let layout = KvLayout::new(1, 1, 64);
    let pages = (batch.chunks.iter().zip(first_pos))
        .map(|(c, &first)| layout.pages_for_tokens(first + c.len))
        .sum();
    let mut cache = host_cache(
        layout,
        LayerGroups::global(1).unwrap(),
        KvBudget::Pages(pages),
    )
    .unwrap();
    for (chunk, &first) in batch.chunks.iter().zip(first_pos) {
        assert_eq!(cache.create(), chunk.seq);
        cache.append_slots(chunk.seq, first + chunk.len).unwrap();
    }
    let mut plan = StepPlan::new();
    plan.build(batch, &cache).unwrap();
    plan
}

fn input<'a, B: Backend>(
    batch: &'a Batch,
    plan: &'a StepPlan,
    ropes: &'a B::Ropes,
) -> StepInput<'a, B> {
    StepInput {
        batch,
        plan,
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
    let plan = plan(&batch, &[0]);
    backend
        .run_step(&mut scratch, &input(&batch, &plan, &ropes), |step| {
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
    for gpu in every_product_kernel() {
        for (f, ty) in weight_formats().enumerate() {
            // Rows whose bytes are not whole words (3 Q4_0 blocks are 54 bytes), 37 rows (not
            // whole workgroups), rows of fewer runs of 32 than a workgroup's 64 invocations and
            // of more (split, each takes two runs or one), and token counts around the
            // kernel's blocks of 4.
            let widths = if ty.block_len() == 256 {
                [512, 9 * 256]
            } else {
                [96, 67 * 32]
            };
            let rows = 37;
            for cols in widths {
                let (file, w) = matrix_file(ty, rows, cols, f as u64 + 1);
                let m = upload(&gpu, &file, rows, cols);
                let bound = products_bound(&gpu, ty);
                for n in [1, 5, 11] {
                    let x = random(100 + n as u64, n * cols);
                    let got = products(&gpu, &m, &x, n, rows);
                    let (want, scale) = reference_products(&w, &x, n, rows);
                    let what = format!(
                        "{} {cols} x{n}, f16 {}, split {}",
                        ty.name(),
                        gpu.uses_f16(),
                        gpu.splits_products()
                    );
                    assert_close(&got, &want, &scale, bound, &what);
                }
            }
        }
    }
}

/// A matrix larger than one buffer may be is split by rows, with the same products.
#[test]
fn matrices_past_the_buffer_limit_are_split_by_rows() {
    let (ty, rows, cols) = (GgmlType::Q8_0, 50, 64);
    // 68 bytes a row: parts of 7 rows under a limit of 500 bytes.
    let capped = capped(500);
    let (file, w) = matrix_file(ty, rows, cols, 7);
    let m = upload(&capped, &file, rows, cols);
    let x = random(8, 3 * cols);
    let got = products(&capped, &m, &x, 3, rows);
    let (want, scale) = reference_products(&w, &x, 3, rows);
    let bound = products_bound(&capped, ty);
    assert_close(&got, &want, &scale, bound, "split Q8_0");
}

/// Runs `f` as one step of `backend` over `batch` (chunks starting at `first_pos`).
fn run<B: Backend>(
    backend: &B,
    batch: &Batch,
    first_pos: &[usize],
    ropes: &B::Ropes,
    f: impl for<'s> FnOnce(&mut B::Step<'s>) -> Result<(), BackendError>,
) {
    let mut scratch = B::Scratch::default();
    let plan = plan(batch, first_pos);
    backend
        .run_step(&mut scratch, &input(batch, &plan, ropes), f)
        .unwrap();
}

#[test]
fn embeddings_are_the_dequantized_rows_in_every_format() {
    let gpu = gpu();
    for (f, ty) in weight_formats().enumerate() {
        let cols = if ty.block_len() == 256 { 256 } else { 96 };
        let rows = 23;
        let (file, w) = matrix_file(ty, rows, cols, 30 + f as u64);
        let m = upload(&gpu, &file, rows, cols);
        let ids = [3u32, 0, 22, 3, 17];
        let batch = batch(&ids);
        let mut got = vec![0f32; ids.len() * cols];
        run(&gpu, &batch, &[0], &Vec::new(), |step| {
            let mut out = step.rows(ids.len(), cols)?;
            step.embed(&m, 1.5, &mut out)?;
            step.read(&out, &mut got)
        });
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&id| &w[id as usize * cols..][..cols])
            .map(|&v| f64::from(v) * 1.5)
            .collect();
        let scale: Vec<f64> = want.iter().map(|v| v.abs()).collect();
        assert_close(&got, &want, &scale, 1e-6, ty.name());
    }
}

/// The operations on rows of `width`, on `backend`: RMSNorm into new rows and in place per
/// head, bias, residual add and both gated activations.
fn row_ops<B: Backend>(backend: &B, n: usize, width: usize, head: usize) -> Vec<Vec<f32>> {
    let x = random(1, n * width);
    let y = random(2, n * width);
    let gain = backend.upload_vector(&random(3, width)).unwrap();
    let head_gain = backend.upload_vector(&random(4, head)).unwrap();
    let bias = backend.upload_vector(&random(5, width)).unwrap();
    let tokens = vec![1u32; n];
    let batch = batch(&tokens);
    let mut outs = vec![vec![0f32; n * width]; 6];
    run(
        backend,
        &batch,
        &[0],
        &backend.upload_ropes(Vec::new()).unwrap(),
        |step| {
            let xs = step.upload(&x, width)?;
            let ys = step.upload(&y, width)?;
            let mut normed = step.rows(n, width)?;
            step.rms_norm(&xs, &gain, 1e-5, &mut normed)?;
            step.read(&normed, &mut outs[0])?;
            step.rms_norm_in_place(&mut normed, &head_gain, 1e-6)?;
            step.read(&normed, &mut outs[1])?;
            let mut z = step.upload(&x, width)?;
            step.add_bias(&mut z, &bias)?;
            step.read(&z, &mut outs[2])?;
            step.add(&mut z, &ys)?;
            step.read(&z, &mut outs[3])?;
            for (i, activation) in [Activation::Silu, Activation::GeluTanh]
                .into_iter()
                .enumerate()
            {
                let mut g = step.upload(&x, width)?;
                step.gated(activation, &mut g, &ys)?;
                step.read(&g, &mut outs[4 + i])?;
            }
            Ok(())
        },
    );
    outs
}

#[test]
fn row_operations_match_the_cpu_backend() {
    let cpu = CpuBackend::default();
    for gpu in both_reductions() {
        for (n, width, head) in [(1, 64, 32), (7, 320, 64), (3, 1088, 64)] {
            let want = row_ops(&cpu, n, width, head);
            let got = row_ops(&gpu, n, width, head);
            let names = ["norm", "head norm", "bias", "add", "silu", "gelu"];
            for ((name, got), want) in names.iter().zip(&got).zip(&want) {
                let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
                let scale = vec![1.0; want.len()];
                let what = format!("{name} {n}x{width}, subgroups {}", gpu.uses_subgroups());
                assert_close(got, &want, &scale, 2e-5, &what);
            }
        }
    }
}

/// Both RoPE styles, with a base, frequency factors and YaRN, at positions past 4096.
#[test]
fn rope_matches_the_cpu_backend() {
    let (cpu, gpu) = (CpuBackend::default(), gpu());
    let (head_dim, heads) = (64, 3);
    let factors: Vec<f32> = (0..24).map(|i| 1.0 + i as f32 / 8.0).collect();
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let params = RopeParams {
            style,
            base: 10_000.0,
            rope_dim: 48,
            head_dim,
            freq_factors: Some(&factors),
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
            original_context: 2048,
            attn_factor: 1.0,
        };
        let mut batch = Batch::new();
        batch.push(SeqId(0), &[1; 5], Logits::None);
        batch.push(SeqId(1), &[1; 2], Logits::None);
        let first_pos = [4097, 3];
        let x = random(9, 7 * heads * head_dim);
        let mut got = vec![0f32; x.len()];
        let ropes = gpu.upload_ropes(vec![Rope::new(params)]).unwrap();
        run(&gpu, &batch, &first_pos, &ropes, |step| {
            let mut rows = step.upload(&x, heads * head_dim)?;
            step.rope(0, &mut rows)?;
            step.read(&rows, &mut got)
        });
        let mut want = vec![0f32; x.len()];
        let ropes = cpu.upload_ropes(vec![Rope::new(params)]).unwrap();
        run(&cpu, &batch, &first_pos, &ropes, |step| {
            let mut rows = step.upload(&x, heads * head_dim)?;
            step.rope(0, &mut rows)?;
            step.read(&rows, &mut want)
        });
        let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
        assert_close(
            &got,
            &want,
            &vec![1.0; want.len()],
            1e-6,
            &format!("{style:?}"),
        );
    }
}

/// The LM head's soft-capped logits, copied back to the host: in one block, and in blocks of
/// one row when a cap keeps a row's logits the most one buffer may hold.
#[test]
fn logits_are_soft_capped_products() {
    for gpu in [gpu(), capped(300 * 4)] {
        soft_capped_logits(&gpu);
    }
}

fn soft_capped_logits(gpu: &WgpuBackend) {
    let (rows, cols, n, cap) = (300, 128, 3, 30.0f32);
    let (file, w) = matrix_file(GgmlType::Q6_K, rows, cols * 2, 11);
    let m = upload(gpu, &file, rows, cols * 2);
    let x = random(12, n * cols * 2);
    let batch = batch(&[0; 3]);
    let mut got = vec![0f32; n * rows];
    run(gpu, &batch, &[0], &Vec::new(), |step| {
        let xs = step.upload(&x, cols * 2)?;
        step.logits(&xs, &m, Some(cap), Output::Logits(&mut got))
    });
    let (exact, scale) = reference_products(&w, &x, n, rows);
    let c = f64::from(cap);
    let want: Vec<f64> = exact.iter().map(|v| c * (v / c).tanh()).collect();
    assert!(exact.iter().any(|v| v.abs() > c), "some logits are capped");
    let bound = products_bound(gpu, GgmlType::Q6_K);
    assert_close(&got, &want, &scale, bound, "logits");
}

/// Greedy tokens chosen on the device are the host's argmax of the logits the same step
/// copies back: the first of equal values (rows 150.. repeat rows ..150, and a cap makes
/// large logits equal), never a NaN (rows 7 and 157); in one block and in blocks of one row.
#[test]
fn greedy_tokens_are_the_argmax_of_the_logits() {
    let (rows, cols, n) = (300, 64, 5);
    let mut w = random(21, rows / 2 * cols);
    w[7 * cols] = f32::NAN;
    w.extend_from_within(..);
    let data: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let image = tensors_image(&[TensorData {
        name: "w",
        ty: GgmlType::F32,
        dims: &[cols as u64, rows as u64],
        data: &data,
    }]);
    let file = Arc::new(GgufFile::from_bytes(image).unwrap());
    let x = random(22, n * cols);
    let [with, without] = both_reductions();
    for backend in [with, without, capped(rows as u64 * 4)] {
        let m = upload(&backend, &file, rows, cols);
        for cap in [None, Some(0.05)] {
            let (mut logits, mut tokens) = (vec![0f32; n * rows], vec![0u32; n]);
            run(&backend, &batch(&[0; 5]), &[0], &Vec::new(), |step| {
                let xs = step.upload(&x, cols)?;
                step.logits(&xs, &m, cap, Output::Logits(&mut logits))?;
                step.logits(&xs, &m, cap, Output::Argmax(&mut tokens))
            });
            let want: Vec<u32> = logits.chunks_exact(rows).map(argmax).collect();
            assert_eq!(tokens, want, "cap {cap:?}");
            assert!(want.iter().all(|&t| t < 150 && t != 7), "{want:?}");
        }
    }
}

/// Causal attention on `backend` over sequences that prefill `prompt` tokens and then add
/// `then` more, and a fork of the first made after its prompt (its next tokens copy the
/// shared, partly filled page first): the outputs of both steps, token after token.
fn attention_on<B: Backend>(backend: &B, heads: Heads, scores: Scores) -> Vec<f32> {
    let page_size = 16;
    let layout = KvLayout::new(1, heads.n_head_kv, heads.head_dim).with_page_size(page_size);
    let groups = LayerGroups::global(1).unwrap();
    let pages = backend.new_pages(layout, &groups, 32).unwrap();
    let mut cache = PagedKvCache::over(groups, pages).unwrap();
    let seqs = [(45, 1), (3, 2), (70, 3)];
    let mut ids: Vec<SeqId> = seqs.iter().map(|_| cache.create()).collect();
    let mut outputs = Vec::new();
    let ropes = backend.upload_ropes(Vec::new()).unwrap();
    for phase in 0..2 {
        if phase == 1 {
            ids.push(cache.fork(ids[0]).unwrap());
        }
        let mut batch = Batch::new();
        for (i, &id) in ids.iter().enumerate() {
            // The fork (after the three) adds 4 tokens.
            let (prompt, then) = seqs.get(i).copied().unwrap_or((0, 4));
            let len = if phase == 0 { prompt } else { then };
            cache.append_slots(id, len).unwrap();
            batch.push(id, &vec![0; len], Logits::None);
        }
        let n = batch.tokens.len();
        let q = random(20 + phase, n * heads.q_dim());
        let k = random(30 + phase, n * heads.kv_dim());
        let v = random(40 + phase, n * heads.kv_dim());
        let mut out = vec![0f32; q.len()];
        let mut plan = StepPlan::new();
        plan.build(&batch, &cache).unwrap();
        let input = StepInput {
            batch: &batch,
            plan: &plan,
            heads,
            page_size,
            ropes: &ropes,
        };
        let mut scratch = B::Scratch::default();
        backend
            .run_step(&mut scratch, &input, |step| {
                let (q, k, v) = (
                    step.upload(&q, heads.q_dim())?,
                    step.upload(&k, heads.kv_dim())?,
                    step.upload(&v, heads.kv_dim())?,
                );
                let mut o = step.rows(n, heads.q_dim())?;
                let (mut q, mut k, mut v) = (q, k, v);
                step.write_kv(&mut cache, 0, &mut k, &mut v)?;
                step.attention(&cache, 0, scores, &mut q, &mut o)?;
                step.read(&o, &mut out)
            })
            .unwrap();
        outputs.extend(out);
    }
    outputs
}

#[test]
fn paged_attention_matches_the_cpu_backend() {
    let cpu = CpuBackend::default();
    for gpu in both_reductions() {
        attention_matches(&cpu, &gpu);
    }
}

fn attention_matches(cpu: &CpuBackend, gpu: &WgpuBackend) {
    let shapes = [
        Heads {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
        },
        Heads {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 256,
        },
    ];
    for heads in shapes {
        let windowed = Scores {
            scale: 0.1,
            softcap: Some(1.5),
            window: Some(37),
        };
        let short_window = Scores {
            window: Some(7),
            ..Scores::plain(heads.head_dim)
        };
        for scores in [Scores::plain(heads.head_dim), windowed, short_window] {
            let want: Vec<f64> = attention_on(cpu, heads, scores)
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let got = attention_on(gpu, heads, scores);
            let what = format!("{heads:?} {scores:?}, subgroups {}", gpu.uses_subgroups());
            assert_close(&got, &want, &vec![1.0; want.len()], 1e-5, &what);
        }
    }
}
