"""Shared fixtures of the end-to-end tests.

The reference outputs live in ``shared/reference`` beside the repository (``<repo>/../shared``);
``$TALLOW_SHARED_DIR`` points elsewhere. The default model is resolved through the catalog, so it
is pulled on first use (CI pulls it before the tests run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

import tallow

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TALLOW_SHARED_DIR", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``shared/reference``: llama.cpp's outputs (read-only)."""
    assert REFERENCE.is_dir(), f"reference directory not found: {REFERENCE} (set TALLOW_SHARED_DIR)"
    return REFERENCE


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
