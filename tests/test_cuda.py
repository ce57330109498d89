"""The CUDA device as Python sees it. On a machine without an NVIDIA driver (CI's), ``cuda``
devices are not listed and asking for one is an ``UnsupportedError`` that names the missing
driver; with a driver, each GPU is listed as ``cuda:N`` and a model runs on it with the CPU's
greedy tokens. NVRTC is found in its PyPI wheel (a test dependency, and ``tallow[cuda]``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import all_logits
from test_architectures import (
    ARCHITECTURES,
    LOOKUP_FORMATS,
    MOE,
    check_lookup_format_on_a_gpu,
    check_mixture_on_a_gpu,
)

import tallow
from tallow import _core, _nvrtc

# f16 KV pages round keys and values: transformers' logits within this on the F32 files, and the
# architecture test's bound on the Q8_0 files.
TOLERANCE = {"f32": 5e-3, "q8_0": 0.3}


def cuda_devices() -> list[str]:
    return [name for name, *_ in _core.devices() if name.startswith("cuda:")]


def test_asking_for_cuda_loads_on_a_gpu_or_names_the_missing_driver(smollm2_path: Path) -> None:
    devices = cuda_devices()
    if not devices:
        with pytest.raises(tallow.UnsupportedError, match=r"NVIDIA GPU and its driver"):
            _core.Model(str(smollm2_path), device="cuda")
        return
    assert devices == [f"cuda:{i}" for i in range(len(devices))]
    on_gpu = tallow.LLM(smollm2_path, device="cuda:0")
    on_cpu = tallow.LLM(smollm2_path)
    prompt = "The capital of France is"
    want = on_cpu.generate(prompt, max_tokens=8, temperature=0).token_ids
    assert on_gpu.generate(prompt, max_tokens=8, temperature=0).token_ids == want


def test_every_architecture_on_a_gpu_matches_transformers_and_the_cpu(
    arch_dir: Path, prompt: list[int]
) -> None:
    if not cuda_devices():
        with pytest.raises(tallow.UnsupportedError, match=r"NVIDIA GPU and its driver"):
            _core.Model(str(arch_dir / "llama3" / "llama3-f32.gguf"), device="cuda:0")
        return
    for arch, _ in ARCHITECTURES:
        reference = np.load(arch_dir / arch / "ref_logits.npy")
        for file_type, tolerance in TOLERANCE.items():
            path = str(arch_dir / arch / f"{arch}-{file_type}.gguf")
            gpu = _core.Model(path, device="cuda:0")
            assert gpu.device == "cuda:0"
            on_gpu = all_logits(gpu, prompt, "f16")
            assert float(np.abs(on_gpu - reference).max()) <= tolerance, (arch, file_type)
            on_cpu = all_logits(_core.Model(path), prompt, "f16")
            # The CPU's products read activations quantized to 8 bits where the weights are
            # quantized; the GPU's read them in f32.
            cpu_bound = 1e-3 if file_type == "f32" else 0.3
            assert float(np.abs(on_gpu - on_cpu).max()) <= cpu_bound, (arch, file_type)


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("file_type", ["f32", "q8_0"])
def test_mixtures_of_experts_on_a_gpu_match_transformers_and_the_cpu(
    arch_dir: Path, prompt: list[int], arch: str, file_type: str
) -> None:
    """Each token's experts routed, grouped and multiplied by kernels on the GPU."""
    if not cuda_devices():
        with pytest.raises(tallow.UnsupportedError, match=r"NVIDIA GPU and its driver"):
            _core.Model(str(arch_dir / arch / f"{arch}-{file_type}.gguf"), device="cuda:0")
        return
    check_mixture_on_a_gpu(arch_dir, prompt, arch, file_type, "cuda:0")


@pytest.mark.parametrize("ty", LOOKUP_FORMATS)
def test_lookup_formats_on_a_gpu_give_the_cpus_logits(
    arch_dir: Path, tmp_path: Path, prompt: list[int], ty: str
) -> None:
    """IQ4_NL, IQ4_XS and MXFP4 weights in CUDA's integer and float products."""
    if not cuda_devices():
        with pytest.raises(tallow.UnsupportedError, match=r"NVIDIA GPU and its driver"):
            _core.Model(str(arch_dir / "llama3" / "llama3-f32.gguf"), device="cuda:0")
        return
    check_lookup_format_on_a_gpu(arch_dir, tmp_path, prompt, ty, "cuda:0")


def test_a_cuda_device_number_must_exist_or_be_a_number(smollm2_path: Path) -> None:
    with pytest.raises(tallow.InvalidArgumentError, match="a GPU's number must follow"):
        _core.Model(str(smollm2_path), device="cuda:x")
    with pytest.raises(tallow.UnsupportedError, match="CUDA"):
        _core.Model(str(smollm2_path), device=f"cuda:{len(cuda_devices()) + 7}")


def test_the_nvrtc_wheel_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TALLOW_NVRTC", raising=False)
    _nvrtc.point_to_the_wheel.cache_clear()
    _nvrtc.point_to_the_wheel()
    library = Path(os.environ["TALLOW_NVRTC"])
    assert library.name == "libnvrtc.so.12" and library.is_file()
    assert np.fromfile(library, dtype=np.uint8, count=4).tobytes() == b"\x7fELF"
