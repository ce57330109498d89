//! The checks of the suite, each generic over the [`Subject`] it runs on.

use std::sync::Arc;

use tallow_backend::{
    argmax, draw_rows, Activation, Backend, BackendError, Batch, Draw, Experts, Heads, Logits,
    MatrixSpec, MatrixUse, Moe, Output, OutputRows, Rope, RopeParams, RopeScaling, RopeStyle,
    Routing, Scores, Step, StepInput, StepPlan,
};
use tallow_gguf::{GgmlType, GgufFile};
use tallow_kv::{KvDtype, KvLayout, LayerGroups, PagedKvCache, SeqId};
use tallow_quant::testing::Rng;

use crate::harness::{
    assert_close, batch, expert_stacks, file_of, matrix_file, products, random, run, run_rows,
    run_rows_drawing, stack_specs, upload, widen,
};
use crate::{reference, Family, Subject, ROPE_TOLERANCE, ROWS_TOLERANCE};

/// Products of every weight format the backend runs, in every product variant: rows whose
/// bytes are not whole words (3 Q4_0 blocks are 54 bytes), 37 rows (not whole workgroups of
/// any usual size), rows of fewer 32-value runs than a workgroup has invocations and of more,
/// and token counts around blocks of 4 and 8 and past two tiles of 32 (or one of 64).
pub fn products_match_the_dequantized_weights<S: Subject>() {
    for backend in S::variants(Family::Products) {
        for (f, ty) in backend
            .capabilities()
            .weight_formats
            .into_iter()
            .enumerate()
        {
            let widths = if ty.block_len() == 256 {
                [512, 9 * 256]
            } else {
                [96, 67 * 32]
            };
            let rows = 37;
            for cols in widths {
                let (file, w) = matrix_file(ty, rows, cols, f as u64 + 1);
                let m = upload(&backend, &file, rows, cols);
                let bound = S::products_bound(&backend, ty);
                for n in [1, 5, 11, 70] {
                    let x = random(100 + n as u64, n * cols);
                    let got = products(&backend, &m, &x, n, rows);
                    let (want, scale) = reference::products(&w, &x, cols);
                    let what = format!("{} {cols} x{n}, {}", ty.name(), S::describe(&backend));
                    assert_close(&got, &want, &scale, bound, &what);
                }
            }
        }
    }
}

/// Every weight format tallow reads is one the backend runs (the check above takes each) or
/// one it refuses by name: its capabilities say so before a model loads, and uploading a
/// matrix of it anyway is that refusal, never a matrix whose products are wrong.
pub fn formats_it_does_not_run_are_refused_by_name<S: Subject>() {
    let backend = S::variants(Family::Products).next().expect("a variant");
    let capabilities = backend.capabilities();
    let mut rng = Rng::new(3);
    for ty in GgmlType::ALL {
        if capabilities.weight_formats.contains(&ty) {
            continue;
        }
        let refused = capabilities.check_weights("w", ty).unwrap_err().to_string();
        assert!(refused.contains(&format!("{ty:?}")), "{refused}");
        let (rows, cols) = (4, 256);
        let data = rng.bytes(rows * cols / ty.block_len() * ty.block_bytes());
        let file = file_of(ty, rows, cols, &data);
        let spec = MatrixSpec {
            tensor: file.tensor("w").expect("the file's one tensor").clone(),
            rows,
            cols,
            usage: MatrixUse::RowsAndProduct,
        };
        match backend.upload_matrices(&file, &[spec]) {
            Err(BackendError::Unsupported(what)) => {
                assert!(
                    what.contains(ty.name()),
                    "{}: {what}",
                    S::describe(&backend)
                )
            }
            Err(e) => panic!("{} {}: {e}", S::describe(&backend), ty.name()),
            Ok(_) => panic!("{} uploads {} weights", S::describe(&backend), ty.name()),
        }
    }
}

