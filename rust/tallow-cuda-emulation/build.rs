//! Compiles every kernel of kernels-cuda/ as C++ after the emulation header, in one
//! translation unit with the emulator's scheduler (each kernel registers itself by name).

use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
    let emulation = root.join("emulation");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("kernels-cuda/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    // Kernels that exist to show the emulator's faults; never compiled for a GPU.
    sources.push(emulation.join("faults.cu"));
    // The scheduler in the same unit: the launch function that Rust calls keeps this object,
    // and with it the kernels' registrations, in the link.
    let mut unit = String::from("#include \"cuda_emulation.cpp\"\n");
    for source in &sources {
        unit.push_str(&format!("#include \"{}\"\n", source.display()));
        println!("cargo:rerun-if-changed={}", source.display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let unit_path = out.join("kernels.cpp");
    std::fs::write(&unit_path, unit).expect("the translation unit is written");
    for header in [
        "tallow.cuh",
        "emulation/cuda_emulation.h",
        "emulation/cuda_emulation.cpp",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(header).display());
    }
    println!("cargo:rerun-if-changed={}", root.display());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include(&root)
        .include(&emulation)
        .warnings(false)
        .file(&unit_path)
        .compile("tallow_cuda_emulation");
}
