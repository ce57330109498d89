//! A cursor over the raw bytes of a GGUF header that checks every read against the end of the
//! file before making it.

use crate::error::GgufError;
use crate::value::Value;

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
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
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
            9 if depth < MAX_ARRAY_DEPTH => {
                let elem_type = self.u32(&what())?;
                let min_bytes =
                    min_value_bytes(elem_type).ok_or_else(|| GgufError::InvalidValueType {
                        key: key.to_string(),
                        type_id: elem_type,
                    })?;
                let n = self.count(min_bytes, &what())?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value_at_depth(key, elem_type, depth + 1)?);
                }
                Value::Array(items)
            }
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
