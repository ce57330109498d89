//! The safetensors format, read over a memory map: an 8-byte little-endian header length, a
//! JSON header naming each tensor's dtype, shape and byte range, then the data. Every length,
//! offset and shape is checked against the file before any data is read, so a truncated or
//! hostile file is a [`ConvertError`], never a panic or a read out of bounds.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value as Json;
use tallow_gguf::GgmlType;

use crate::ConvertError;

/// Largest header tallow reads: real ones take a few hundred bytes per tensor.
const MAX_HEADER: u64 = 100 << 20;

/// Element types of safetensors data that tallow converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    /// Bytes: read only as the blocks and scales of MXFP4 matrices (gpt-oss's experts).
    U8,
}

impl Dtype {
    /// The GGML format of the same values; `None` for bytes.
    pub fn ggml(self) -> Option<GgmlType> {
        match self {
            Dtype::F32 => Some(GgmlType::F32),
            Dtype::F16 => Some(GgmlType::F16),
            Dtype::BF16 => Some(GgmlType::BF16),
            Dtype::U8 => None,
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U8 => 1,
        }
    }
}

/// One tensor of a safetensors file: its dtype, shape (row-major: the last dimension is the
/// contiguous one) and where its bytes are in the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorView {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    start: usize,
    end: usize,
}

