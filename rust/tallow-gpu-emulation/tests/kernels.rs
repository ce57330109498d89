//! The emulation itself: block reductions with blocks of one warp to 1024 threads (the
//! backend launches one shape; the conformance suite checks what it computes), and the
//! faults it reports: a divergent warp operation, mismatched arguments, unknown kernels.
//! Also the integer products against their exact reference, which the suite cannot state.

use tallow_backend_gpu::{is_quantized, kernels, Args, WEIGHT_FORMATS};
use tallow_conformance::{assert_close, random, reference, widen, ROWS_TOLERANCE};
use tallow_gpu_emulation::{host, launch, Api};
use tallow_quant::testing::{dequantized, random_blocks, Rng};

fn ones(n: usize) -> Vec<f64> {
    vec![1.0; n]
}

/// Runs `api`'s kernel `name` over `grid` blocks of `threads` threads.
fn run(api: Api, name: &str, grid: u32, threads: u32, args: &Args) {
    // SAFETY: each test passes buffers as long as the kernel's indexing reaches.
    unsafe { launch(api, name, [grid, 1, 1], [threads, 1, 1], args) }.unwrap();
}

/// RMSNorm over rows narrower than a block, wider, and not a multiple of it; in place too;
/// with each API's kernel.
#[test]
fn rms_norm_matches_the_reference() {
    for api in [Api::Cuda, Api::Metal] {
        rms_norm_of(api);
    }
}

fn rms_norm_of(api: Api) {
    for (rows, width, threads) in [(1, 64, 32), (7, 320, 128), (3, 1088, 256), (2, 50, 1024)] {
        let x = random(1, rows * width);
        let gain = random(2, width);
        let mut out = vec![0f32; x.len()];
        let mut args = Args::new();
        args.ptr(host(x.as_ptr()))
            .ptr(host(gain.as_ptr()))
            .f32(1e-5)
            .ptr(host(out.as_mut_ptr()));
        run(
            api,
            "rms_norm",
            rows as u32,
            threads,
            args.i32(width as i32),
        );
        let want = reference::rms_norm(&widen(&x), &gain, 1e-5);
        let what = format!("{api:?}: {rows}x{width}, {threads} threads");
        assert_close(&out, &want, &ones(want.len()), ROWS_TOLERANCE, &what);

        let mut in_place = x.clone();
        let mut args = Args::new();
        args.ptr(host(in_place.as_ptr()))
            .ptr(host(gain.as_ptr()))
            .f32(1e-5);
        run(
            api,
            "rms_norm",
            rows as u32,
            threads,
            args.ptr(host(in_place.as_mut_ptr())).i32(width as i32),
        );
        assert_eq!(in_place, out, "in place, {what}");
    }
}

/// Each API defines every kernel the backend may launch on it (its products' as its crate
/// chooses them, and every other operation's), with each API's name.
#[test]
fn every_api_defines_every_kernel_the_backend_launches() {
    for api in [Api::Cuda, Api::Metal] {
        let names = kernels::names(|ty, n| api.product(ty, n), true);
        for name in &names {
            // SAFETY: no arguments, so no kernel runs: the launch fails on their count.
            let error = unsafe { launch(api, name, [1, 1, 1], [32, 1, 1], &Args::new()) };
            let message = error.unwrap_err().0;
            assert!(
                message.contains("do not match"),
                "{api:?} {name}: {message}"
            );
        }
        let tiles = if api == Api::Cuda {
            "tiles_q4_k"
        } else {
            "matmul_tiles_q4_k"
        };
        assert!(names.iter().any(|n| n == tiles), "{api:?}: {names:?}");
    }
}

