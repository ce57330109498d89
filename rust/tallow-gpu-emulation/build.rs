//! Compiles each GPU API's kernels as C++ for the emulator (emulator/scheduler.cpp):
//! - CUDA's (kernels-cuda/*.cu) after kernels-cuda/emulation/cuda_emulation.h, in one
//!   translation unit with the scheduler (each kernel registers itself by name);
//! - Metal's (kernels-metal/*.metal) after kernels-metal/emulation/metal_emulation.h, once the
//!   steps a header cannot take are done here (build/metal.rs): threadgroup arrays made
//!   statics, and each kernel registered with what its parameters' attributes say.

use std::path::{Path, PathBuf};

#[path = "build/metal.rs"]
mod metal;

fn main() {
    // Read when the script runs, not when it is compiled: checkouts in other folders may share
    // one compiled build script.
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let emulator = manifest.join("emulator");
    for file in ["scheduler.h", "scheduler.cpp"] {
        println!("cargo:rerun-if-changed={}", emulator.join(file).display());
    }
    let shared = root.join("kernels-gpu");
    println!("cargo:rerun-if-changed={}", shared.display());
    for entry in std::fs::read_dir(&shared).expect("kernels-gpu/") {
        println!(
            "cargo:rerun-if-changed={}",
            entry.expect("an entry").path().display()
        );
    }
    let cuda = cuda_unit(&root.join("kernels-cuda"), &emulator, &out);
    let metal = metal::unit(&root.join("kernels-metal"), &shared, &out);
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        // Metal's `char` is signed, as x86-64's is and aarch64's is not.
        .flag_if_supported("-fsigned-char")
        .include(&emulator)
        .include(root.join("kernels-cuda"))
        .include(root.join("kernels-cuda/emulation"))
        .include(root.join("kernels-metal/emulation"))
        .include(&shared)
        .warnings(false)
        .file(cuda)
        .file(metal)
        .compile("tallow_gpu_emulation");
}

/// The translation unit of the scheduler and every CUDA kernel, written to `out`. The
/// scheduler is in it so that the launch function Rust calls keeps this object, and with it
/// the kernels' registrations, in the link.
fn cuda_unit(kernels: &Path, emulator: &Path, out: &Path) -> PathBuf {
    let emulation = kernels.join("emulation");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("kernels-cuda/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    // Kernels that exist to show the emulator's faults; never compiled for a GPU.
    sources.push(emulation.join("faults.cu"));
    let mut unit = format!(
        "#include \"{}\"\n#include \"cuda_emulation.h\"\n",
        emulator.join("scheduler.cpp").display()
    );
    for source in &sources {
        unit.push_str(&format!("#include \"{}\"\n", source.display()));
        println!("cargo:rerun-if-changed={}", source.display());
    }
    for header in ["tallow.cuh", "emulation/cuda_emulation.h"] {
        println!("cargo:rerun-if-changed={}", kernels.join(header).display());
    }
    println!("cargo:rerun-if-changed={}", kernels.display());
    let path = out.join("cuda.cpp");
    std::fs::write(&path, unit).expect("the CUDA translation unit is written");
    path
}
