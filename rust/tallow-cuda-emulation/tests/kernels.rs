//! The emulation itself: block reductions with blocks of one warp to 1024 threads (the
//! backend launches one shape; the conformance suite checks what it computes), and the
//! faults it reports: a divergent warp operation, mismatched arguments, unknown kernels.

use tallow_backend_cuda::Args;
use tallow_conformance::{assert_close, random, reference, widen, ROWS_TOLERANCE};
use tallow_cuda_emulation::{host, launch};

fn ones(n: usize) -> Vec<f64> {
    vec![1.0; n]
}

/// Runs `name` over `grid` blocks of `threads` threads.
fn run(name: &str, grid: u32, threads: u32, args: &Args) {
    // SAFETY: each test passes buffers as long as the kernel's indexing reaches.
    unsafe { launch(name, [grid, 1, 1], [threads, 1, 1], args) }.unwrap();
}

/// RMSNorm over rows narrower than a block, wider, and not a multiple of it; in place too.
#[test]
fn rms_norm_matches_the_reference() {
    for (rows, width, threads) in [(1, 64, 32), (7, 320, 128), (3, 1088, 256), (2, 50, 1024)] {
        let x = random(1, rows * width);
        let gain = random(2, width);
        let mut out = vec![0f32; x.len()];
        let mut args = Args::new();
        args.ptr(host(x.as_ptr()))
            .ptr(host(gain.as_ptr()))
            .f32(1e-5)
            .ptr(host(out.as_mut_ptr()));
        run("rms_norm", rows as u32, threads, args.i32(width as i32));
        let want = reference::rms_norm(&widen(&x), &gain, 1e-5);
        let what = format!("{rows}x{width}, {threads} threads");
        assert_close(&out, &want, &ones(want.len()), ROWS_TOLERANCE, &what);

        let mut in_place = x.clone();
        let mut args = Args::new();
        args.ptr(host(in_place.as_ptr()))
            .ptr(host(gain.as_ptr()))
            .f32(1e-5);
        run(
            "rms_norm",
            rows as u32,
            threads,
            args.ptr(host(in_place.as_mut_ptr())).i32(width as i32),
        );
        assert_eq!(in_place, out, "in place, {what}");
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
    // SAFETY: neither launch runs a kernel.
    let unknown = unsafe { launch("no_such_kernel", [1, 1, 1], [32, 1, 1], &Args::new()) };
    assert!(unknown
        .unwrap_err()
        .0
        .contains("no kernel named no_such_kernel"));
    let x = [0f32; 4];
    let missing = unsafe {
        launch(
            "add",
            [1, 1, 1],
            [32, 1, 1],
            Args::new().ptr(host(x.as_ptr())),
        )
    };
    assert!(missing.unwrap_err().0.contains("do not match"));
    let too_large = unsafe {
        launch(
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
