//! Hugging Face checkpoints written as GGUF files (`tallow convert`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use tallow_model::OutType;

use crate::errors::{convert_error, guard, raise};

/// Writes the GGUF of the checkpoint folder `folder` to `out`, its matrices as `quantize`
/// names (`"q8_0"`, `"f16"`, ...; `None`: as the checkpoint holds them). The file is written
/// beside `out` under a `.partial` name and moved into place once whole.
#[pyfunction]
#[pyo3(signature = (folder, out, quantize = None))]
pub(crate) fn convert_checkpoint(
    py: Python<'_>,
    folder: PathBuf,
    out: PathBuf,
    quantize: Option<&str>,
) -> PyResult<()> {
    let out_type = match quantize {
        Some(name) => OutType::named(name).map_err(convert_error)?,
        None => OutType::Keep,
    };
    py.detach(|| guard(|| write_converted(&folder, &out, out_type)))
}

fn write_converted(folder: &Path, out: &Path, out_type: OutType) -> PyResult<()> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let written = (|| {
        let file = File::create(&partial).map_err(|e| io_error(&partial, e))?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        tallow_convert::convert(folder, out_type, &mut writer).map_err(convert_error)?;
        writer.flush().map_err(|e| io_error(&partial, e))?;
        std::fs::rename(&partial, out).map_err(|e| io_error(out, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

fn io_error(path: &Path, e: std::io::Error) -> PyErr {
    raise(|errors| &errors.tallow, format!("{}: {e}", path.display()))
}
