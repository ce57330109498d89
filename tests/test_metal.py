"""The Metal device as Python sees it. Off macOS (CI's machines) no ``metal`` device is listed
and asking for one is an ``UnsupportedError`` that says what Metal needs; on a Mac the system's
GPU is ``metal:0`` and a model runs on it with the CPU's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

import tallow
from tallow import _core


def test_asking_for_metal_loads_on_the_gpu_or_names_what_it_needs(smollm2_path: Path) -> None:
    devices = [name for name, *_ in _core.devices() if name.startswith("metal:")]
    if not devices:
        with pytest.raises(tallow.UnsupportedError, match=r"Apple GPU on macOS"):
            _core.Model(str(smollm2_path), device="metal")
        return
    assert devices == ["metal:0"]
    on_gpu = tallow.LLM(smollm2_path, device="metal")
    on_cpu = tallow.LLM(smollm2_path)
    prompt = "The capital of France is"
    want = on_cpu.generate(prompt, max_tokens=8, temperature=0).token_ids
    assert on_gpu.generate(prompt, max_tokens=8, temperature=0).token_ids == want
