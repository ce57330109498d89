//! NVRTC, the CUDA runtime compiler, loaded at run time: `$TALLOW_NVRTC` (a path; the Python
//! package sets it to the `nvidia-cuda-nvrtc-cu12` wheel's library, which `tallow[cuda]`
//! installs), else the system's (CUDA 12's or 13's). It compiles each kernel source for the
//! device's exact architecture to a cubin (machine code: no PTX for the driver to translate,
//! so no driver older than the compiler can refuse it).

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;

use libloading::{Library, Symbol};
use tallow_backend::BackendError;

type Program = *mut c_void;

/// What to install where NVRTC cannot be found.
const INSTALL: &str = "install it with `pip install tallow[cuda]` (nvidia-cuda-nvrtc-cu12), or \
                       point TALLOW_NVRTC at a libnvrtc.so";

pub(crate) struct Nvrtc {
    library: Library,
}

fn error(what: impl std::fmt::Display) -> BackendError {
    BackendError::Device(format!("NVRTC: {what}"))
}

impl Nvrtc {
    /// Loads NVRTC, or says what to install.
    pub fn load() -> Result<Self, BackendError> {
        let candidates: Vec<PathBuf> = match std::env::var_os("TALLOW_NVRTC") {
            Some(path) => vec![path.into()],
            None => vec![
                "libnvrtc.so.12".into(),
                "libnvrtc.so.13".into(),
                "libnvrtc.so".into(),
            ],
        };
        for candidate in &candidates {
            // SAFETY: NVRTC's initializers have no preconditions.
            if let Ok(library) = unsafe { Library::new(candidate) } {
                return Ok(Nvrtc { library });
            }
        }
        Err(BackendError::Unsupported(format!(
            "CUDA needs NVRTC, the CUDA runtime compiler, and none was found ({}): {INSTALL}",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    fn symbol<T>(&self, name: &[u8]) -> Result<Symbol<'_, T>, BackendError> {
        // SAFETY: each name is NVRTC's, used with its C signature.
        unsafe { self.library.get(name) }.map_err(error)
    }

    /// The cubin of source `name` (`text`, with `headers` as (name, text) it may include) for
    /// `sm_{arch}`.
    pub fn cubin(
        &self,
        name: &str,
        text: &str,
        headers: &[(&str, &str)],
        arch: u32,
    ) -> Result<Vec<u8>, BackendError> {
        Ok(self.compile(name, text, headers, arch, false)?.0)
    }

    /// [`Nvrtc::cubin`] and the compiler's log, with ptxas's report of each kernel's
    /// registers, spills and memory in it where `report` is set.
    pub fn compile(
        &self,
        name: &str,
        text: &str,
        headers: &[(&str, &str)],
        arch: u32,
        report: bool,
    ) -> Result<(Vec<u8>, String), BackendError> {
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
        let c = |s: &str| CString::new(s).map_err(error);
        let (text, name) = (c(text)?, c(name)?);
        let header_texts: Vec<CString> =
            headers.iter().map(|h| c(h.1)).collect::<Result<_, _>>()?;
        let header_names: Vec<CString> =
            headers.iter().map(|h| c(h.0)).collect::<Result<_, _>>()?;
        let texts: Vec<*const c_char> = header_texts.iter().map(|t| t.as_ptr()).collect();
        let names: Vec<*const c_char> = header_names.iter().map(|t| t.as_ptr()).collect();
        let mut options = vec![
            c(&format!("--gpu-architecture=sm_{arch}"))?,
            c("--std=c++17")?,
        ];
        if report {
            options.push(c("--ptxas-options=-v")?);
        }
        let options: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: NVRTC's C API with live, NUL-terminated strings; the program is destroyed
        // on every path below.
        unsafe {
            let create = self.symbol::<Create>(b"nvrtcCreateProgram\0")?;
            let status = create(
                &mut program,
                text.as_ptr(),
                name.as_ptr(),
                texts.len() as c_int,
                texts.as_ptr(),
                names.as_ptr(),
            );
            if status != 0 {
                return Err(error(format!("cannot create a program (status {status})")));
            }
            let result = self.compiled(program, &options, name.to_string_lossy().as_ref(), arch);
            let destroy = self.symbol::<Destroy>(b"nvrtcDestroyProgram\0")?;
            destroy(&mut program);
            result
        }
    }

    /// Compiles `program` and returns its cubin and log, or the log as the error.
    ///
    /// # Safety
    /// `program` must be a live NVRTC program.
    unsafe fn compiled(
        &self,
        program: Program,
        options: &[*const c_char],
        name: &str,
        arch: u32,
    ) -> Result<(Vec<u8>, String), BackendError> {
        type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
        type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
        let compile = self.symbol::<Compile>(b"nvrtcCompileProgram\0")?;
        let status = compile(program, options.len() as c_int, options.as_ptr());
        let log_size = self.symbol::<Size>(b"nvrtcGetProgramLogSize\0")?;
        let get_log = self.symbol::<Get>(b"nvrtcGetProgramLog\0")?;
        let mut size = 0;
        log_size(program, &mut size);
        let mut text = vec![0u8; size];
        get_log(program, text.as_mut_ptr().cast());
        let log = String::from_utf8_lossy(&text)
            .trim_end_matches('\0')
            .to_string();
        if status != 0 {
            return Err(error(format!(
                "{name} does not compile for sm_{arch}: {log}"
            )));
        }
        let cubin_size = self.symbol::<Size>(b"nvrtcGetCUBINSize\0")?;
        let cubin = self.symbol::<Get>(b"nvrtcGetCUBIN\0")?;
        let mut size = 0;
        if cubin_size(program, &mut size) != 0 || size == 0 {
            return Err(error(format!("no cubin of {name} for sm_{arch}")));
        }
        let mut out = vec![0u8; size];
        if cubin(program, out.as_mut_ptr().cast()) != 0 {
            return Err(error(format!("cannot read the cubin of {name}")));
        }
        Ok((out, log))
    }
}
