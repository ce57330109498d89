//! Weight matrices on the GPU, in their GGUF block format as the file has them. Matrices whose
//! bytes lie back to back in one tensor (the experts of a stack, the parts of a fused tensor)
//! share buffers, so that one dispatch reaches every expert; a buffer holds at most what one
//! binding may cover, and a matrix across a buffer's end is split by rows into parts.

use std::sync::Arc;

use tallow_backend::{BackendError, MatrixSpec};
use tallow_gguf::GgufFile;
use tallow_quant::GgmlType;

use crate::gpu::{Buffer, Gpu};
use crate::kernels;

pub struct Matrix {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) parts: Vec<Part>,
}

/// Rows `first_row..first_row + rows` of a matrix, at row `buffer_row` of `buffer`.
pub(crate) struct Part {
    pub buffer: Buffer,
    pub buffer_row: usize,
    pub first_row: usize,
    pub rows: usize,
}

/// Copies the matrices of `specs`, which lie back to back in one tensor (see
/// [`MatrixSpec::follows`]), to the GPU in buffers of at most `max_part` bytes, and gives back
/// the file's pages. Where every matrix fits a buffer and all have as many rows, buffers end
/// between matrices.
pub(crate) fn upload_stack(
    gpu: &Gpu,
    file: &Arc<GgufFile>,
    specs: &[MatrixSpec],
    max_part: u64,
) -> Result<Vec<Matrix>, BackendError> {
    let first = &specs[0];
    let ty = first.tensor.ty;
    if !kernels::reads(ty) || !first.cols.is_multiple_of(ty.block_len().max(32)) {
        return Err(BackendError::Unsupported(format!(
            "{} ({} weights, rows of {}) on wgpu",
            first.tensor.name,
            ty.name(),
            first.cols
        )));
    }
    let row_bytes = first.tensor.size as usize / first.rows.max(1);
    let total_rows: usize = specs.iter().map(|s| s.rows).sum();
    let mut whole = first.tensor.clone();
    whole.size = (total_rows * row_bytes) as u64;
    let data = file.tensor_data(&whole);
    let mut rows_per_buffer = (max_part as usize / row_bytes.max(1)).min(total_rows);
    if rows_per_buffer == 0 {
        return Err(BackendError::Device(format!(
            "one row of {} is larger than a buffer of {} may be",
            first.tensor.name, gpu.info.name
        )));
    }
    if specs.iter().all(|s| s.rows == first.rows) && first.rows <= rows_per_buffer {
        rows_per_buffer -= rows_per_buffer % first.rows;
    }
    let mut buffers = Vec::new();
    for start in (0..total_rows).step_by(rows_per_buffer) {
        let end = (start + rows_per_buffer).min(total_rows);
        buffers.push(gpu.buffer_with(&data[start * row_bytes..end * row_bytes])?);
    }
    // The host keeps no second copy: the file's pages go back to the OS.
    file.release(&whole, 0..data.len());
    let mut matrices = Vec::with_capacity(specs.len());
    let mut at = 0;
    for spec in specs {
        let mut parts = Vec::new();
        let mut row = at;
        while row < at + spec.rows {
            let buffer = row / rows_per_buffer;
            let buffer_end = (buffer + 1) * rows_per_buffer;
            let end = buffer_end.min(at + spec.rows);
            parts.push(Part {
                buffer: buffers[buffer].clone(),
                buffer_row: row - buffer * rows_per_buffer,
                first_row: row - at,
                rows: end - row,
            });
            row = end;
        }
        matrices.push(Matrix {
            ty,
            rows: spec.rows,
            cols: spec.cols,
            row_bytes,
            parts,
        });
        at += spec.rows;
    }
    Ok(matrices)
}
