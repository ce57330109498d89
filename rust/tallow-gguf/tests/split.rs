//! Opening a model split into several files, as llama.cpp's `gguf-split` writes them.

use std::path::{Path, PathBuf};

use tallow_gguf::{GgufError, GgufFile, Value};

mod common;
use common::Builder;

/// An empty directory of its own for a test, under Cargo's scratch directory for tests.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("split")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Part `no` (from 0) of a model of four tensors in `count` parts, holding `tensors` (each
/// eight copies of its value); only the first part has the model's metadata.
fn part(no: u16, count: u16, tensors: &[(&str, f32)]) -> Builder {
    let mut b = Builder::new()
        .kv_u16("split.no", no)
        .kv_u16("split.count", count)
        .kv_i32("split.tensors.count", 4);
    if no == 0 {
        b = b.kv_str("general.architecture", "llama");
    }
    for &(name, value) in tensors {
        b = b.tensor_f32(name, &[value; 8]);
    }
    b
}

fn part_path(dir: &Path, no: usize) -> PathBuf {
    dir.join(format!("model-{:05}-of-00003.gguf", no + 1))
}

/// Writes a model of the tensors a, b (first part), c (second) and d (third) into `dir`, and
/// returns the paths of its parts.
fn write_split(dir: &Path) -> Vec<PathBuf> {
    let parts = [
        part(0, 3, &[("a", 1.0), ("b", 2.0)]),
        part(1, 3, &[("c", 3.0)]),
        part(2, 3, &[("d", 4.0)]),
    ];
    (parts.iter().enumerate())
        .map(|(no, b)| {
            let path = part_path(dir, no);
            std::fs::write(&path, b.build()).unwrap();
            path
        })
        .collect()
}

#[test]
fn the_first_part_opens_the_whole_model() {
    let paths = write_split(&scratch("whole"));
    let file = GgufFile::open(&paths[0]).unwrap();
    assert_eq!(
        file.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    let tensors: Vec<_> = (file.tensors().iter())
        .map(|t| (t.name.as_str(), t.part))
        .collect();
    assert_eq!(tensors, [("a", 0), ("b", 0), ("c", 1), ("d", 2)]);
    for (t, value) in file.tensors().iter().zip([1.0f32, 2.0, 3.0, 4.0]) {
        let data = file.tensor_data(t);
        assert_eq!(data.len(), 32);
        assert_eq!(data[28..], value.to_le_bytes(), "{}", t.name);
    }
    let total: u64 = (paths.iter())
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(file.file_size(), total);
}

#[test]
fn another_part_names_the_first() {
    let paths = write_split(&scratch("not_first"));
    let err = GgufFile::open(&paths[1]).err().unwrap();
    assert!(
        matches!(err, GgufError::NotFirstSplitPart { no: 1, count: 3, ref first, .. } if *first == paths[0]),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("part 2 of a model split into 3 files"),
        "{err}"
    );
}

#[test]
fn a_missing_part_is_named() {
    let paths = write_split(&scratch("missing"));
    std::fs::remove_file(&paths[2]).unwrap();
    let err = GgufFile::open(&paths[0]).err().unwrap();
    assert!(
        matches!(err, GgufError::MissingSplitPart { no: 2, count: 3, ref path } if *path == paths[2]),
        "{err:?}"
    );
    assert!(err.to_string().contains("part 3 of 3"), "{err}");
}

#[test]
fn parts_that_disagree_are_refused() {
    let dir = scratch("disagree");
    let paths = write_split(&dir);
    let open_with_second = |second: Builder| {
        std::fs::write(&paths[1], second.build()).unwrap();
        GgufFile::open(&paths[0]).err().unwrap()
    };

    let err = open_with_second(part(2, 3, &[("c", 3.0)]));
    assert!(
        matches!(err, GgufError::BadSplitPart { ref path, .. } if *path == paths[1]),
        "{err:?}"
    );
    assert!(
        (err.to_string()).contains("it should be part 2 of 3, but it is part 3 of 3"),
        "{err}"
    );

    let err = open_with_second(Builder::new().tensor_f32("c", &[3.0; 8]));
    assert!(
        (err.to_string()).contains("but it has no split.no and split.count"),
        "{err}"
    );

    let err = open_with_second(part(1, 3, &[("a", 3.0)]));
    assert!(matches!(err, GgufError::DuplicateTensor(ref name) if name == "a"));

    let err = open_with_second(part(1, 3, &[]));
    assert!(
        (err.to_string()).contains("split.tensors.count is 4, but the 3 parts hold 3 tensors"),
        "{err}"
    );
}

#[test]
fn a_renamed_first_part_cannot_find_the_others() {
    let dir = scratch("renamed");
    let paths = write_split(&dir);
    let renamed = dir.join("model.gguf");
    std::fs::rename(&paths[0], &renamed).unwrap();
    let err = GgufFile::open(&renamed).err().unwrap();
    assert!(
        matches!(err, GgufError::SplitName { ref suffix, .. } if suffix == "-00001-of-00003.gguf"),
        "{err:?}"
    );
}
