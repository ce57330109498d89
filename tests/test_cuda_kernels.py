"""Every CUDA kernel (``kernels-cuda/*.cu``) compiles with NVRTC, from PyPI's
``nvidia-cuda-nvrtc-cu12`` (no GPU or driver needed), to a cubin for each GPU generation the
backend serves, Turing (sm_75) to Blackwell (sm_120), with each of its kernels in it under its
own name (``extern "C"``: the backend looks kernels up by name)."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import nvidia.cuda_nvrtc
import pytest

KERNELS = Path(__file__).resolve().parent.parent / "kernels-cuda"
ARCHITECTURES = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120"]
SOURCES = sorted(KERNELS.glob("*.cu"))
HEADERS = sorted(KERNELS.glob("*.cuh"))


def _nvrtc() -> ctypes.CDLL:
    (package,) = nvidia.cuda_nvrtc.__path__
    return ctypes.CDLL(str(Path(package) / "lib" / "libnvrtc.so.12"))


NVRTC = _nvrtc()


def compile_cubin(source: Path, arch: str) -> bytes:
    """The cubin of ``source`` for ``arch``; fails with NVRTC's log."""
    program = ctypes.c_void_p()
    names = (ctypes.c_char_p * len(HEADERS))(*(h.name.encode() for h in HEADERS))
    texts = (ctypes.c_char_p * len(HEADERS))(*(h.read_bytes() for h in HEADERS))
    created = NVRTC.nvrtcCreateProgram(
        ctypes.byref(program),
        source.read_bytes(),
        source.name.encode(),
        len(HEADERS),
        texts,
        names,
    )
    assert created == 0, f"nvrtcCreateProgram: {created}"
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        compiled = NVRTC.nvrtcCompileProgram(
            program, len(options), (ctypes.c_char_p * len(options))(*options)
        )
        log_size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        NVRTC.nvrtcGetProgramLog(program, log)
        assert compiled == 0, f"{source.name} for {arch}:\n{log.value.decode()}"
        size = ctypes.c_size_t()
        assert NVRTC.nvrtcGetCUBINSize(program, ctypes.byref(size)) == 0
        cubin = ctypes.create_string_buffer(size.value)
        assert NVRTC.nvrtcGetCUBIN(program, cubin) == 0
        return cubin.raw
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(program))


def kernel_names(source: Path) -> list[str]:
    """The kernels ``source`` defines, after its macros (one kernel per weight format, say)
    are expanded by the C preprocessor, as NVRTC sees them."""
    expanded = subprocess.run(
        ["cpp", "-P", "-D__CUDACC_RTC__", "-I", str(KERNELS), str(source)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kernel = r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\('
    return re.findall(kernel, expanded)


def test_there_are_kernels() -> None:
    assert SOURCES and all(kernel_names(s) for s in SOURCES), SOURCES


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.name)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_kernel_compiles_to_a_cubin_for_each_generation(source: Path, arch: str) -> None:
    cubin = compile_cubin(source, arch)
    assert cubin[:4] == b"\x7fELF", "a cubin is an ELF file"
    for name in kernel_names(source):
        assert b"\0" + name.encode() + b"\0" in cubin, f"{name} in {source.name} for {arch}"


def test_a_kernel_that_does_not_compile_fails_with_the_compilers_message(tmp_path: Path) -> None:
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void broken(float* x) { x[0] = undefined; }\n')
    with pytest.raises(AssertionError, match="undefined"):
        compile_cubin(broken, "sm_80")