#[test]
fn a_warp_operation_that_half_a_warp_skips_is_an_error() {
    let mut out = vec![0f32; 64];
    // SAFETY: 64 threads write their own value of `out`.
    let error = unsafe {
        launch(
            Api::Cuda,
            "divergent_shuffle",
            [1, 1, 1],
            [64, 1, 1],
            Args::new().ptr(host(out.as_mut_ptr())),
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
    for api in [Api::Cuda, Api::Metal] {
        launch_errors_of(api);
    }
}

fn launch_errors_of(api: Api) {
    // SAFETY: no launch runs a kernel.
    let unknown = unsafe { launch(api, "no_such_kernel", [1, 1, 1], [32, 1, 1], &Args::new()) };
    assert!(unknown
        .unwrap_err()
        .0
        .contains(&format!("no kernel named {}/no_such_kernel", api.name())));
    let x = [0f32; 4];
    let missing = unsafe {
        launch(
            api,
            "add",
            [1, 1, 1],
            [32, 1, 1],
            Args::new().ptr(host(x.as_ptr())),
        )
    };
    assert!(missing.unwrap_err().0.contains("do not match"));
    // An int where a pointer goes.
    let mistyped = unsafe {
        launch(
            api,
            "add",
            [1, 1, 1],
            [32, 1, 1],
            Args::new().ptr(host(x.as_ptr())).i32(0).i32(4),
        )
    };
    assert!(mistyped.unwrap_err().0.contains("do not match"));
    let too_large = unsafe {
        launch(
            api,
            "add",
            [1, 1, 1],
            [2048, 1, 1],
            Args::new()
                .ptr(host(x.as_ptr()))
                .ptr(host(x.as_ptr()))
                .i32(4),
        )
    };
    assert!(too_large.unwrap_err().0.contains("1 to 1024"));
}

/// The integer products in every quantized format, matvec.cu's for 1 to 9 tokens and
/// tiles.cu's for tiles cut by the matrix's and the step's edges: exactly the dequantized
/// weights times the activations as `quantize_q8` rounds them (d = max|x| / 127 a run of 32,
/// q = round(x / d)), up to f32 sums. The conformance suite compares them with the
/// unquantized activations, within the rounding that quantizing them costs.
#[test]
fn integer_products_are_the_weights_times_the_quantized_activations() {
    let quantized = WEIGHT_FORMATS.into_iter().filter(|&ty| is_quantized(ty));
    for (f, ty) in quantized.enumerate() {
        let cols = if ty.block_len() == 256 { 512 } else { 160 };
        let name = ty.name().to_lowercase();
        for (kernel, rows, n) in [("matvec", 6, 1), ("matvec", 6, 3), ("matvec", 6, 9)]
            .into_iter()
            .chain([("tiles", 70, 9), ("tiles", 70, 70)])
        {
            let blocks = rows * cols / ty.block_len();
            let bytes = random_blocks(&mut Rng::new(f as u64), ty, blocks);
            let w = dequantized(ty, &bytes);
            // Word-aligned, as device allocations are.
            let mut words = vec![0u32; bytes.len().div_ceil(4)];
            bytemuck_copy(&bytes, &mut words);
            let x = random(50 + n as u64, n * cols);
            let n_runs = n * cols / 32;
            let mut q = vec![0u32; n * cols / 4];
            let mut runs = vec![0u32; 4 * n_runs];
            let mut args = Args::new();
            args.ptr(host(x.as_ptr()))
                .ptr(host(q.as_mut_ptr()))
                .ptr(host(runs.as_mut_ptr()))
                .i32(n_runs as i32);
            run(
                Api::Cuda,
                "quantize_q8",
                n_runs.div_ceil(8) as u32,
                256,
                &args,
            );
            let mut y = vec![0f32; n * rows];
            let mut args = Args::new();
            args.ptr(host(words.as_ptr()))
                .ptr(host(q.as_ptr()))
                .ptr(host(runs.as_ptr()))
                .ptr(host(y.as_mut_ptr()));
            for v in [rows, cols, bytes.len() / rows, n] {
                args.i32(v as i32);
            }
            let (grid, threads) = match kernel {
                "matvec" => ([rows.div_ceil(4), n.div_ceil(8)], 128),
                _ => ([n.div_ceil(64), rows.div_ceil(64)], 256),
            };
            let grid = [grid[0] as u32, grid[1] as u32, 1];
            // SAFETY: the buffers hold what the kernels index: n rows of cols values.
            let kernel = format!("{kernel}_{name}");
            unsafe { launch(Api::Cuda, &kernel, grid, [threads, 1, 1], &args) }.unwrap();
            let rounded: Vec<f32> = x
                .chunks_exact(32)
                .flat_map(|run| {
                    let d = run.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
                    run.iter().map(move |v| (v * inverse).round_ties_even() * d)
                })
                .collect();
            let (want, scale) = reference::products(&w, &rounded, cols);
            let what = format!("{kernel} {} {rows}x{cols} x{n}", ty.name());
            assert_close(&y, &want, &scale, 1e-5, &what);
        }
    }
}

/// `bytes` into the start of `words`, byte for byte.
fn bytemuck_copy(bytes: &[u8], words: &mut [u32]) {
    for (word, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
        let mut b = [0u8; 4];
        b[..chunk.len()].copy_from_slice(chunk);
        *word = u32::from_le_bytes(b);
    }
}

/// The GPU kernels' codebooks (kernels-gpu/grids.h, written by `scripts/iq_grids.py --gpu`)
/// are the CPU's, word for word.
#[test]
fn the_gpu_codebooks_are_the_cpus() {
    let header = include_str!("../../../kernels-gpu/grids.h");
    for (name, want) in tallow_quant::codebook_words() {
        let start = header
            .find(&format!("TABLE uint32_t {name}["))
            .unwrap_or_else(|| panic!("grids.h has no {name}"));
        let body = &header[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        let words: Vec<u32> = body
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| u32::from_str_radix(w.trim_start_matches("0x"), 16).unwrap())
            .collect();
        assert_eq!(words, want, "{name}");
    }
}
