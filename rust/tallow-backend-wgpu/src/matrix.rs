//! Weight matrices on the GPU, in their GGUF block format as the file has them. A matrix
//! larger than one binding may cover is split by rows into parts, each a buffer of its own.

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

/// Rows `first_row..first_row + rows` of a matrix.
pub(crate) struct Part {
    pub buffer: Buffer,
    pub first_row: usize,
    pub rows: usize,
}

/// Copies the matrix of `spec` to the GPU, in parts of at most `max_part` bytes, and gives
/// back the file's pages.
pub(crate) fn upload(
    gpu: &Gpu,
    file: &Arc<GgufFile>,
    spec: &MatrixSpec,
    max_part: u64,
) -> Result<Matrix, BackendError> {
    let ty = spec.tensor.ty;
    if !kernels::reads(ty) || !spec.cols.is_multiple_of(ty.block_len().max(32)) {
        return Err(BackendError::Unsupported(format!(
            "{} ({} weights, rows of {}) on wgpu",
            spec.tensor.name,
            ty.name(),
            spec.cols
        )));
    }
    let data = file.tensor_data(&spec.tensor);
    let row_bytes = data.len() / spec.rows;
    let rows_per_part = (max_part as usize / row_bytes.max(1)).min(spec.rows);
    if rows_per_part == 0 {
        return Err(BackendError::Device(format!(
            "one row of {} is larger than a buffer of {} may be",
            spec.tensor.name, gpu.info.name
        )));
    }
    let mut parts = Vec::new();
    for first_row in (0..spec.rows).step_by(rows_per_part) {
        let rows = rows_per_part.min(spec.rows - first_row);
        let bytes = &data[first_row * row_bytes..(first_row + rows) * row_bytes];
        parts.push(Part {
            buffer: gpu.buffer_with(bytes)?,
            first_row,
            rows,
        });
    }
    // The host keeps no second copy: the file's pages go back to the OS.
    file.release(&spec.tensor, 0..data.len());
    Ok(Matrix {
        ty,
        rows: spec.rows,
        cols: spec.cols,
        row_bytes,
        parts,
    })
}
