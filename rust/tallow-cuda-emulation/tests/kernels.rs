//! The CUDA kernels under emulation against the conformance suite's f64 references, and the
//! emulator's own faults: a divergent warp operation and mismatched arguments are errors.

use tallow_backend::{Activation, Rope, RopeParams, RopeScaling, RopeStyle};
use tallow_conformance::{assert_close, random, reference, ROPE_TOLERANCE, ROWS_TOLERANCE};
use tallow_cuda_emulation::{launch, Args};
use tallow_quant::testing::{dequantized, random_blocks, Rng};
use tallow_quant::GgmlType;

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

fn ones(n: usize) -> Vec<f64> {
    vec![1.0; n]
}

/// Runs `name` over `grid` blocks of `threads` threads.
fn run(name: &str, grid: u32, threads: u32, args: &Args) {
    // SAFETY: each test passes buffers as long as the kernel's indexing reaches.
    unsafe { launch(name, [grid, 1, 1], [threads, 1, 1], args) }.unwrap();
}

/// `rows` x `cols` random weights in `ty`: their bytes and the values they hold.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let data = random_blocks(&mut Rng::new(seed), ty, rows * cols / ty.block_len());
    let held = dequantized(ty, &data);
    (data, held)
}

/// The kernel of `prefix` for weights of `ty` (`matmul_q4_k`).
fn kernel(prefix: &str, ty: GgmlType) -> String {
    format!("{prefix}_{}", ty.name().to_lowercase())
}

/// Rows by id in every format: the values the blocks hold, scaled.
#[test]
fn embeddings_are_the_dequantized_rows_in_every_format() {
    for (f, ty) in GgmlType::WEIGHTS.into_iter().enumerate() {
        let (rows, cols) = (23, if ty.block_len() == 256 { 512 } else { 96 });
        let (w, held) = weights(ty, rows, cols, 30 + f as u64);
        let ids = [3i32, 0, 22, 3, 17];
        let mut out = vec![0f32; ids.len() * cols];
        let mut args = Args::new();
        args.ptr(w.as_ptr()).ptr(ids.as_ptr()).i32(cols as i32);
        args.i32((w.len() / rows) as i32)
            .f32(1.5)
            .ptr(out.as_mut_ptr());
        run(&kernel("embed", ty), ids.len() as u32, 64, &args);
        let want: Vec<f64> = (ids.iter())
            .flat_map(|&id| &held[id as usize * cols..][..cols])
            .map(|&v| f64::from(v) * 1.5)
            .collect();
        let scale: Vec<f64> = want.iter().map(|v| v.abs()).collect();
        assert_close(&out, &want, &scale, 1e-6, ty.name());
    }
}

/// Products in every format: rows whose bytes are not whole words, 37 rows, rows of fewer
/// runs of 32 than a warp has lanes and of more, token counts around the tiles of 8.
#[test]
fn products_match_the_dequantized_weights_in_every_format() {
    for (f, ty) in GgmlType::WEIGHTS.into_iter().enumerate() {
        let widths = if ty.block_len() == 256 {
            [512, 9 * 256]
        } else {
            [96, 67 * 32]
        };
        let rows = 37;
        for cols in widths {
            let (w, held) = weights(ty, rows, cols, f as u64 + 1);
            for n in [1, 5, 11] {
                let x = random(100 + n as u64, n * cols);
                let mut y = vec![0f32; n * rows];
                let mut args = Args::new();
                args.ptr(w.as_ptr()).ptr(x.as_ptr()).ptr(y.as_mut_ptr());
                args.i32(rows as i32)
                    .i32(cols as i32)
                    .i32((w.len() / rows) as i32);
                let tiles = n.div_ceil(8) as u32;
                // SAFETY: the buffers hold what the kernel reads and writes.
                unsafe {
                    launch(
                        &kernel("matmul", ty),
                        [rows as u32, tiles, 1],
                        [32, 1, 1],
                        args.i32(n as i32),
                    )
                }
                .unwrap();
                let (want, scale) = reference::products(&held, &x, cols);
                assert_close(
                    &y,
                    &want,
                    &scale,
                    1e-5,
                    &format!("{} {cols} x{n}", ty.name()),
                );
            }
        }
    }
}

/// RMSNorm over rows narrower than a block, wider, and not a multiple of it; in place too.
#[test]
fn rms_norm_matches_the_reference() {
    for (rows, width, threads) in [(1, 64, 32), (7, 320, 128), (3, 1088, 256), (2, 50, 1024)] {
        let x = random(1, rows * width);
        let gain = random(2, width);
        let mut out = vec![0f32; x.len()];
        let mut args = Args::new();
        args.ptr(x.as_ptr())
            .ptr(gain.as_ptr())
            .f32(1e-5)
            .ptr(out.as_mut_ptr());
        run("rms_norm", rows as u32, threads, args.i32(width as i32));
        let want = reference::rms_norm(&widen(&x), &gain, 1e-5);
        let what = format!("{rows}x{width}, {threads} threads");
        assert_close(&out, &want, &ones(want.len()), ROWS_TOLERANCE, &what);

        let mut in_place = x.clone();
        let mut args = Args::new();
        args.ptr(in_place.as_ptr()).ptr(gain.as_ptr()).f32(1e-5);
        run(
            "rms_norm",
            rows as u32,
            threads,
            args.ptr(in_place.as_mut_ptr()).i32(width as i32),
        );
        assert_eq!(in_place, out, "in place, {what}");
    }
}

