//! NVRTC, loaded at run time, compiles every kernel source to a cubin for each generation from
//! Turing to Blackwell, each kernel the backend launches in it under its own name (no GPU or
//! driver needed; the test script points `TALLOW_NVRTC` at the PyPI wheel's library); where
//! NVRTC cannot be found, the error says what to install.

use tallow_backend::BackendError;
use tallow_backend_cuda::{cubins, SOURCES, WEIGHT_FORMATS};

/// The kernels the backend launches, by name: the cubins must export each (`extern "C"`).
fn kernel_names() -> Vec<String> {
    let fixed = [
        "rms_norm",
        "add",
        "add_bias",
        "gated",
        "rope",
        "kv_write_f16",
    ];
    let fixed = fixed
        .into_iter()
        .chain(["attention_f16", "gather_rows", "softcap", "argmax_rows"]);
    let per_format = WEIGHT_FORMATS.iter().flat_map(|ty| {
        let name = ty.name().to_lowercase();
        [format!("matmul_{name}"), format!("embed_{name}")]
    });
    fixed.map(String::from).chain(per_format).collect()
}

#[test]
fn every_kernel_compiles_for_each_generation_or_nvrtc_is_named_as_missing() {
    let kernels = SOURCES.iter().filter(|(n, _)| n.ends_with(".cu")).count();
    for arch in [75, 80, 86, 89, 90, 120] {
        let compiled = cubins(arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        assert_eq!(compiled.len(), kernels);
        for (source, cubin) in &compiled {
            assert_eq!(&cubin[..4], b"\x7fELF", "{source} for sm_{arch}");
        }
        for name in kernel_names() {
            let symbol = format!("\0{name}\0").into_bytes();
            let exported =
                (compiled.iter()).any(|(_, c)| c.windows(symbol.len()).any(|w| w == symbol));
            assert!(exported, "{name} for sm_{arch}");
        }
    }
    let found = std::env::var_os("TALLOW_NVRTC");
    std::env::set_var("TALLOW_NVRTC", "/nonexistent/libnvrtc.so.12");
    let missing = cubins(80);
    match found {
        Some(path) => std::env::set_var("TALLOW_NVRTC", path),
        None => std::env::remove_var("TALLOW_NVRTC"),
    }
    match missing {
        Err(BackendError::Unsupported(message)) => {
            assert!(message.contains("pip install tallow[cuda]"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}
