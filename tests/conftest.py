"""Shared fixtures of the end-to-end tests.

The reference outputs live in ``shared/reference`` beside the repository (``<repo>/../shared``);
``$TALLOW_SHARED_DIR`` points elsewhere. The default model is resolved through the catalog, so it
is pulled on first use (CI pulls it before the tests run).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest

import tallow
from tallow import _core

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TALLOW_SHARED_DIR", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``shared/reference``: llama.cpp's outputs (read-only)."""
    assert REFERENCE.is_dir(), f"reference directory not found: {REFERENCE} (set TALLOW_SHARED_DIR)"
    return REFERENCE


@pytest.fixture(scope="session")
def arch_dir(reference_dir: Path) -> Path:
    """``shared/reference/arch``: tiny models of each architecture and transformers' outputs."""
    return reference_dir / "arch"


@pytest.fixture(scope="session")
def prompt(arch_dir: Path) -> list[int]:
    """The token ids whose logits ``arch/*/ref_logits.npy`` hold."""
    return [int(t) for t in np.load(arch_dir / "prompt_ids.npy")]


def pool_of_64(model: _core.Model, dtype: str) -> _core.KvCache:
    """A KV pool of ``dtype`` for 64 positions computed in one chunk."""
    return model.new_kv_cache(dtype=dtype, max_pages=model.kv_pages_to_hold(64, chunk=64))


def f32_pool(model: _core.Model) -> _core.KvCache:
    """An f32 KV pool for 64 positions computed in one chunk: no f16 rounding of the cache, so
    that a comparison with transformers is about the forward pass alone."""
    return pool_of_64(model, "f32")


def all_logits(
    model: _core.Model, ids: list[int], kv_dtype: str = "f32"
) -> npt.NDArray[np.float32]:
    """The logits of every position of ``ids``, one forward from an empty pool of 64 positions
    in one chunk (``f32_pool`` by default; f16, as the GPUs hold it, rounds keys and values)."""
    kv = pool_of_64(model, kv_dtype)
    seq = kv.create()
    kv.reserve(seq, len(ids))
    return model.forward(kv, [(seq, ids, "all")])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model's GGUF file, in the cache (pulled if missing)."""
    return tallow.resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> tallow.LLM:
    """The default model, shared by the tests (a context of 512 positions)."""
    return tallow.LLM(smollm2_path, n_ctx=512)


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m tallow ARGS`` (the same entry point as the ``tallow`` script)."""
    full_env = dict(os.environ)
    if env is not None:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "tallow", *args],
        capture_output=True,
        input=input,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    """Check that a failed command printed exactly one ``tallow: error: ...`` line (no
    traceback) that contains every needle; return the line."""
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode != 0, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("tallow: error: ")]
    assert len(errors) == 1, stderr
    line = errors[0]
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run ``tallow serve ARGS`` on a free port of 127.0.0.1 until the block ends; yields the
    base URL once ``/health`` answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tallow", "serve", "--port", str(port), "--log-level", "warning"]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"the server did not start:\n{out}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server(smollm2_path: Path) -> Iterator[str]:
    """The base URL of a ``tallow serve`` of the default model (a context of 512 positions,
    32 requests at once), shared by the modules that test through HTTP; a module may define
    its own (another template, other limits)."""
    with serving("-m", "smollm2-135m", "--ctx", "512", "--max-batch", "32") as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    """The official ``openai`` client of the module's server."""
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
