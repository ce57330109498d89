//! A cursor over the raw bytes of a GGUF header that checks every read against the end of the
//! file before making it.

use crate::error::GgufError;
use crate::value::{Array, Strings, Value};

/// Arrays nested deeper than this are rejected rather than recursed into (a crafted file could
/// otherwise exhaust the stack).
const MAX_ARRAY_DEPTH: u32 = 8;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining() as u64,
            });
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each take at least `min_item_bytes` bytes: a count larger than the
    /// rest of the file could hold is reported as truncation before anything is allocated.
    pub(crate) fn count(&mut self, min_item_bytes: u64, what: &str) -> Result<u64, GgufError> {
        let offset = self.pos as u64;
        let n = self.u64(what)?;
        let needed = n.saturating_mul(min_item_bytes);
        if needed > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: format!("{what} ({n} items)"),
                offset,
                needed,
                available: self.remaining() as u64,
            });
        }
        Ok(n)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        self.str(what).map(str::to_owned)
    }

    /// A string borrowed from the file.
    fn str(&mut self, what: &str) -> Result<&'a str, GgufError> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what.to_string(),
            offset,
        })
    }

    pub(crate) fn value(&mut self, key: &str, type_id: u32) -> Result<Value, GgufError> {
        self.value_at_depth(key, type_id, 0)
    }

    fn value_at_depth(&mut self, key: &str, type_id: u32, depth: u32) -> Result<Value, GgufError> {
        let what = || format!("value of '{key}'");
        Ok(match type_id {
            0 => Value::U8(u8::from_le_bytes(self.array(&what())?)),
            1 => Value::I8(i8::from_le_bytes(self.array(&what())?)),
            2 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => Value::Bool(u8::from_le_bytes(self.array(&what())?) != 0),
            8 => Value::String(self.string(&what())?),
            9 if depth < MAX_ARRAY_DEPTH => Value::Array(self.array_at_depth(key, depth + 1)?),
            10 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            _ => {
                return Err(GgufError::InvalidValueType {
                    key: key.to_string(),
                    type_id,
                })
            }
        })
    }

    /// An array's element type, count and elements.
    fn array_at_depth(&mut self, key: &str, depth: u32) -> Result<Array, GgufError> {
        let what = || format!("value of '{key}'");
        let elem_type = self.u32(&what())?;
        let min_bytes = min_value_bytes(elem_type).ok_or_else(|| GgufError::InvalidValueType {
            key: key.to_string(),
            type_id: elem_type,
        })?;
        let n = self.count(min_bytes, &what())? as usize;
        Ok(match elem_type {
            0 => Array::U8(self.numbers(n, &what(), u8::from_le_bytes)?),
            1 => Array::I8(self.numbers(n, &what(), i8::from_le_bytes)?),
            2 => Array::U16(self.numbers(n, &what(), u16::from_le_bytes)?),
            3 => Array::I16(self.numbers(n, &what(), i16::from_le_bytes)?),
            4 => Array::U32(self.numbers(n, &what(), u32::from_le_bytes)?),
            5 => Array::I32(self.numbers(n, &what(), i32::from_le_bytes)?),
            6 => Array::F32(self.numbers(n, &what(), f32::from_le_bytes)?),
            7 => Array::Bool(self.numbers(n, &what(), |[b]: [u8; 1]| b != 0)?),
            8 => {
                let mut strings = Strings::with_capacity(n);
                for _ in 0..n {
                    strings.push(self.str(&what())?);
                }
                Array::String(strings)
            }
            9 if depth < MAX_ARRAY_DEPTH => {
                let mut arrays = Vec::with_capacity(n);
                for _ in 0..n {
                    arrays.push(self.array_at_depth(key, depth + 1)?);
                }
                Array::Array(arrays)
            }
            10 => Array::U64(self.numbers(n, &what(), u64::from_le_bytes)?),
            11 => Array::I64(self.numbers(n, &what(), i64::from_le_bytes)?),
            12 => Array::F64(self.numbers(n, &what(), f64::from_le_bytes)?),
            _ => {
                return Err(GgufError::InvalidValueType {
                    key: key.to_string(),
                    type_id: elem_type,
                })
            }
        })
    }

    /// `n` little-endian numbers of `N` bytes each.
    fn numbers<const N: usize, T>(
        &mut self,
        n: usize,
        what: &str,
        from_bytes: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        // `count` checked that the file holds `n` elements of at least `N` bytes.
        let bytes = self.take((n * N) as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|b| from_bytes(b.try_into().expect("chunks of N bytes")))
            .collect())
    }
}

/// The fewest bytes a value of this type can take in the file, or `None` for an invalid type.
fn min_value_bytes(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,  // the length prefix
        9 => 12, // element type and count
        10..=12 => 8,
        _ => return None,
    })
}
