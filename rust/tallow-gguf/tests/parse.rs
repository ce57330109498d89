//! Parsing well-formed and damaged GGUF images built in memory.

use proptest::prelude::*;
use tallow_gguf::{Array, GgmlType, GgufError, GgufFile, Value};

mod common;
use common::Builder;

fn sample() -> Builder {
    Builder::new()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "ab"])
        .tensor_f32("norm.weight", &[1.0, 2.0, 3.0, 4.0])
        .tensor_f32("other", &[5.0; 8])
}

#[test]
fn reads_metadata_and_tensors() {
    let file = GgufFile::from_bytes(sample().build()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(
        file.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(
        file.get("llama.block_count").and_then(Value::as_u64),
        Some(2)
    );
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .unwrap();
    assert_eq!(
        tokens.as_strings().unwrap().iter().collect::<Vec<_>>(),
        ["a", "b", "ab"]
    );
    assert_eq!(tokens.get(1), Some(Value::String("b".into())));
    assert_eq!(tokens.get(3), None);
    assert_eq!(file.tensors().len(), 2);
    let norm = file.tensor("norm.weight").unwrap();
    assert_eq!(
        (norm.ty, norm.dims.as_slice(), norm.size),
        (GgmlType::F32, &[4u64][..], 16)
    );
    let data = file.tensor_data(norm);
    let values: Vec<f32> = data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, [1.0, 2.0, 3.0, 4.0]);
    let other = file.tensor("other").unwrap();
    assert_eq!(other.offset, 32);
    assert_eq!(file.tensor_data(other)[..4], 5.0f32.to_le_bytes());
}

#[test]
fn version_2_is_accepted_and_1_is_not() {
    let mut b = sample();
    b.version = 2;
    assert_eq!(GgufFile::from_bytes(b.build()).unwrap().version(), 2);
    b.version = 1;
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::UnsupportedVersion(1))
    ));
}

#[test]
fn wrong_magic() {
    let mut bytes = sample().build();
    bytes[..4].copy_from_slice(b"GGML");
    let err = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(err, GgufError::BadMagic { .. }));
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().build();
    for len in 0..bytes.len() {
        let err = GgufFile::from_bytes(bytes[..len].to_vec()).err();
        assert!(
            matches!(
                err,
                Some(GgufError::Truncated { .. } | GgufError::TensorOutOfRange { .. })
            ),
            "truncated to {len} bytes: {err:?}"
        );
    }
}

#[test]
fn tensor_offset_out_of_range() {
    let b = sample().tensor_raw("far", &[4], 0, 1 << 40);
    let err = GgufFile::from_bytes(b.build()).err().unwrap();
    assert!(
        matches!(err, GgufError::TensorOutOfRange { ref name, .. } if name == "far"),
        "{err}"
    );
    let b = sample().tensor_raw("wrap", &[4], 0, u64::MAX - 31);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::TensorOutOfRange { .. })
    ));
}

#[test]
fn misaligned_tensor() {
    let b = sample().tensor_raw("odd", &[1], 0, 4);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::MisalignedTensor { .. })
    ));
}

#[test]
fn unsupported_tensor_type() {
    let b = sample().tensor_raw("nv", &[256], 40, 0);
    let err = GgufFile::from_bytes(b.build()).err().unwrap();
    assert!(matches!(
        err,
        GgufError::UnsupportedTensorType { type_id: 40, .. }
    ));
    assert!(err.to_string().contains("'nv'"), "{err}");
}

#[test]
fn bad_shapes() {
    let b = sample().tensor_raw("partial_block", &[33], 2, 0);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidShape { .. })
    ));
    let b = sample().tensor_raw("huge", &[u64::MAX, 4], 0, 0);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidShape { .. })
    ));
    let b = sample().tensor_raw("5d", &[1, 1, 1, 1, 1], 0, 0);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::TooManyDims { .. })
    ));
}

#[test]
fn duplicates_and_bad_values() {
    let b = sample().kv_u32("llama.block_count", 3);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::DuplicateKey(_))
    ));
    let b = sample().tensor_f32("other", &[0.0]);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::DuplicateTensor(_))
    ));
    let b = sample().kv_raw("bad", 13, &[]);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidValueType { .. })
    ));
    let b = sample().kv_raw("bad", 8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe]);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidUtf8 { .. })
    ));
    let b = sample().kv_u32("general.alignment", 24);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::BadAlignment(24))
    ));
}

