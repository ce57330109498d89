//! Writing the GGUF images that tests and tools build from weights they have in memory.

use tallow_quant::GgmlType;

use crate::DEFAULT_ALIGNMENT;

/// One tensor of [`tensors_image`]: its name, format, dimensions (GGML order, innermost
/// first) and data.
pub struct TensorData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub dims: &'a [u64],
    pub data: &'a [u8],
}

/// A GGUF v3 image holding `tensors` (each aligned as the format asks) and no metadata.
pub fn tensors_image(tensors: &[TensorData<'_>]) -> Vec<u8> {
    let align = DEFAULT_ALIGNMENT as usize;
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(0u64.to_le_bytes());
    let mut data = Vec::new();
    for t in tensors {
        string(&mut out, t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ty.id().to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        data.extend_from_slice(t.data);
        data.resize(data.len().next_multiple_of(align), 0);
    }
    out.resize(out.len().next_multiple_of(align), 0);
    out.extend(data);
    out
}
