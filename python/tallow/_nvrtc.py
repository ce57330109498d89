"""Where NVRTC is. The CUDA backend compiles its kernels with NVRTC, NVIDIA's runtime compiler,
for each GPU's exact architecture when the GPU is first used; ``pip install tallow[cuda]``
installs NVIDIA's wheel of it (``nvidia-cuda-nvrtc-cu12``). The Rust core looks for it at
``$TALLOW_NVRTC``, which :func:`point_to_the_wheel` sets to that wheel's library."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path


@functools.cache
def point_to_the_wheel() -> None:
    """Sets ``TALLOW_NVRTC`` to the library of the installed ``nvidia-cuda-nvrtc-cu12``, unless
    it is set already or the wheel is not installed (the core then tries the system's)."""
    if "TALLOW_NVRTC" in os.environ:
        return
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except ModuleNotFoundError:
        return
    for location in (spec.submodule_search_locations or []) if spec else []:
        library = Path(location) / "lib" / "libnvrtc.so.12"
        if library.is_file():
            os.environ["TALLOW_NVRTC"] = str(library)
            return