/// An array value's payload: element type, count, then the elements' bytes.
fn array_payload(elem_type: u32, n: u64, elements: &[u8]) -> Vec<u8> {
    let mut payload = elem_type.to_le_bytes().to_vec();
    payload.extend(n.to_le_bytes());
    payload.extend(elements);
    payload
}

#[test]
fn arrays_keep_their_element_types() {
    let ints: Vec<u8> = [-1i32, 7, 1 << 30]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let floats: Vec<u8> = [0.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    // Two arrays of u8: [1, 2] and [].
    let mut nested = array_payload(0, 2, &[1, 2]);
    nested.extend(array_payload(0, 0, &[]));
    let b = sample()
        .kv_raw("ints", 9, &array_payload(5, 3, &ints))
        .kv_raw("floats", 9, &array_payload(6, 2, &floats))
        .kv_raw("flags", 9, &array_payload(7, 3, &[1, 0, 2]))
        .kv_raw("nested", 9, &array_payload(9, 2, &nested))
        .kv_str_array("empty", &[])
        .kv_str_array("words", &["", "é", "xyz"]);
    let file = GgufFile::from_bytes(b.build()).unwrap();
    let array = |key: &str| file.get(key).and_then(Value::as_array).unwrap();
    assert_eq!(array("ints"), &Array::I32(vec![-1, 7, 1 << 30]));
    assert_eq!(array("ints").element_type_name(), "i32");
    assert_eq!(
        array("ints")
            .values()
            .map(|v| v.as_i64())
            .collect::<Vec<_>>(),
        [Some(-1), Some(7), Some(1 << 30)]
    );
    assert_eq!(array("floats"), &Array::F32(vec![0.5, -2.0]));
    assert_eq!(array("flags"), &Array::Bool(vec![true, false, true]));
    assert_eq!(
        array("nested"),
        &Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![])])
    );
    assert_eq!(
        array("nested").get(0),
        Some(Value::Array(Array::U8(vec![1, 2])))
    );
    assert!(array("empty").is_empty());
    let words = array("words").as_strings().unwrap();
    assert_eq!(words.iter().collect::<Vec<_>>(), ["", "é", "xyz"]);
    assert_eq!(
        (words.len(), words.get(1), words.get(3)),
        (3, Some("é"), None)
    );
    assert_eq!(array("ints").as_strings(), None);

    // A string element that is not UTF-8, and an array shorter than its count.
    let b = sample().kv_raw(
        "bad",
        9,
        &array_payload(8, 1, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff]),
    );
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::InvalidUtf8 { .. })
    ));
    let b = sample().kv_raw("short", 9, &array_payload(5, 3, &ints[..8]));
    assert!(GgufFile::from_bytes(b.build()).is_err());
}

#[test]
fn huge_counts_fail_without_allocating() {
    let mut payload = 4u32.to_le_bytes().to_vec();
    payload.extend(u64::MAX.to_le_bytes());
    let b = sample().kv_raw("arr", 9, &payload);
    assert!(matches!(
        GgufFile::from_bytes(b.build()),
        Err(GgufError::Truncated { .. })
    ));
    let mut bytes = sample().build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut payload = Vec::new();
    for _ in 0..100 {
        payload.extend(9u32.to_le_bytes());
        payload.extend(1u64.to_le_bytes());
    }
    let b = sample().kv_raw("nest", 9, &payload[4..]);
    assert!(GgufFile::from_bytes(b.build()).is_err());
}

#[test]
fn missing_file() {
    let err = GgufFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(matches!(err, GgufError::NotFound { .. }));
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Any file made by overwriting, inserting or deleting bytes of a valid one parses or
    /// fails with an error; it never panics, and whatever parses has every tensor in bounds.
    #[test]
    fn mutated_files_never_panic(
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0u8..3), 1..8),
        cut in any::<u16>(),
    ) {
        let mut bytes = sample().build();
        for (pos, byte, kind) in edits {
            let pos = pos as usize % (bytes.len() + 1);
            match kind {
                0 if pos < bytes.len() => bytes[pos] = byte,
                1 => bytes.insert(pos, byte),
                _ if pos < bytes.len() => { bytes.remove(pos); }
                _ => {}
            }
        }
        let keep = bytes.len() - (cut as usize % 4).min(bytes.len());
        bytes.truncate(keep);
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            for t in file.tensors() {
                prop_assert_eq!(file.tensor_data(t).len() as u64, t.size);
            }
        }
    }
}
