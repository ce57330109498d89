//! Weight matrices on the CPU: packed at load into this CPU's interleaved layout where it has
//! packed kernels for the format, else read row-major from the memory-mapped file.

use std::sync::Arc;

use tallow_backend::{BackendError, MatrixSpec, MatrixUse};
use tallow_gguf::{GgmlType, GgufFile, TensorInfo};
use tallow_quant::{PackedMatrix, Product, QuantError, QuantizedActs, WeightSource};
use tallow_threads::DisjointSlice;

/// A weight matrix of `rows` output features by `cols` input features.
pub struct Matrix {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    data: Data,
}

enum Data {
    /// Repacked for the packed kernels; the file's copy is no longer read.
    Packed(PackedMatrix),
    /// Row-major in a GGML block format, inside the model file.
    Mapped {
        file: Arc<GgufFile>,
        tensor: TensorInfo,
    },
}

impl Matrix {
    fn mapped(file: &Arc<GgufFile>, spec: &MatrixSpec) -> Matrix {
        Matrix {
            ty: spec.tensor.ty,
            rows: spec.rows,
            cols: spec.cols,
            data: Data::Mapped {
                file: Arc::clone(file),
                tensor: spec.tensor.clone(),
            },
        }
    }

    fn packed(&self) -> Option<&PackedMatrix> {
        match &self.data {
            Data::Packed(p) => Some(p),
            Data::Mapped { .. } => None,
        }
    }

    /// `out[t * rows + r] = dot(row r, activations of token t)`.
    pub(crate) fn matmul(
        &self,
        acts: &QuantizedActs<'_>,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        match &self.data {
            Data::Packed(packed) => packed.matmul(acts, out),
            Data::Mapped { file, tensor } => {
                let bytes = file.tensor_data(tensor);
                tallow_quant::matmul(self.ty, bytes, self.rows, self.cols, acts, out)
            }
        }
    }

    /// The outputs of rows `rows` alone: `out[t * rows.len() + i] = dot(row rows[i],
    /// activations of token t)`, equal bit for bit to those of [`Matrix::matmul`].
    pub(crate) fn matmul_rows(
        &self,
        rows: &[u32],
        acts: &QuantizedActs<'_>,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        match &self.data {
            Data::Packed(packed) => packed.matmul_rows(rows, acts, out),
            Data::Mapped { file, tensor } => {
                let row_bytes = tensor.size as usize / self.rows.max(1);
                let bytes = file.tensor_data(tensor);
                let n_tokens = acts.n_tokens();
                let mut column = vec![0f32; n_tokens];
                for (i, &row) in rows.iter().enumerate() {
                    let row = row as usize;
                    let weights = bytes.get(row * row_bytes..(row + 1) * row_bytes).ok_or(
                        QuantError::SizeMismatch {
                            what: "row index below the row count",
                            expected: self.rows,
                            actual: row,
                        },
                    )?;
                    tallow_quant::matmul(self.ty, weights, 1, self.cols, acts, &mut column)?;
                    for (t, &v) in column.iter().enumerate() {
                        out[t * rows.len() + i] = v;
                    }
                }
                Ok(())
            }
        }
    }

    /// [`Matrix::matmul`] of several matrices that read the same activations: in one
    /// parallel loop when all are packed, else one after the other.
    pub(crate) fn matmul_many<const N: usize>(
        matrices: [&Matrix; N],
        acts: &QuantizedActs<'_>,
        outs: [&mut [f32]; N],
    ) -> Result<(), QuantError> {
        if matrices.iter().all(|m| m.packed().is_some()) {
            let packed = matrices.map(|m| m.packed().expect("all are packed"));
            return PackedMatrix::matmul_many(packed, acts, outs);
        }
        for (m, out) in matrices.into_iter().zip(outs) {
            m.matmul(acts, out)?;
        }
        Ok(())
    }

    /// Products of several matrices, each with its own activations (`None`: no product): in
    /// one parallel loop when all are packed, else one after the other.
    pub(crate) fn matmul_each<const N: usize>(
        jobs: [Option<(&Matrix, QuantizedActs<'_>, &mut [f32])>; N],
    ) -> Result<(), QuantError> {
        let all_packed = jobs.iter().flatten().all(|(m, ..)| m.packed().is_some());
        let first = jobs.iter().flatten().next();
        let pad = first.and_then(|(m, acts, _)| Some((m.packed()?, acts.ty(), acts.cols())));
        let Some((pad, ty, cols)) = pad.filter(|_| all_packed) else {
            for (m, acts, out) in jobs.into_iter().flatten() {
                m.matmul(&acts, out)?;
            }
            return Ok(());
        };
        // Slots without a job multiply no tokens.
        let products = jobs.map(|job| match job {
            Some((m, acts, out)) => Product {
                matrix: m.packed().expect("all are packed"),
                acts,
                out: DisjointSlice::new(out),
            },
            None => Product {
                matrix: pad,
                acts: QuantizedActs::empty(ty, cols),
                out: DisjointSlice::new(&mut []),
            },
        });
        PackedMatrix::matmul_each(&products)
    }

    /// Row `row` as f32 values (`cols` of them).
    pub(crate) fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), QuantError> {
        match &self.data {
            Data::Packed(packed) => packed.dequantize_row(row, out),
            Data::Mapped { file, tensor } => {
                let row_bytes = tensor.size as usize / self.rows;
                let bytes = &file.tensor_data(tensor)[row * row_bytes..][..row_bytes];
                tallow_quant::dequantize(self.ty, bytes, out)
            }
        }
    }
}

/// The matrices of `specs`, packing (with `pack`) every one that is read in products and that
/// this CPU can pack, into one allocation ([`PackedMatrix::pack_many`]), letting the OS drop
/// the file's pages of each part as soon as it is packed: the file's copy and the packed one
/// are never both resident, beyond a few MiB.
pub(crate) fn upload(
    file: &Arc<GgufFile>,
    specs: &[MatrixSpec],
    pack: bool,
) -> Result<Vec<Matrix>, BackendError> {
    let mut matrices: Vec<Matrix> = specs.iter().map(|s| Matrix::mapped(file, s)).collect();
    if !pack {
        return Ok(matrices);
    }
    let to_pack: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].usage != MatrixUse::Rows)
        .collect();
    let sources: Vec<WeightSource<'_>> = to_pack
        .iter()
        .map(|&i| WeightSource {
            ty: specs[i].tensor.ty,
            bytes: file.tensor_data(&specs[i].tensor),
            rows: specs[i].rows,
            cols: specs[i].cols,
        })
        .collect();
    // A read maps the pages around it too (the kernel's fault-around), some of them already
    // released: each release starts from the beginning of the tensor, and a last sweep
    // catches pages that reading one tensor mapped in its neighbour.
    let packed = PackedMatrix::pack_many(&sources, |i, bytes| {
        file.release(&specs[to_pack[i]].tensor, 0..bytes.end)
    })?;
    for (&i, packed) in to_pack.iter().zip(packed) {
        if let Some(packed) = packed {
            file.release(&specs[i].tensor, 0..specs[i].tensor.size as usize);
            matrices[i].data = Data::Packed(packed);
        }
    }
    Ok(matrices)
}
