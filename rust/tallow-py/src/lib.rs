//! The extension module `tallow._core`: thin wrappers over the core crates. No model logic
//! lives here; every call that computes releases the GIL.

mod constraint;
mod convert;
mod device;
mod errors;
mod kv;
mod model;

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use tallow_quant::GgmlType;

/// Dequantizes whole blocks of a GGML format (named like `"Q4_K"`) to float32.
#[pyfunction]
fn dequantize<'py>(
    py: Python<'py>,
    type_name: &str,
    data: &[u8],
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(type_name))
        .ok_or_else(|| errors::invalid_argument(format!("unknown GGML type '{type_name}'")))?;
    let (block_len, block_bytes) = (ty.block_len(), ty.block_bytes());
    let data = data.to_vec();
    let out = py.detach(|| {
        errors::guard(|| {
            // A partial trailing block is rejected by dequantize itself.
            let mut out = vec![0.0f32; data.len() / block_bytes * block_len];
            tallow_quant::dequantize(ty, &data, &mut out).map_err(errors::quant_error)?;
            Ok(out)
        })
    })?;
    Ok(out.into_pyarray(py))
}

/// The instruction set whose kernels run (the best this CPU has, capped by `TALLOW_ISA`).
#[pyfunction]
fn isa() -> &'static str {
    tallow_quant::Isa::detected().name()
}

/// Bytes per second at which the compute threads read `bytes` of memory: the best of
/// `passes` reads of a buffer made for it (see tallow_backend_cpu::read_bandwidth).
#[pyfunction]
#[pyo3(signature = (bytes = 1_073_741_824, passes = 3))]
fn read_bandwidth(py: Python<'_>, bytes: usize, passes: usize) -> f64 {
    py.detach(|| tallow_backend_cpu::read_bandwidth(bytes, passes))
}

/// A buffer of `bytes` made once, whose reads the compute threads time one at a time: a
/// probe to take turns with decode steps (see tallow_backend_cpu::ReadProbe).
#[pyclass(module = "tallow._core")]
struct ReadProbe(tallow_backend_cpu::ReadProbe);

#[pymethods]
impl ReadProbe {
    #[new]
    fn new(py: Python<'_>, bytes: usize) -> Self {
        ReadProbe(py.detach(|| tallow_backend_cpu::ReadProbe::new(bytes)))
    }

    /// Bytes one read covers (`bytes` rounded up to whole MiB).
    #[getter]
    fn bytes(&self) -> usize {
        self.0.len()
    }

    /// Seconds one read of the whole buffer takes.
    fn seconds(&self, py: Python<'_>) -> f64 {
        py.detach(|| self.0.seconds())
    }

    /// Reads the buffer with each summing loop and keeps the one with the fastest read so far.
    fn calibrate(&mut self, py: Python<'_>) {
        py.detach(|| self.0.calibrate())
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(isa, m)?)?;
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(model::sample_batch, m)?)?;
    m.add_function(wrap_pyfunction!(device::devices, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert_checkpoint, m)?)?;
    m.add_class::<ReadProbe>()?;
    m.add_class::<kv::KvCache>()?;
    m.add_class::<model::Model>()?;
    m.add_class::<model::Context>()?;
    m.add_class::<model::StreamDecoder>()?;
    m.add_class::<model::Sampler>()?;
    m.add_class::<constraint::Constraint>()?;
    Ok(())
}
