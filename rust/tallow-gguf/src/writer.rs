//! Writing GGUF v3 files: metadata, the tensor table and the tensors' data, streamed to any
//! writer (a converter writes a model tensor by tensor without holding it), and the in-memory
//! images that tests and tools build from weights they hold.

use std::io::{self, Write};

use tallow_quant::GgmlType;

use crate::value::{Array, Value};
use crate::DEFAULT_ALIGNMENT;

/// One tensor of [`tensors_image`]: its name, format, dimensions (GGML order, innermost
/// first) and data.
pub struct TensorData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub dims: &'a [u64],
    pub data: &'a [u8],
}

/// What the tensor table says of one tensor of [`write_gguf`]: its name, format and
/// dimensions (GGML order); its data comes after the table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorHeader {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorHeader {
    /// The bytes of its data, or `None` where the dimensions do not fit the format's blocks.
    pub fn size(&self) -> Option<u64> {
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        self.ty.bytes_for(n)
    }
}

/// Writes a GGUF v3 file to `out`: `metadata`, the table of `tensors`, then each tensor's data
/// as `data(i, out)` writes it (each tensor aligned to 32 bytes). A tensor whose dimensions do
/// not fit its format, or whose data is not as long as they say, is an `InvalidInput` error.
pub fn write_gguf<W: Write, E: From<io::Error>>(
    out: &mut W,
    metadata: &[(String, Value)],
    tensors: &[TensorHeader],
    mut data: impl FnMut(usize, &mut dyn Write) -> Result<(), E>,
) -> Result<(), E> {
    let align = DEFAULT_ALIGNMENT;
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut head, key);
        head.extend(value_type(value).to_le_bytes());
        put_value(&mut head, value);
    }
    let mut sizes = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let size = t.size().ok_or_else(|| {
            invalid(format!(
                "tensor {:?}: dimensions {:?} do not fit {}",
                t.name,
                t.dims,
                t.ty.name()
            ))
        })?;
        string(&mut head, &t.name);
        head.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend(d.to_le_bytes());
        }
        head.extend(t.ty.id().to_le_bytes());
        head.extend(offset.to_le_bytes());
        sizes.push(size);
        offset = (offset + size).next_multiple_of(align);
    }
    head.resize(head.len().next_multiple_of(align as usize), 0);
    out.write_all(&head)?;
    for (i, size) in sizes.into_iter().enumerate() {
        let mut counted = Counted { out, written: 0 };
        data(i, &mut counted)?;
        if counted.written != size {
            return Err(invalid(format!(
                "tensor {:?}: {} bytes of data written where its dimensions take {size}",
                tensors[i].name, counted.written
            ))
            .into());
        }
        let pad = size.next_multiple_of(align) - size;
        out.write_all(&vec![0; pad as usize])?;
    }
    Ok(())
}

