//! Metadata values of a GGUF file.

/// One metadata value. Arrays may nest.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array, held by element type: a vocabulary of 50,000 strings is one buffer and
/// a list of offsets rather than 50,000 values and allocations.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Strings),
    Array(Vec<Array>),
}

/// A list of strings in one buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strings {
    text: String,
    /// Where each string ends in `text`.
    ends: Vec<usize>,
}

impl Strings {
    pub fn with_capacity(strings: usize) -> Self {
        Strings {
            text: String::new(),
            ends: Vec::with_capacity(strings),
        }
    }

    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)?;
        let start = index.checked_sub(1).map_or(0, |i| self.ends[i]);
        Some(&self.text[start..end])
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below the length"))
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the elements' type, for error messages.
    pub fn element_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }

    /// Element `index` as a [`Value`] (a string or a nested array is copied).
    pub fn get(&self, index: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(index)?),
            Array::I8(v) => Value::I8(*v.get(index)?),
            Array::U16(v) => Value::U16(*v.get(index)?),
            Array::I16(v) => Value::I16(*v.get(index)?),
            Array::U32(v) => Value::U32(*v.get(index)?),
            Array::I32(v) => Value::I32(*v.get(index)?),
            Array::U64(v) => Value::U64(*v.get(index)?),
            Array::I64(v) => Value::I64(*v.get(index)?),
            Array::F32(v) => Value::F32(*v.get(index)?),
            Array::F64(v) => Value::F64(*v.get(index)?),
            Array::Bool(v) => Value::Bool(*v.get(index)?),
            Array::String(v) => Value::String(v.get(index)?.to_owned()),
            Array::Array(v) => Value::Array(v.get(index)?.clone()),
        })
    }

    /// Every element as a [`Value`], in order.
    pub fn values(&self) -> impl ExactSizeIterator<Item = Value> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below the length"))
    }

    /// The strings of an array of strings.
    pub fn as_strings(&self) -> Option<&Strings> {
        match self {
            Array::String(s) => Some(s),
            _ => None,
        }
    }
}

impl Value {
    /// The GGUF name of this value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer value that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any numeric value as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}