/// A matrix larger than one of the backend's buffers may be is split by rows, with the same
/// products (nothing to check where the backend has no such limit).
pub fn matrices_past_the_buffer_limit_are_split<S: Subject>() {
    let (ty, rows, cols) = (GgmlType::Q8_0, 50, 64);
    // 68 bytes a row: parts of 7 rows under a limit of 500 bytes.
    let Some(capped) = S::capped(500) else {
        return;
    };
    let (file, w) = matrix_file(ty, rows, cols, 7);
    let m = upload(&capped, &file, rows, cols);
    let x = random(8, 3 * cols);
    let got = products(&capped, &m, &x, 3, rows);
    let (want, scale) = reference::products(&w, &x, cols);
    let bound = S::products_bound(&capped, ty);
    assert_close(&got, &want, &scale, bound, "split Q8_0");
}

/// Embedding rows of every weight format, scaled, some ids repeated; also from tables cut
/// into parts of a few rows where the backend's buffers are capped.
pub fn embeddings_are_the_dequantized_rows<S: Subject>() {
    for backend in S::variants(Family::Other).chain(S::capped(1000)) {
        for (f, ty) in backend
            .capabilities()
            .weight_formats
            .into_iter()
            .enumerate()
        {
            let cols = if ty.block_len() == 256 { 256 } else { 96 };
            let rows = 23;
            let (file, w) = matrix_file(ty, rows, cols, 30 + f as u64);
            let m = upload(&backend, &file, rows, cols);
            let ids = [3u32, 0, 22, 3, 17];
            let mut got = vec![0f32; ids.len() * cols];
            let ropes = backend.upload_ropes(Vec::new()).unwrap();
            run(&backend, &batch(&ids), &[0], &ropes, |step| {
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
            let what = format!("{} {}", ty.name(), S::describe(&backend));
            assert_close(&got, &want, &scale, 1e-6, &what);
        }
    }
}

/// RMSNorm into new rows and in place per head, bias, residual add and both gated
/// activations, on rows of a width within one workgroup, past it, and not a multiple of it.
pub fn row_operations_match_the_reference<S: Subject>() {
    for backend in S::variants(Family::Reductions) {
        for (n, width, head) in [(1, 64, 32), (7, 320, 64), (3, 1088, 64)] {
            let x = random(1, n * width);
            let y = random(2, n * width);
            let (gain, head_gain, bias) = (random(3, width), random(4, head), random(5, width));
            let mut got = vec![vec![0f32; n * width]; 6];
            run_rows(&backend, n, |step| {
                let gain = backend.upload_vector(&gain)?;
                let head_gain = backend.upload_vector(&head_gain)?;
                let bias = backend.upload_vector(&bias)?;
                let xs = step.upload(&x, width)?;
                let ys = step.upload(&y, width)?;
                let mut normed = step.rows(n, width)?;
                step.rms_norm(&xs, &gain, 1e-5, &mut normed)?;
                step.read(&normed, &mut got[0])?;
                step.rms_norm_in_place(&mut normed, &head_gain, 1e-6)?;
                step.read(&normed, &mut got[1])?;
                let mut z = step.upload(&x, width)?;
                step.add_bias(&mut z, &bias)?;
                step.read(&z, &mut got[2])?;
                step.add(&mut z, &ys)?;
                step.read(&z, &mut got[3])?;
                for (i, activation) in [Activation::Silu, Activation::GeluTanh]
                    .into_iter()
                    .enumerate()
                {
                    let mut g = step.upload(&x, width)?;
                    step.gated(activation, &mut g, &ys)?;
                    step.read(&g, &mut got[4 + i])?;
                }
                Ok(())
            });
            let (x, y) = (widen(&x), widen(&y));
            let normed = reference::rms_norm(&x, &gain, 1e-5);
            let biased: Vec<f64> = (x.iter().enumerate())
                .map(|(i, v)| v + f64::from(bias[i % width]))
                .collect();
            let want = [
                reference::rms_norm(&normed, &head_gain, 1e-6),
                biased.iter().zip(&y).map(|(a, b)| a + b).collect(),
                reference::gated(Activation::Silu, &x, &y),
                reference::gated(Activation::GeluTanh, &x, &y),
            ];
            let want = [&normed, &want[0], &biased, &want[1], &want[2], &want[3]];
            let names = ["norm", "head norm", "bias", "add", "silu", "gelu"];
            for ((name, got), want) in names.iter().zip(&got).zip(want) {
                let scale = vec![1.0; want.len()];
                let what = format!("{name} {n}x{width}, {}", S::describe(&backend));
                assert_close(got, want, &scale, ROWS_TOLERANCE, &what);
            }
        }
    }
}

/// Mixture-of-experts blocks in both routings, and with gpt-oss's biases and clamped SwiGLU:
/// 9 tokens over 12 experts, 2 a token, so that tokens choose different experts, some experts
/// several tokens and some none, against each token's experts run one after the other in
/// f64; then the sigmoid gate of a shared expert. Experts in F32 (the products' rounding
/// aside), and in Q8_0, MXFP4 (gpt-oss's experts) and IQ2_XXS (those of 2-bit files of large
/// mixtures) within the bound of three products of rounded activations, stacked in 3-D
/// tensors as files hold them; also with buffers capped to a few experts, where the backend
/// cuts what it uploads, and to less than one expert, which it refuses by name. Only where
/// the backend runs experts (elsewhere a model with experts is refused at load).
pub fn experts_match_the_reference<S: Subject>() {
    for ty in [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::IQ2_XXS,
    ] {
        experts_of_type_match_the_reference::<S>(ty);
    }
}

fn experts_of_type_match_the_reference<S: Subject>(ty: GgmlType) {
    // Rows of whole blocks: super-blocks of 256 take wider experts.
    let (d, ff) = if ty.block_len() == 256 {
        (256, 256)
    } else {
        (64, 96)
    };
    let (n, count, top_k) = (9, 12, 2);
    let x = random(40, n * d);
    let router: Vec<f32> = random(41, n * count).iter().map(|v| 4.0 * v).collect();
    let chosen: std::collections::BTreeSet<usize> = router
        .chunks_exact(count)
        .flat_map(|l| reference::route(l, top_k, Routing::TopKSoftmax))
        .map(|(e, _)| e)
        .collect();
    assert!((3..count).contains(&chosen.len()), "{chosen:?}");
    let (file, held) = expert_stacks(ty, [(ff, d), (ff, d), (d, ff)], count, 50);
    // gpt-oss's experts: biases (the gate's large enough to pass the clamp) and the
    // clamped SwiGLU.
    let bias_values: Vec<[Vec<f32>; 3]> = (0..count as u64)
        .map(|e| {
            [(ff, 10.0), (ff, 10.0), (d, 1.0)]
                .map(|(len, scale)| random(60 + e, len).iter().map(|v| scale * v).collect())
        })
        .collect();
    // An expert's matrices in Q8_0 take 6528 bytes (gate and up) or 6800 (down).
    let expert_bytes = ty.bytes_for((d * ff) as u64).expect("whole blocks");
    if let Some(backend) = S::capped(expert_bytes / 3) {
        experts_past_the_buffer_limit_are_refused(&backend, &file, count, top_k, &x, &router);
    }
    let capped = S::capped(5 * expert_bytes / 2);
    for backend in S::variants(Family::Products).chain(capped) {
        if !backend.capabilities().experts {
            continue;
        }
        let tolerance = 3.0 * S::products_bound(&backend, ty);
        let specs = stack_specs(&file, count);
        let mut matrices = backend.upload_matrices(&file, &specs).unwrap().into_iter();
        let mut stack = || (0..count).map(|_| matrices.next().unwrap()).collect();
        let (gate, up, down) = (stack(), stack(), stack());
        let biases = |backend: &S::Backend| {
            [0, 1, 2].map(|part| {
                let values: Vec<f32> = bias_values.iter().flat_map(|b| b[part].clone()).collect();
                backend.upload_vector(&values).unwrap()
            })
        };
        let mut experts = Experts::<S::Backend> {
            gate,
            up,
            down,
            biases: None,
        };
        let cases = [
            (Routing::TopKSoftmax, Activation::Silu, false),
            (Routing::SoftmaxTopK, Activation::Silu, false),
            (Routing::TopKSoftmax, Activation::ClampedSwiglu, true),
        ];
        for (routing, activation, with_biases) in cases {
            experts.biases = with_biases.then(|| biases(&backend));
            let moe = Moe {
                top_k,
                routing,
                activation,
            };
            // All the tokens, and a step of 3 (decode's products, where a backend has them).
            for n in [n, 3] {
                let (x, router) = (&x[..n * d], &router[..n * count]);
                let (mut got, mut gated) = (vec![0f32; n * d], vec![0f32; n * d]);
                run_rows(&backend, n, |step| {
                    let xs = step.upload(x, d)?;
                    let logits = step.upload(router, count)?;
                    let gates = step.upload(&router[..n], 1)?;
                    let mut out = step.rows(n, d)?;
                    step.experts(&xs, &logits, &experts, moe, &mut out)?;
                    step.read(&out, &mut got)?;
                    step.scale_by_sigmoid(&mut out, &gates)?;
                    step.read(&out, &mut gated)
                });
                let held_biases = with_biases.then_some(&bias_values[..]);
                let (want, scale) = reference::experts(x, router, &held, held_biases, moe, d);
                let what = format!("{ty} experts x{n}, {moe:?}, {}", S::describe(&backend));
                assert_close(&got, &want, &scale, tolerance, &what);
                let sigmoid = |t: usize| 1.0 / (1.0 + (-f64::from(router[t])).exp());
                let want: Vec<f64> = (want.iter().enumerate())
                    .map(|(i, v)| v * sigmoid(i / d))
                    .collect();
                assert_close(&gated, &want, &scale, tolerance, &format!("gated {what}"));
            }
        }
    }
}

/// Experts whose matrices are larger than one of the backend's buffers: their products are
/// refused with an error that says so.
fn experts_past_the_buffer_limit_are_refused<B: Backend>(
    backend: &B,
    file: &Arc<GgufFile>,
    count: usize,
    top_k: usize,
    x: &[f32],
    router: &[f32],
) {
    if !backend.capabilities().experts {
        return;
    }
    let specs = stack_specs(file, count);
    let mut matrices = backend.upload_matrices(file, &specs).unwrap().into_iter();
    let mut stack = || (0..count).map(|_| matrices.next().unwrap()).collect();
    let experts = Experts::<B> {
        gate: stack(),
        up: stack(),
        down: stack(),
        biases: None,
    };
    let moe = Moe {
        top_k,
        routing: Routing::TopKSoftmax,
        activation: Activation::Silu,
    };
    let (d, n) = (x.len() / (router.len() / count), router.len() / count);
    let mut refused = None;
    run_rows(backend, n, |step| {
        let xs = step.upload(x, d)?;
        let logits = step.upload(router, count)?;
        let mut out = step.rows(n, d)?;
        refused = step.experts(&xs, &logits, &experts, moe, &mut out).err();
        Ok(())
    });
    match refused {
        Some(BackendError::Unsupported(what)) => assert!(what.contains("expert"), "{what}"),
        other => panic!("experts larger than a buffer: {other:?}"),
    }
}

/// Both RoPE styles, with part of each head rotated, frequency factors and YaRN, on two
/// sequences, one at positions past 4096.
pub fn rope_matches_the_reference<S: Subject>() {
    let (head_dim, heads) = (64, 3);
    let factors: Vec<f32> = (0..24).map(|i| 1.0 + i as f32 / 8.0).collect();
    for backend in S::variants(Family::Other) {
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
            let positions: Vec<usize> = (4097..4102).chain(3..5).collect();
            let x = random(9, 7 * heads * head_dim);
            let mut got = vec![0f32; x.len()];
            let ropes = backend.upload_ropes(vec![Rope::new(params)]).unwrap();
            run(&backend, &batch, &first_pos, &ropes, |step| {
                let mut rows = step.upload(&x, heads * head_dim)?;
                step.rope(0, &mut rows)?;
                step.read(&rows, &mut got)
            });
            let want = reference::rope(&Rope::new(params), &x, &positions);
            let scale = vec![1.0; want.len()];
            let what = format!("{style:?}, {}", S::describe(&backend));
            assert_close(&got, &want, &scale, ROPE_TOLERANCE, &what);
        }
    }
}

/// The LM head's soft-capped logits, copied back to the host: in one block, and in blocks of
/// one row where the backend's buffers are capped to one row's logits.
pub fn logits_are_soft_capped_products<S: Subject>() {
    let variants = S::variants(Family::Products).chain(S::capped(300 * 4));
    for backend in variants {
        let (rows, cols, n, cap) = (300, 256, 3, 30.0f32);
        let (file, w) = matrix_file(GgmlType::Q6_K, rows, cols, 11);
        let m = upload(&backend, &file, rows, cols);
        let x = random(12, n * cols);
        let mut got = vec![0f32; n * rows];
        run_rows(&backend, n, |step| {
            let xs = step.upload(&x, cols)?;
            step.logits(&xs, &m, Some(cap), Output::Logits(&mut got))
        });
        let (exact, scale) = reference::products(&w, &x, cols);
        let c = f64::from(cap);
        let want: Vec<f64> = exact.iter().map(|v| c * (v / c).tanh()).collect();
        assert!(exact.iter().any(|v| v.abs() > c), "some logits are capped");
        let bound = S::products_bound(&backend, GgmlType::Q6_K);
        let what = format!("logits, {}", S::describe(&backend));
        assert_close(&got, &want, &scale, bound, &what);
    }
}

/// Greedy tokens chosen on the device are the host's argmax of the logits the same step
/// copies back: the first of equal values (rows 150.. repeat rows ..150, and a cap makes
/// large logits equal), never a NaN (rows 7 and 157); in one block and in blocks of one row.
pub fn greedy_tokens_are_the_argmax_of_the_logits<S: Subject>() {
    let (rows, cols, n) = (300, 64, 5);
    let file = tied_logits_matrix(21, rows, cols);
    let x = random(22, n * cols);
    let variants = S::variants(Family::Reductions).chain(S::capped(rows as u64 * 4));
    for backend in variants {
        let m = upload(&backend, &file, rows, cols);
        for cap in [None, Some(0.05)] {
            let draws = vec![Draw::GREEDY; n];
            let ahead = cap.is_some();
            let (logits, tokens) =
                logits_and_draws(&backend, (&m, rows), (&x, cols), cap, (&draws, ahead));
            let want: Vec<u32> = logits.chunks_exact(rows).map(argmax).collect();
            let what = format!("cap {cap:?}, {}", S::describe(&backend));
            assert_eq!(tokens, want, "{what}");
            assert!(want.iter().all(|&t| t < 150 && t != 7), "{want:?}");
        }
    }
}

/// An F32 matrix of `rows` rows of `cols` whose second half repeats its first (so that
/// logits tie in pairs), with a NaN in row 7 (and its repeat).
fn tied_logits_matrix(seed: u64, rows: usize, cols: usize) -> Arc<GgufFile> {
    let mut w = random(seed, rows / 2 * cols);
    w[7 * cols] = f32::NAN;
    w.extend_from_within(..);
    let data: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    file_of(GgmlType::F32, rows, cols, &data)
}

/// In one step, the logits of `x`'s rows (of `cols`) through `m` (of `rows` rows),
/// soft-capped by `cap`, and the tokens `draws` draws from them on the device: draws the step
/// knows ahead (`StepInput::draws`) where `ahead`, else only at its end.
fn logits_and_draws<B: Backend>(
    backend: &B,
    (m, rows): (&B::Matrix, usize),
    (x, cols): (&[f32], usize),
    cap: Option<f32>,
    (draws, ahead): (&[Draw], bool),
) -> (Vec<f32>, Vec<u32>) {
    let n = draws.len();
    let (mut logits, mut tokens) = (vec![0f32; n * rows], vec![0u32; n]);
    run_rows_drawing(backend, n, ahead.then_some(draws), |step| {
        let xs = step.upload(x, cols)?;
        step.logits(&xs, m, cap, Output::Logits(&mut logits))?;
        let out = Output::Draw {
            draws,
            tokens: &mut tokens,
        };
        step.logits(&xs, m, cap, out)
    });
    (logits, tokens)
}

/// Tokens drawn on the device at a temperature, through top-k, top-p and min-p, are those the
/// host draws from the logits the same step copies back, with the same seeds: each row under
/// its own parameters (greedy among them), values tied in pairs (rows 500.. repeat rows
/// ..500), a NaN never drawn (rows 7 and 507); in one block and in blocks of one row.
pub fn drawn_tokens_are_the_host_draws<S: Subject>() {
    let (rows, cols) = (1000, 64);
    let file = tied_logits_matrix(23, rows, cols);
    let sampling = |temperature, top_k, top_p, min_p| Draw {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: 0,
    };
    let rows_draws = [
        sampling(1.0, 0, 1.0, 0.0),
        sampling(0.7, 40, 1.0, 0.0),
        sampling(1.3, 0, 0.9, 0.0),
        sampling(0.8, 0, 1.0, 0.05),
        sampling(1.0, 50, 0.8, 0.02),
        Draw::GREEDY,
        sampling(2.0, 3, 1.0, 0.0),
        sampling(0.5, 2000, 0.5, 0.0),
    ];
    let n = rows_draws.len();
    let x = random(24, n * cols);
    let variants = S::variants(Family::Reductions).chain(S::capped(rows as u64 * 4));
    for backend in variants {
        let m = upload(&backend, &file, rows, cols);
        for round in 0..4u64 {
            let draws: Vec<Draw> = (rows_draws.iter().enumerate())
                .map(|(r, d)| Draw {
                    seed: (round << 32) | (r as u64 * 0x9e37),
                    ..*d
                })
                .collect();
            let ahead = round % 2 == 0;
            let (logits, tokens) =
                logits_and_draws(&backend, (&m, rows), (&x, cols), None, (&draws, ahead));
            let mut want = vec![0u32; n];
            draw_rows(&logits, rows, &draws, &mut want).unwrap();
            assert_eq!(tokens, want, "round {round}, {}", S::describe(&backend));
            assert!(want.iter().all(|&t| t % 500 != 7), "{want:?}");
        }
        // Negative logits at a temperature near 0 all overflow to -inf, which no filter
        // keeps: the argmax.
        let negative: Vec<f32> = (random(25, 64 * cols).iter())
            .map(|v| -v.abs() - 0.01)
            .collect();
        let data: Vec<u8> = negative.iter().flat_map(|v| v.to_le_bytes()).collect();
        let m = upload(&backend, &file_of(GgmlType::F32, 64, cols, &data), 64, cols);
        let x: Vec<f32> = random(26, 2 * cols).iter().map(|v| v.abs()).collect();
        let draws = [1.0, 0.5].map(|top_p| sampling(1e-38, 0, top_p, 0.0));
        let (logits, tokens) =
            logits_and_draws(&backend, (&m, 64), (&x, cols), None, (&draws, true));
        assert!(logits
            .iter()
            .all(|&l| l < 0.0 && l / 1e-38 == f32::NEG_INFINITY));
        let want: Vec<u32> = logits.chunks_exact(64).map(argmax).collect();
        assert_eq!(tokens, want, "{}", S::describe(&backend));
    }
}

/// The logits of a few chosen tokens equal, bit for bit, those tokens' columns of the whole
/// soft-capped logits the same step copies back: tokens out of order, one twice, in one
/// block and in blocks of one row.
pub fn chosen_tokens_logits_are_columns_of_the_logits<S: Subject>() {
    let (rows, cols, n, cap) = (300, 256, 9, 30.0f32);
    let chosen = [299u32, 4, 150, 4, 17];
    let variants = S::variants(Family::Products).chain(S::capped(rows as u64 * 4));
    for backend in variants {
        let (file, _) = matrix_file(GgmlType::Q4_1, rows, cols, 13);
        let m = upload(&backend, &file, rows, cols);
        let x = random(14, n * cols);
        let (mut logits, mut got) = (vec![0f32; n * rows], vec![f32::NAN; n * chosen.len()]);
        run_rows(&backend, n, |step| {
            let xs = step.upload(&x, cols)?;
            step.logits(&xs, &m, Some(cap), Output::Logits(&mut logits))?;
            let out = Output::Selected {
                tokens: &chosen,
                logits: &mut got,
            };
            step.logits(&xs, &m, Some(cap), out)
        });
        let want: Vec<u32> = logits
            .chunks_exact(rows)
            .flat_map(|row| chosen.map(|t| row[t as usize].to_bits()))
            .collect();
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{}", S::describe(&backend));
    }
}

/// The rows a step gathers for the LM head and for hidden states are the plan's, in order,
/// copied exactly: one chunk's last row produces logits, another's every row and a third's
/// last row produce hidden states.
pub fn output_rows_are_the_planned_rows<S: Subject>() {
    let width = 40;
    let mut batch = Batch::new();
    batch.push(SeqId(0), &[0; 3], Logits::Last);
    batch.push_hidden(SeqId(1), &[0; 4], Logits::All);
    batch.push_hidden(SeqId(2), &[0; 2], Logits::Last);
    let n = batch.tokens.len();
    let x = random(31, n * width);
    let row = |r: usize| x[r * width..][..width].to_vec();
    for backend in S::variants(Family::Other) {
        let ropes = backend.upload_ropes(Vec::new()).unwrap();
        let (mut logit_rows, mut hidden_rows) = (vec![0f32; width], vec![0f32; 5 * width]);
        run(&backend, &batch, &[0, 0, 0], &ropes, |step| {
            let xs = step.upload(&x, width)?;
            let mut logits = step.rows(1, width)?;
            let mut hidden = step.rows(5, width)?;
            step.output_rows(&xs, OutputRows::Logits, &mut logits)?;
            step.output_rows(&xs, OutputRows::Hidden, &mut hidden)?;
            step.read(&logits, &mut logit_rows)?;
            step.read(&hidden, &mut hidden_rows)
        });
        let what = S::describe(&backend);
        assert_eq!(logit_rows, row(2), "{what}");
        let want: Vec<f32> = [3, 4, 5, 6, 8].into_iter().flat_map(row).collect();
        assert_eq!(hidden_rows, want, "{what}");
    }
}

/// How far attention outputs (of magnitude about one) may be from the reference over pages
/// of `dtype`. The reference reads K/V rounded as the pages hold them; where the backend
/// rotates heads before quantizing them (to spread outliers across a block), its rounding
/// differs from the reference's, by about a quantization step of the format.
pub fn attention_tolerance(dtype: KvDtype) -> f64 {
    match dtype {
        KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => 1e-5,
        KvDtype::Q8_0 => 0.03,
        KvDtype::Q4_0 => 0.4,
    }
}

/// Causal attention over KV pages of every type the backend holds, head shapes with
/// grouped queries, plain, soft-capped and windowed scores, with and without sinks (one
/// logit per query head, gpt-oss; one above every score): sequences that prefill a prompt
/// and then add more tokens, and a fork of the first made after its prompt (its next tokens
/// copy the shared, partly filled page first).
pub fn paged_attention_matches_the_reference<S: Subject>() {
    let shapes = [
        Heads {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
        },
        // Three query heads a KV head, and heads that fill no kernel's size exactly.
        Heads {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 96,
        },
        Heads {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 256,
        },
    ];
    for backend in S::variants(Family::Reductions) {
        let capabilities = backend.capabilities();
        for &dtype in &capabilities.kv_dtypes {
            for heads in shapes {
                if capabilities.check_head_dim(heads.head_dim).is_err() {
                    continue;
                }
                let windowed = Scores {
                    scale: 0.1,
                    softcap: Some(1.5),
                    window: Some(37),
                };
                let short_window = Scores {
                    window: Some(7),
                    ..Scores::plain(heads.head_dim)
                };
                let sinks: Vec<f32> = (0..heads.n_head)
                    .map(|h| if h == 0 { 40.0 } else { h as f32 - 1.5 })
                    .collect();
                let cases = [
                    (Scores::plain(heads.head_dim), None),
                    (windowed, None),
                    (short_window, None),
                    (Scores::plain(heads.head_dim), Some(&sinks[..])),
                    (short_window, Some(&sinks[..])),
                ];
                for (scores, sinks) in cases {
                    let (got, want) = attention_on(&backend, dtype, heads, scores, sinks);
                    let what = format!(
                        "{} {heads:?} {scores:?} sinks {sinks:?}, {}",
                        dtype.name(),
                        S::describe(&backend)
                    );
                    let scale = vec![1.0; want.len()];
                    assert_close(&got, &want, &scale, attention_tolerance(dtype), &what);
                }
            }
        }
    }
}

/// One sequence's keys and values, position after position, as its pages hold them.
#[derive(Clone, Default)]
struct History {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// The attention of [`paged_attention_matches_the_reference`] on `backend`, and the
/// reference's, over both steps, token after token.
fn attention_on<B: Backend>(
    backend: &B,
    dtype: KvDtype,
    heads: Heads,
    scores: Scores,
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f64>) {
    let page_size = 16;
    let layout = KvLayout::new(1, heads.n_head_kv, heads.head_dim)
        .with_page_size(page_size)
        .with_dtype(dtype);
    let groups = LayerGroups::global(1).unwrap();
    let pages = backend.new_pages(layout, &groups, 32).unwrap();
    let mut cache = PagedKvCache::over(groups, pages).unwrap();
    // (prompt, then) tokens of each sequence: the second step adds a chunk as long as a
    // prompt's beside short ones.
    let seqs = [(45, 9), (3, 2), (70, 3)];
    let mut ids: Vec<SeqId> = seqs.iter().map(|_| cache.create()).collect();
    // Each sequence's keys and values so far, as its pages hold them.
    let mut history: Vec<History> = vec![History::default(); 3];
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let ropes = backend.upload_ropes(Vec::new()).unwrap();
    for phase in 0..2 {
        if phase == 1 {
            ids.push(cache.fork(ids[0]).unwrap());
            history.push(history[0].clone());
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
        let q = attention_input(dtype, 20 + phase, n * heads.q_dim());
        let k = attention_input(dtype, 30 + phase, n * heads.kv_dim());
        let v = attention_input(dtype, 40 + phase, n * heads.kv_dim());
        let mut out = vec![0f32; q.len()];
        let mut plan = StepPlan::new();
        plan.build(&batch, &cache).unwrap();
        let input = StepInput {
            batch: &batch,
            plan: &plan,
            heads,
            page_size,
            ropes: &ropes,
            draws: None,
        };
        let mut scratch = B::Scratch::default();
        backend
            .run_step(&mut scratch, &input, |step| {
                let (mut q, mut k, mut v) = (
                    step.upload(&q, heads.q_dim())?,
                    step.upload(&k, heads.kv_dim())?,
                    step.upload(&v, heads.kv_dim())?,
                );
                let mut o = step.rows(n, heads.q_dim())?;
                step.write_kv(&mut cache, 0, &mut k, &mut v)?;
                let sinks = sinks.map(|s| backend.upload_vector(s)).transpose()?;
                step.attention(&cache, 0, scores, sinks.as_ref(), &mut q, &mut o)?;
                step.read(&o, &mut out)
            })
            .unwrap();
        got.extend(out);
        let mut token = 0;
        for (chunk, History { keys, values }) in batch.chunks.iter().zip(&mut history) {
            for _ in 0..chunk.len {
                let kv = token * heads.kv_dim()..(token + 1) * heads.kv_dim();
                keys.push(stored_heads(dtype, &k[kv.clone()], heads.head_dim));
                values.push(stored_heads(dtype, &v[kv], heads.head_dim));
                let q = &q[token * heads.q_dim()..][..heads.q_dim()];
                let pos = keys.len() - 1;
                want.extend(reference::attention(
                    q,
                    keys,
                    values,
                    pos,
                    heads.head_dim,
                    scores,
                    sinks,
                ));
                token += 1;
            }
        }
    }
    (got, want)
}

/// Queries, keys or values for attention over pages of `dtype`: activation-like values with
/// outliers where the pages hold floats, values within +-1 where they hold blocks (an outlier
/// makes its block's step, and so the rounding of its neighbours, eight times coarser).
fn attention_input(dtype: KvDtype, seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    match dtype.block_format() {
        None => rng.activations(n),
        Some(_) => (0..n).map(|_| rng.range(-1.0, 1.0)).collect(),
    }
}

/// One token's K or V row (heads of `head_dim`) as pages of `dtype` hold it.
fn stored_heads(dtype: KvDtype, row: &[f32], head_dim: usize) -> Vec<f32> {
    row.chunks_exact(head_dim)
        .flat_map(|head| reference::stored(dtype, head))
        .collect()
}

/// The device's read rate is measured, a plausible number of bytes a second (more than a
/// megabyte, less than a petabyte), and the probe's buffers are given back.
pub fn read_rate_is_measured_and_leaves_no_memory_behind<S: Subject>() {
    let backend = S::variants(Family::Products).next().expect("a variant");
    let before = backend.memory().map(|m| m.in_use);
    let rate = backend.read_rate(16 << 20).unwrap();
    assert!(
        rate > 1e6 && rate < 1e15,
        "{}: {rate}",
        S::describe(&backend)
    );
    assert_eq!(
        backend.memory().map(|m| m.in_use),
        before,
        "{}",
        S::describe(&backend)
    );
}