impl TensorView {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// One safetensors file.
pub struct SafetensorsFile {
    bytes: Bytes,
    data_offset: usize,
    tensors: BTreeMap<String, TensorView>,
}

impl SafetensorsFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self, ConvertError> {
        let io = |source| ConvertError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(std::io::Error::other("not a regular file")));
        }
        // SAFETY: the map is read-only; like every mmap-based loader, this relies on the file
        // not being truncated by another process while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Bytes::Mapped(map))
    }

    /// Parses a safetensors image held in memory (`path` names it in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, ConvertError> {
        Self::parse(path.to_path_buf(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<Self, ConvertError> {
        let all: &[u8] = match &bytes {
            Bytes::Mapped(map) => map,
            Bytes::Owned(v) => v,
        };
        let bad = |reason: String| ConvertError::Safetensors {
            path: path.clone(),
            reason,
        };
        let Some((len, rest)) = all.split_first_chunk::<8>() else {
            return Err(bad(format!("{} bytes: too short for a header", all.len())));
        };
        let len = u64::from_le_bytes(*len);
        if len > MAX_HEADER || len > rest.len() as u64 {
            return Err(bad(format!(
                "a header of {len} bytes in a file of {} bytes",
                all.len()
            )));
        }
        let (header, data) = rest.split_at(len as usize);
        let json: Json = serde_json::from_slice(header)
            .map_err(|e| bad(format!("the header is not JSON: {e}")))?;
        let Json::Object(entries) = json else {
            return Err(bad("the header is not a JSON object".into()));
        };
        let mut tensors = BTreeMap::new();
        for (name, entry) in entries {
            if name == "__metadata__" {
                continue;
            }
            let view = tensor_view(&entry, data.len())
                .map_err(|reason| bad(format!("tensor {name:?}: {reason}")))?;
            tensors.insert(name, view);
        }
        Ok(SafetensorsFile {
            data_offset: 8 + len as usize,
            bytes,
            tensors,
        })
    }

    pub fn tensors(&self) -> &BTreeMap<String, TensorView> {
        &self.tensors
    }

    /// Tells the OS that `view`'s bytes, converted, are not needed again soon: their pages
    /// leave the process's resident memory (and are read from the file again if touched), so
    /// that converting a checkpoint holds one tensor of it at a time. Does nothing for a file
    /// held in memory.
    pub fn release(&self, view: &TensorView) {
        #[cfg(unix)]
        if let Bytes::Mapped(map) = &self.bytes {
            if view.end > view.start {
                // SAFETY: the map is read-only and private: dropping its pages loses nothing,
                // the next read faults the file's bytes back in.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        self.data_offset + view.start,
                        view.end - view.start,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = view;
    }

    /// The bytes of `view`, a tensor of this file.
    pub fn data(&self, view: &TensorView) -> &[u8] {
        let all: &[u8] = match &self.bytes {
            Bytes::Mapped(map) => map,
            Bytes::Owned(v) => v,
        };
        &all[self.data_offset + view.start..self.data_offset + view.end]
    }
}

/// A header entry, `{"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}`, checked
/// against a data section of `data_len` bytes.
fn tensor_view(entry: &Json, data_len: usize) -> Result<TensorView, String> {
    let dtype = match entry.get("dtype").and_then(Json::as_str) {
        Some("F32") => Dtype::F32,
        Some("F16") => Dtype::F16,
        Some("BF16") => Dtype::BF16,
        Some("U8") => Dtype::U8,
        Some(other) => {
            return Err(format!(
                "dtype {other} is not converted (F32, F16, BF16 and MXFP4's U8 are)"
            ))
        }
        None => return Err("no dtype".into()),
    };
    let shape = entry
        .get("shape")
        .and_then(Json::as_array)
        .ok_or("no shape")?
        .iter()
        .map(|d| d.as_u64().ok_or("a dimension that is not a whole number"))
        .collect::<Result<Vec<u64>, _>>()?;
    let offsets = entry
        .get("data_offsets")
        .and_then(Json::as_array)
        .filter(|o| o.len() == 2)
        .ok_or("data_offsets is not [begin, end]")?;
    let (Some(start), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
        return Err("data_offsets is not two whole numbers".into());
    };
    if start > end || end > data_len as u64 {
        return Err(format!(
            "bytes {start}..{end} outside the data section of {data_len} bytes"
        ));
    }
    let size = shape
        .iter()
        .try_fold(dtype.bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or("its shape overflows")?;
    if size != end - start {
        return Err(format!(
            "shape {shape:?} of {dtype:?} takes {size} bytes, its data {}",
            end - start
        ));
    }
    Ok(TensorView {
        dtype,
        shape,
        start: start as usize,
        end: end as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn image(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    fn parse(bytes: Vec<u8>) -> Result<SafetensorsFile, ConvertError> {
        SafetensorsFile::from_bytes(Path::new("x.safetensors"), bytes)
    }

    #[test]
    fn tensors_are_read_where_the_header_puts_them() {
        let header = r#"{"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]}}"#;
        let data: Vec<u8> = (0..12).collect();
        let file = parse(image(header, &data)).unwrap();
        let a = &file.tensors()["a"];
        assert_eq!((a.dtype, a.shape.clone()), (Dtype::F32, vec![2]));
        assert_eq!(file.data(a), &data[..8]);
        assert_eq!(file.data(&file.tensors()["b"]), &data[8..]);
    }

    #[test]
    fn bad_headers_are_errors_that_say_why() {
        let cases = [
            (
                image(
                    r#"{"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}"#,
                    &[0; 8],
                ),
                "I64",
            ),
            (
                image(
                    r#"{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}"#,
                    &[0; 8],
                ),
                "takes 12",
            ),
            (
                image(
                    r#"{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}"#,
                    &[0; 8],
                ),
                "outside",
            ),
            (
                image(
                    r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}"#,
                    &[0; 8],
                ),
                "outside",
            ),
            (
                image(
                    r#"{"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}}"#,
                    &[0; 8],
                ),
                "overflows",
            ),
            (image("[1, 2]", &[]), "not a JSON object"),
            (image("{", &[]), "not JSON"),
            (vec![255; 16], "header of"),
            (vec![1, 2], "too short"),
        ];
        for (bytes, needle) in cases {
            let err = parse(bytes).err().expect("a bad file");
            assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
        }
    }

    proptest! {
        /// Any corruption of a valid file is read or refused, never a panic.
        #[test]
        fn mutated_files_never_panic(
            flips in proptest::collection::vec((0usize..200, any::<u8>()), 1..8),
            cut in 0usize..200,
        ) {
            let header = r#"{"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}"#;
            let mut bytes = image(header, &[7; 16]);
            for (at, value) in flips {
                let at = at % bytes.len();
                bytes[at] = value;
            }
            bytes.truncate(cut.max(1) + bytes.len() / 2);
            if let Ok(file) = parse(bytes) {
                for view in file.tensors().values() {
                    prop_assert_eq!(file.data(view).len() as u64, view.n_elements() * view.dtype.bytes());
                }
            }
        }
    }
}
