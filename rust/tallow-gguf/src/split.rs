//! Models split into several files, as llama.cpp's `gguf-split` writes them.
//!
//! Each part is a whole GGUF file holding some of the tensors; the first one also holds the
//! model's metadata. Every part carries `split.no` (its index, from 0) and `split.count` (how
//! many parts there are), the first also `split.tensors.count` (the tensors of all the parts
//! together). Part `i` of `n` is named `<prefix>-<i + 1>-of-<n>.gguf`, both numbers written with
//! five digits.

use std::path::{Path, PathBuf};

use crate::{GgufError, GgufFile};

const SPLIT_NO: &str = "split.no";
const SPLIT_COUNT: &str = "split.count";
const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

impl GgufFile {
    /// Opens the other parts of the split model whose first part is this file (opened from
    /// `path`) and adds their tensors to it; a file that is not split is returned as it is.
    pub(crate) fn join_split_parts(mut self, path: &Path) -> Result<Self, GgufError> {
        let Some(count) = self.split_key(SPLIT_COUNT)?.filter(|&n| n > 1) else {
            return Ok(self);
        };
        let no = self.split_key(SPLIT_NO)?.unwrap_or(0);
        if no != 0 {
            return Err(GgufError::NotFirstSplitPart {
                path: path.to_path_buf(),
                no,
                count,
                first: part_path(path, no, count, 0)?,
            });
        }
        for no in 1..count {
            let part_path = part_path(path, 0, count, no)?;
            let part = GgufFile::open_one(&part_path).map_err(|err| match err {
                GgufError::NotFound { path } => GgufError::MissingSplitPart { path, no, count },
                err => err,
            })?;
            let says = (part.split_key(SPLIT_NO)?, part.split_key(SPLIT_COUNT)?);
            if says != (Some(no), Some(count)) {
                let says = match says {
                    (Some(n), Some(c)) => format!("it is part {} of {c}", n + 1),
                    _ => format!("it has no {SPLIT_NO} and {SPLIT_COUNT}"),
                };
                return Err(GgufError::BadSplitPart {
                    path: part_path,
                    reason: format!("it should be part {} of {count}, but {says}", no + 1),
                });
            }
            self.add_part(part)?;
        }
        if let Some(expected) = self.split_key(SPLIT_TENSORS_COUNT)? {
            let found = self.tensors.len() as u64;
            if found != expected {
                return Err(GgufError::BadSplitPart {
                    path: path.to_path_buf(),
                    reason: format!(
                        "{SPLIT_TENSORS_COUNT} is {expected}, but the {count} parts hold {found} \
                         tensors"
                    ),
                });
            }
        }
        Ok(self)
    }

    /// Takes the files and the tensors of `part`, the next part of this split model.
    fn add_part(&mut self, part: GgufFile) -> Result<(), GgufError> {
        let index = self.parts.len();
        for mut info in part.tensors {
            info.part = index;
            if (self.tensor_index)
                .insert(info.name.clone(), self.tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            self.tensors.push(info);
        }
        self.parts.extend(part.parts);
        Ok(())
    }

    /// The value of the integer key `key`, if the file has it.
    fn split_key(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value.as_u64() {
            Some(n) => Ok(Some(n)),
            None => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "an unsigned integer",
                found: value.type_name(),
            }),
        }
    }
}

/// The path of part `wanted` (counted from 0) of the split model of which `path` is part `no`
/// of `count`.
fn part_path(path: &Path, no: u64, count: u64, wanted: u64) -> Result<PathBuf, GgufError> {
    let suffix = |no: u64| format!("-{:05}-of-{count:05}.gguf", no + 1);
    let name = path.file_name().and_then(|name| name.to_str());
    match name.and_then(|name| name.strip_suffix(&suffix(no))) {
        Some(prefix) => Ok(path.with_file_name(format!("{prefix}{}", suffix(wanted)))),
        None => Err(GgufError::SplitName {
            path: path.to_path_buf(),
            suffix: suffix(no),
        }),
    }
}