/// A GGUF v3 image holding `tensors` (each aligned as the format asks) and no metadata.
pub fn tensors_image(tensors: &[TensorData<'_>]) -> Vec<u8> {
    let headers: Vec<TensorHeader> = tensors
        .iter()
        .map(|t| TensorHeader {
            name: t.name.to_owned(),
            ty: t.ty,
            dims: t.dims.to_vec(),
        })
        .collect();
    let mut out = Vec::new();
    write_gguf::<_, io::Error>(&mut out, &[], &headers, |i, w| w.write_all(tensors[i].data))
        .expect("tensors given with data of their size");
    out
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// A writer that counts what passes through it.
struct Counted<'a, W: Write> {
    out: &'a mut W,
    written: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value_type(value: &Value) -> u32 {
    match value {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn element_type(array: &Array) -> u32 {
    match array {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.extend(v.to_le_bytes()),
        Value::I8(v) => out.extend(v.to_le_bytes()),
        Value::U16(v) => out.extend(v.to_le_bytes()),
        Value::I16(v) => out.extend(v.to_le_bytes()),
        Value::U32(v) => out.extend(v.to_le_bytes()),
        Value::I32(v) => out.extend(v.to_le_bytes()),
        Value::U64(v) => out.extend(v.to_le_bytes()),
        Value::I64(v) => out.extend(v.to_le_bytes()),
        Value::F32(v) => out.extend(v.to_le_bytes()),
        Value::F64(v) => out.extend(v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => string(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    out.extend(element_type(array).to_le_bytes());
    fn numbers<T: Copy, const N: usize>(out: &mut Vec<u8>, xs: &[T], le: fn(T) -> [u8; N]) {
        out.extend((xs.len() as u64).to_le_bytes());
        for &x in xs {
            out.extend(le(x));
        }
    }
    match array {
        Array::U8(xs) => numbers(out, xs, u8::to_le_bytes),
        Array::I8(xs) => numbers(out, xs, i8::to_le_bytes),
        Array::U16(xs) => numbers(out, xs, u16::to_le_bytes),
        Array::I16(xs) => numbers(out, xs, i16::to_le_bytes),
        Array::U32(xs) => numbers(out, xs, u32::to_le_bytes),
        Array::I32(xs) => numbers(out, xs, i32::to_le_bytes),
        Array::U64(xs) => numbers(out, xs, u64::to_le_bytes),
        Array::I64(xs) => numbers(out, xs, i64::to_le_bytes),
        Array::F32(xs) => numbers(out, xs, f32::to_le_bytes),
        Array::F64(xs) => numbers(out, xs, f64::to_le_bytes),
        Array::Bool(xs) => numbers(out, xs, |b: bool| [u8::from(b)]),
        Array::String(strings) => {
            out.extend((strings.len() as u64).to_le_bytes());
            for s in strings.iter() {
                string(out, s);
            }
        }
        Array::Array(arrays) => {
            out.extend((arrays.len() as u64).to_le_bytes());
            for a in arrays {
                put_array(out, a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgufFile, Strings};

    #[test]
    fn what_is_written_reads_back() {
        let mut words = Strings::with_capacity(2);
        words.push("<s>");
        words.push("hello");
        let metadata = vec![
            (
                "general.architecture".to_owned(),
                Value::String("llama".into()),
            ),
            ("llama.block_count".to_owned(), Value::U32(2)),
            ("llama.rope.freq_base".to_owned(), Value::F32(1e4)),
            ("tokenizer.ggml.add_bos_token".to_owned(), Value::Bool(true)),
            (
                "tokenizer.ggml.tokens".to_owned(),
                Value::Array(Array::String(words)),
            ),
            (
                "x.scores".to_owned(),
                Value::Array(Array::F32(vec![0.5, -1.0])),
            ),
            (
                "x.nested".to_owned(),
                Value::Array(Array::Array(vec![
                    Array::I32(vec![1, 2]),
                    Array::U8(vec![3]),
                ])),
            ),
        ];
        let a: Vec<u8> = (0..12u8).collect();
        let b: Vec<u8> = (0..34u8).collect(); // one Q8_0 block
        let tensors = vec![
            TensorHeader {
                name: "a".into(),
                ty: GgmlType::F32,
                dims: vec![3],
            },
            TensorHeader {
                name: "b".into(),
                ty: GgmlType::Q8_0,
                dims: vec![32, 1],
            },
        ];
        let data = [a.clone(), b.clone()];
        let mut out = Vec::new();
        write_gguf::<_, io::Error>(&mut out, &metadata, &tensors, |i, w| w.write_all(&data[i]))
            .unwrap();
        let file = GgufFile::from_bytes(out).unwrap();
        assert_eq!(file.metadata(), &metadata[..]);
        let read: Vec<_> = file
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.ty))
            .collect();
        assert_eq!(
            read,
            [("a".into(), GgmlType::F32), ("b".into(), GgmlType::Q8_0)]
        );
        assert_eq!(file.tensor_data(file.tensor("a").unwrap()), &a[..]);
        assert_eq!(file.tensor_data(file.tensor("b").unwrap()), &b[..]);
    }

    #[test]
    fn data_of_the_wrong_size_is_refused() {
        let tensors = vec![TensorHeader {
            name: "a".into(),
            ty: GgmlType::F32,
            dims: vec![3],
        }];
        let mut out = Vec::new();
        let err = write_gguf::<_, io::Error>(&mut out, &[], &tensors, |_, w| w.write_all(&[0; 8]))
            .unwrap_err();
        assert!(err.to_string().contains("8 bytes"), "{err}");
        let ragged = vec![TensorHeader {
            name: "q".into(),
            ty: GgmlType::Q8_0,
            dims: vec![33],
        }];
        let err = write_gguf::<_, io::Error>(&mut out, &[], &ragged, |_, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("do not fit"), "{err}");
    }
}
