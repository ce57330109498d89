"""The CUDA device as Python sees it. On a machine without an NVIDIA driver (CI's), ``cuda``
devices are not listed and asking for one is an ``UnsupportedError`` that names the missing
driver; with a driver, each GPU is listed as ``cuda:N`` and a model runs on it with the CPU's
greedy tokens. NVRTC is found in its PyPI wheel (a test dependency, and ``tallow[cuda]``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow import _core, _nvrtc


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
