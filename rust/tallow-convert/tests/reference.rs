//! The tiny reference checkpoints (`shared/reference/arch/<arch>/hf`) converted here against
//! the GGUF files llama.cpp's converter made from the same folders (F32, F16 and Q8_0): every
//! metadata key it writes with the same value, the same tensors with the same bytes.

use std::path::PathBuf;

use tallow_convert::{convert_to_bytes, OutType};
use tallow_gguf::{GgmlType, GgufFile, Value};

/// Every reference architecture tallow converts (gpt-oss's fused, interleaved experts are not).
const ARCHS: &[&str] = &[
    "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2moe",
    "qwen3moe",
];

/// `shared/reference/arch` (`$TALLOW_SHARED_DIR/reference/arch`).
fn arch_dir() -> PathBuf {
    let shared = std::env::var_os("TALLOW_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    shared.join("reference/arch")
}

/// Keys that name the file rather than the model.
const NAMING: &[&str] = &["general.name", "general.size_label"];

/// Each file llama.cpp made, and what makes the same one here.
const FILES: &[(&str, OutType)] = &[
    ("f32", OutType::Keep),
    ("f16", OutType::Type(GgmlType::F16)),
    ("q8_0", OutType::Type(GgmlType::Q8_0)),
];

#[test]
fn conversions_equal_llama_cpp_s() {
    for (arch, (suffix, out_type)) in ARCHS.iter().flat_map(|a| FILES.iter().map(move |f| (a, f))) {
        let dir = arch_dir().join(arch);
        let ours = GgufFile::from_bytes(convert_to_bytes(&dir.join("hf"), *out_type).unwrap())
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let theirs = GgufFile::open(dir.join(format!("{arch}-{suffix}.gguf"))).unwrap();
        let arch = format!("{arch} {suffix}");
        for (key, value) in theirs.metadata() {
            if NAMING.contains(&key.as_str()) {
                continue;
            }
            let got = ours.get(key).unwrap_or_else(|| panic!("{arch}: no {key}"));
            match (got, value) {
                // Through f32 either way; llama.cpp rounds the f64 of config.json the same.
                (Value::F32(a), Value::F32(b)) => {
                    assert_eq!(a.to_bits(), b.to_bits(), "{arch}: {key}")
                }
                _ => assert_eq!(got, value, "{arch}: {key}"),
            }
        }
        let names = |f: &GgufFile| {
            let mut n: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
            n.sort();
            n
        };
        assert_eq!(names(&ours), names(&theirs), "{arch}");
        for want in theirs.tensors() {
            let got = ours.tensor(&want.name).unwrap();
            assert_eq!(
                (&got.dims, got.ty),
                (&want.dims, want.ty),
                "{arch}: {}",
                want.name
            );
            // Llama 3's rope_freqs too: computed here as torch computes them.
            let (a, b) = (ours.tensor_data(got), theirs.tensor_data(want));
            assert!(a == b, "{arch}: {} differs", want.name);
        }
    }
}

#[test]
fn bad_folders_are_errors_that_say_what_is_wrong() {
    let tmp = std::env::temp_dir().join(format!("tallow-convert-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let err = convert_to_bytes(&tmp, OutType::Keep).err().unwrap();
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(
        tmp.join("config.json"),
        r#"{"architectures": ["BertModel"]}"#,
    )
    .unwrap();
    std::fs::write(
        tmp.join("model.safetensors"),
        b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
    )
    .unwrap();
    let err = convert_to_bytes(&tmp, OutType::Keep).err().unwrap();
    assert!(
        err.to_string().contains("BertModel") && err.to_string().contains("LlamaForCausalLM"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
    let qwen3 = arch_dir().join("qwen3/hf");
    let err = convert_to_bytes(&qwen3, OutType::Type(GgmlType::Q4_K))
        .err()
        .unwrap();
    assert!(err.to_string().contains("not converted to Q4_K"), "{err}");
    assert_eq!(
        OutType::named("q8_0").unwrap(),
        OutType::Type(GgmlType::Q8_0)
    );
    assert_eq!(
        OutType::named("BF16").unwrap(),
        OutType::Type(GgmlType::BF16)
    );
    assert!(OutType::named("q4_k")
        .unwrap_err()
        .to_string()
        .contains("q8_0, q5_1"));
}

/// A conversion into a temporary file holds the bytes of one in memory, in a folder made for
/// it, where it leaves no file behind.
#[test]
fn a_conversion_to_a_temporary_file_is_the_image_and_leaves_nothing() {
    let hf = arch_dir().join("qwen3/hf");
    let scratch =
        std::env::temp_dir().join(format!("tallow-convert-scratch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let out_type = OutType::Type(GgmlType::Q8_0);
    let mut file =
        tallow_convert::convert_to_temp_file(&hf, out_type, &scratch.join("made")).unwrap();
    let mut bytes = Vec::new();
    std::io::Seek::rewind(&mut file).unwrap();
    std::io::Read::read_to_end(&mut file, &mut bytes).unwrap();
    assert_eq!(bytes, convert_to_bytes(&hf, out_type).unwrap());
    let mapped = GgufFile::from_file(&file, "qwen3").unwrap();
    assert_eq!(
        mapped.tensors().len(),
        GgufFile::from_bytes(bytes).unwrap().tensors().len()
    );
    let left = std::fs::read_dir(scratch.join("made")).unwrap().count();
    assert_eq!(left, 0, "the temporary file has no name");
    std::fs::remove_dir_all(&scratch).unwrap();
}
