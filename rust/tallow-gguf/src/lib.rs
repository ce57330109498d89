//! A GGUF (v2 and v3) reader over a memory map.
//!
//! Opening a file parses the header (metadata and tensor table) and checks every offset, size,
//! count and string length against the file before using it, so a damaged or hostile file gives
//! a [`GgufError`] and never a panic or an out-of-bounds read. Tensor data is not copied: views
//! borrow from the map. A model split into several files (llama.cpp's `gguf-split`) opens as
//! one [`GgufFile`] from its first part.

mod error;
mod reader;
mod split;
mod value;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
pub use tallow_quant::GgmlType;

pub use error::GgufError;
use reader::Reader;
pub use value::{Array, Strings, Value};
pub use writer::{tensors_image, write_gguf, TensorData, TensorHeader};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGML order: `dims[0]` is the contiguous (innermost) one.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Which file of a split model holds the data: 0 for the first, and for a model in one file.
    pub part: usize,
    /// Offset of the data from the start of the tensor data section of its file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

/// The bytes of one file, and where its tensor data starts.
struct Part {
    storage: Storage,
    data_offset: usize,
}

/// An open GGUF model: its metadata, its tensor table and views of its tensor data, in one file
/// or in the parts of a split model.
pub struct GgufFile {
    /// The files, in order: one, or each part of a split model.
    parts: Vec<Part>,
    version: u32,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
}

impl GgufFile {
    /// Maps and parses the file at `path`. If it is the first part of a split model, the other
    /// parts are found beside it by name (`<prefix>-00002-of-00003.gguf`, ...), mapped too, and
    /// their tensors join this file's; a missing or inconsistent part is an error.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        Self::open_one(path)?.join_split_parts(path)
    }

    /// Maps and parses the one file at `path`.
    fn open_one(path: &Path) -> Result<Self, GgufError> {
        let io_error = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::NotFound {
                GgufError::NotFound {
                    path: path.to_path_buf(),
                }
            } else {
                GgufError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            }
        };
        // Checked before opening: opening a FIFO or a device for reading can block forever.
        let kind = std::fs::metadata(path).map_err(io_error)?.file_type();
        if !kind.is_file() {
            let what = if kind.is_dir() {
                "it is a directory"
            } else {
                "it is not a regular file"
            };
            return Err(io_error(std::io::Error::other(what)));
        }
        let file = File::open(path).map_err(io_error)?;
        // SAFETY: the map is read-only. Like every mmap-based model loader, this relies on the
        // file not being truncated by another process while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Maps and parses the GGUF image in `file`, open for reading (one file: a split model's
    /// other parts are not looked for), such as a temporary file a conversion wrote; `name`
    /// says what it is in errors.
    pub fn from_file(file: &File, name: &str) -> Result<Self, GgufError> {
        // SAFETY: as in `open_one`; the file is the caller's, read only.
        let map = unsafe { Mmap::map(file) }.map_err(|source| GgufError::Io {
            path: PathBuf::from(name),
            source,
        })?;
        Self::parse(Storage::Mapped(map))
    }

    /// Parses a GGUF image held in memory (one file: a split model's other parts are not looked
    /// for).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let bytes = storage.bytes();
        let mut r = Reader::new(bytes);
        let magic = r.take(4, "magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        // A tensor record takes at least 8 (name length) + 4 + 4 + 8 bytes, a key-value pair
        // at least 8 (key length) + 4 + 1.
        let n_tensors = r.count(24, "tensor count")?;
        let n_kv = r.count(13, "metadata count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut metadata_index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let type_id = r.u32(&format!("type of '{key}'"))?;
            let value = r.value(&key, type_id)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let value = &metadata[i].1;
                let a = value.as_u64().ok_or(GgufError::WrongType {
                    key: "general.alignment".into(),
                    expected: "an unsigned integer",
                    found: value.type_name(),
                })?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment(a));
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let info = read_tensor_info(&mut r)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        // The data section starts at the next multiple of the alignment; a file with no
        // tensors may end before it.
        let data_offset = (r.position() as u64).div_ceil(alignment) * alignment;
        let available = (bytes.len() as u64).saturating_sub(data_offset);
        for t in &tensors {
            if !t.offset.is_multiple_of(alignment) {
                return Err(GgufError::MisalignedTensor {
                    name: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            if t.offset
                .checked_add(t.size)
                .is_none_or(|end| end > available)
            {
                return Err(GgufError::TensorOutOfRange {
                    name: t.name.clone(),
                    offset: t.offset,
                    size: t.size,
                    available,
                });
            }
        }
        let data_offset = data_offset.min(bytes.len() as u64) as usize;

        Ok(GgufFile {
            parts: vec![Part {
                storage,
                data_offset,
            }],
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Size of the whole file in bytes (of all its parts, for a split model).
    pub fn file_size(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes().len() as u64).sum()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor of this file (checked against the file when it was opened).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let part = &self.parts[info.part];
        let start = part.data_offset + info.offset as usize;
        &part.bytes()[start..start + info.size as usize]
    }

    /// The whole of the file that holds `info`'s data, where that file is mapped (from a
    /// page-aligned address, as the OS maps it) rather than held in memory: what a device that
    /// shares the host's memory can read in place.
    pub fn mapping(&self, info: &TensorInfo) -> Option<&[u8]> {
        match &self.parts[info.part].storage {
            Storage::Mapped(map) => Some(map),
            Storage::Owned(_) => None,
        }
    }

    /// Tells the OS that the bytes `bytes` of a tensor's data, already copied elsewhere, are
    /// not needed: their pages leave the process's resident memory, and are read from the
    /// file again if touched. Best effort: it does nothing for a file held in memory or where
    /// the OS cannot.
    pub fn release(&self, info: &TensorInfo, bytes: Range<usize>) {
        let part = &self.parts[info.part];
        let start = part.data_offset + info.offset as usize;
        let end = (start + bytes.end).min(start + info.size as usize);
        part.release(start + bytes.start..end);
    }

    /// [`GgufFile::release`] for the header (metadata and tensor table) of every part: once the
    /// values a caller needs are parsed, its pages need not stay resident.
    pub fn release_header(&self) {
        for part in &self.parts {
            part.release(0..part.data_offset);
        }
    }
}

impl Part {
    fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Drops the pages of `range` from resident memory (see [`GgufFile::release`]).
    fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let Storage::Mapped(map) = &self.storage {
            if range.is_empty() {
                return;
            }
            // SAFETY: the map is read-only and private, so dropping its pages loses nothing:
            // the next read of them faults the file's bytes back in.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

fn read_tensor_info(r: &mut Reader<'_>) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let n_dims = r.u32(&format!("dimension count of '{name}'"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64(&format!("dimensions of '{name}'"))?);
    }
    let type_id = r.u32(&format!("type of '{name}'"))?;
    let offset = r.u64(&format!("offset of '{name}'"))?;
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnsupportedTensorType { name, type_id });
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|_| {
            dims.first()
                .is_none_or(|&d0| d0.is_multiple_of(ty.block_len() as u64))
        });
    let Some(size) = n_elements.and_then(|n| ty.bytes_for(n)) else {
        return Err(GgufError::InvalidShape { name, dims });
    };
    Ok(TensorInfo {
        name,
        dims,
        ty,
        part: 0, // set when the file joins a split model's first part
        offset,
        size,
    })
}
