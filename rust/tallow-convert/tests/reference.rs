//! The tiny reference checkpoints (`shared/reference/arch/<arch>/hf`) converted here against
//! the GGUF files llama.cpp's converter made from the same folders (F32, F16 and Q8_0): every
//! metadata key it writes with the same value, the same tensors with the same bytes.

use std::path::PathBuf;

use tallow_convert::{convert_to_bytes, FileType, OutType};
use tallow_gguf::{GgufFile, Value};

/// Every reference architecture.
const ARCHS: &[&str] = &[
    "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2moe",
    "qwen3moe", "gpt-oss",
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
    ("f16", OutType::File(FileType::F16)),
    ("q8_0", OutType::File(FileType::Q8_0)),
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
    assert_eq!(
        OutType::named("q8_0").unwrap(),
        OutType::File(FileType::Q8_0)
    );
    assert_eq!(
        OutType::named("BF16").unwrap(),
        OutType::File(FileType::BF16)
    );
    let err = OutType::named("iq2_xxs").unwrap_err().to_string();
    assert!(
        err.contains("not converted to iq2_xxs") && err.contains("Q4_K_M, Q5_K_S"),
        "{err}"
    );
}

/// A conversion into a temporary file holds the bytes of one in memory, in a folder made for
/// it, where it leaves no file behind.
#[test]
fn a_conversion_to_a_temporary_file_is_the_image_and_leaves_nothing() {
    let hf = arch_dir().join("qwen3/hf");
    let scratch =
        std::env::temp_dir().join(format!("tallow-convert-scratch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let out_type = OutType::File(FileType::Q8_0);
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

/// FNV-1a of `llama-quantize`'s output (no importance matrix) from each architecture's F32
/// GGUF, over the architectures in `ARCHS` order, each one's tensors by name: the name, the
/// type's id (u32, little-endian) and the bytes (scripts/llama_quantize_hashes.py, llama.cpp
/// 11434). Rows of 64 take the fallback formats; the 256-long rows of the down projections
/// take the mixtures' K-quants and IQ4_XS.
const LLAMA_QUANTIZE_HASHES: [(FileType, u64); 15] = [
    (FileType::Q4_0, 0x8a98_3f39_3d27_a981),
    (FileType::Q4_1, 0xab2a_8736_bedd_407f),
    (FileType::Q5_0, 0x2cc8_b1ed_17de_f9aa),
    (FileType::Q5_1, 0x6c6f_23a5_a8b1_a817),
    (FileType::Q2_K, 0x01ec_83fb_03be_294a),
    (FileType::Q3_K_S, 0x01ec_83fb_03be_294a),
    (FileType::Q3_K_M, 0x188d_496d_18b7_d823),
    (FileType::Q3_K_L, 0x526d_11a0_cba7_3165),
    (FileType::Q4_K_S, 0x1139_a068_b9bd_44e8),
    (FileType::Q4_K_M, 0x80c4_dd61_4b91_3d78),
    (FileType::Q5_K_S, 0x422e_ccf3_0731_9056),
    (FileType::Q5_K_M, 0x66ce_a62f_75e6_51d1),
    (FileType::Q6_K, 0xaf4c_0e78_11f6_ceff),
    (FileType::IQ4_NL, 0x7c53_1dc5_9568_ba08),
    (FileType::IQ4_XS, 0xa578_a9e6_ef9a_9a76),
];

fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[test]
fn file_types_quantize_as_llama_quantize() {
    for (file_type, expected) in LLAMA_QUANTIZE_HASHES {
        let mut hash = 0xcbf2_9ce4_8422_2325;
        for arch in ARCHS {
            let hf = arch_dir().join(arch).join("hf");
            let gguf = convert_to_bytes(&hf, OutType::File(file_type)).unwrap();
            let gguf = GgufFile::from_bytes(gguf).unwrap();
            assert_eq!(
                gguf.get("general.file_type"),
                Some(&Value::U32(file_type.id()))
            );
            let mut tensors: Vec<_> = gguf.tensors().iter().collect();
            tensors.sort_by(|a, b| a.name.cmp(&b.name));
            for t in tensors {
                hash = fnv1a(hash, t.name.as_bytes());
                hash = fnv1a(hash, &t.ty.id().to_le_bytes());
                hash = fnv1a(hash, gguf.tensor_data(t));
            }
        }
        assert_eq!(
            hash,
            expected,
            "{}: tensors differ from llama-quantize's",
            file_type.name()
        );
    }
}