#[test]
fn element_wise_operations_match_the_reference() {
    let (n, width) = (1000, 320);
    let (x, y, bias) = (random(3, n), random(4, n), random(5, width));
    let blocks = n.div_ceil(256) as u32;

    let mut sum = x.clone();
    run(
        "add",
        blocks,
        256,
        Args::new()
            .ptr(sum.as_mut_ptr())
            .ptr(y.as_ptr())
            .i32(n as i32),
    );
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| f64::from(a) + f64::from(b))
        .collect();
    assert_close(&sum, &want, &ones(n), ROWS_TOLERANCE, "add");

    let mut biased = x.clone();
    let mut args = Args::new();
    args.ptr(biased.as_mut_ptr()).ptr(bias.as_ptr());
    run(
        "add_bias",
        blocks,
        256,
        args.i32(n as i32).i32(width as i32),
    );
    let want: Vec<f64> = (x.iter().enumerate())
        .map(|(i, &v)| f64::from(v) + f64::from(bias[i % width]))
        .collect();
    assert_close(&biased, &want, &ones(n), ROWS_TOLERANCE, "bias");

    for (activation, gelu) in [(Activation::Silu, 0), (Activation::GeluTanh, 1)] {
        let mut gate = x.clone();
        let mut args = Args::new();
        args.ptr(gate.as_mut_ptr()).ptr(y.as_ptr()).i32(n as i32);
        run("gated", blocks, 256, args.i32(gelu));
        let want = reference::gated(activation, &widen(&x), &widen(&y));
        assert_close(
            &gate,
            &want,
            &ones(n),
            ROWS_TOLERANCE,
            &format!("{activation:?}"),
        );
    }
}

/// Both styles, part of each head rotated, YaRN and frequency factors, positions past 4096.
#[test]
fn rope_matches_the_reference() {
    let (head_dim, heads) = (64, 3);
    let factors: Vec<f32> = (0..24).map(|i| 1.0 + i as f32 / 8.0).collect();
    let positions: Vec<usize> = (4097..4102).chain(3..5).collect();
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let rope = Rope::new(RopeParams {
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
        });
        let x = random(9, positions.len() * heads * head_dim);
        let as_u32: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let mut angles = vec![0f32; positions.len() * rope.angles_len()];
        rope.angles_of(&as_u32, &mut angles);
        let mut got = x.clone();
        let mut args = Args::new();
        args.ptr(got.as_mut_ptr()).ptr(angles.as_ptr());
        args.i32((heads * head_dim) as i32).i32(head_dim as i32);
        args.i32((rope.angles_len() / 2) as i32)
            .i32(i32::from(style == RopeStyle::Halves));
        run("rope", positions.len() as u32, 64, &args);
        let want = reference::rope(&rope, &x, &positions);
        assert_close(
            &got,
            &want,
            &ones(want.len()),
            ROPE_TOLERANCE,
            &format!("{style:?}"),
        );
    }
}

#[test]
fn a_warp_operation_that_half_a_warp_skips_is_an_error() {
    let mut out = vec![0f32; 64];
    // SAFETY: 64 threads write their own value of `out`.
    let error = unsafe {
        launch(
            "divergent_shuffle",
            [1, 1, 1],
            [64, 1, 1],
            Args::new().ptr(out.as_mut_ptr()),
        )
    }
    .unwrap_err();
    assert!(
        error.0.contains("divergent_shuffle") && error.0.contains("warp"),
        "{error}"
    );
}

#[test]
fn unknown_kernels_and_mismatched_arguments_are_errors() {
    // SAFETY: neither launch runs a kernel.
    let unknown = unsafe { launch("no_such_kernel", [1, 1, 1], [32, 1, 1], &Args::new()) };
    assert!(unknown
        .unwrap_err()
        .0
        .contains("no kernel named no_such_kernel"));
    let x = [0f32; 4];
    let missing = unsafe { launch("add", [1, 1, 1], [32, 1, 1], Args::new().ptr(x.as_ptr())) };
    assert!(missing.unwrap_err().0.contains("do not match"));
    let too_large = unsafe {
        launch(
            "add",
            [1, 1, 1],
            [2048, 1, 1],
            Args::new().ptr(x.as_ptr()).ptr(x.as_ptr()).i32(4),
        )
    };
    assert!(too_large.unwrap_err().0.contains("1 to 1024"));
}
