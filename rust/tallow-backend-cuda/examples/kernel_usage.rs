//! ptxas's report of every CUDA kernel (registers, spills, stack, static shared memory) for
//! Ampere (sm_80) and Hopper (sm_90), as the markdown table of docs/cuda-kernels.md. Needs
//! NVRTC (`TALLOW_NVRTC`, or the system's), not a GPU.
//!
//!     cargo run --release -p tallow-backend-cuda --features driver --example kernel_usage

use std::process::ExitCode;

use tallow_backend_cuda::kernel_usage;

fn main() -> ExitCode {
    let (ampere, hopper) = match (kernel_usage(80), kernel_usage(90)) {
        (Ok(a), Ok(h)) => (a, h),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!("| kernel | source | sm_80 registers | sm_90 registers | spills (bytes) | stack (bytes) | shared (bytes) |");
    println!("| --- | --- | --: | --: | --: | --: | --: |");
    for a in &ampere {
        let Some(h) = hopper.iter().find(|h| h.kernel == a.kernel) else {
            continue;
        };
        let spills = a.spill_stores + a.spill_loads + h.spill_stores + h.spill_loads;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            a.kernel,
            a.source,
            a.registers,
            h.registers,
            spills,
            a.stack.max(h.stack),
            a.shared
        );
    }
    ExitCode::SUCCESS
}
