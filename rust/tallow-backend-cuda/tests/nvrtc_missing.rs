//! Where NVRTC cannot be found, compiling the kernels is an error that says what to install (a
//! test of its own: it changes `TALLOW_NVRTC` for the whole process).

use tallow_backend::BackendError;
use tallow_backend_cuda::cubins;

#[test]
fn a_missing_nvrtc_is_named_with_what_to_install() {
    std::env::set_var("TALLOW_NVRTC", "/nonexistent/libnvrtc.so.12");
    match cubins(80) {
        Err(BackendError::Unsupported(message)) => {
            assert!(message.contains("pip install tallow[cuda]"), "{message}");
            assert!(message.contains("/nonexistent/libnvrtc.so.12"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}
