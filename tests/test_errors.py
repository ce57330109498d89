"""Bad input: each damaged or missing model file raises its own TallowError subclass with a
message that names the problem, through the Python API and through the CLI.

The damaged files are made from the real model file's bytes, changing exactly one field (found
with the independent header walker in gguf_layout.py).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli
from gguf_layout import Layout, patched_copy, read_layout

import tallow
from tallow import _core


@pytest.fixture(scope="module")
def layout(smollm2_path: Path) -> Layout:
    return read_layout(smollm2_path)


def _load_error(path: Path) -> tallow.TallowError:
    """Load through the public API and return the error it raised."""
    with pytest.raises(tallow.TallowError) as info:
        tallow.LLM(path)
    return info.value


def test_the_unpatched_layout_is_what_the_tests_expect(layout: Layout, smollm2_path: Path) -> None:
    # Guards the tests below: they rely on these facts about the real file.
    assert layout.version == 3
    assert len(layout.tensors) == 272
    assert smollm2_path.stat().st_size > layout.data_start + layout.tensors[-1].offset
    type_id, pos, size = layout.values["general.architecture"]
    assert (type_id, size) == (8, 8 + len("llama"))
    assert smollm2_path.read_bytes()[pos + 8 : pos + 13] == b"llama"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.gguf"
    with pytest.raises(tallow.ModelNotFoundError, match="nothing-here.gguf") as info:
        tallow.LLM(missing)
    assert isinstance(info.value, FileNotFoundError)
    # The core raises the same class for a path handed to it directly.
    with pytest.raises(tallow.ModelNotFoundError, match="nothing-here.gguf"):
        _core.Model(str(missing))
    with pytest.raises(tallow.ModelNotFoundError, match="not found"):
        tallow.LLM(str(missing))


def test_wrong_magic(tmp_path: Path, smollm2_path: Path) -> None:
    bad = patched_copy(smollm2_path, tmp_path / "magic.gguf", {0: b"GGML"})
    err = _load_error(bad)
    assert type(err) is tallow.GgufError
    assert "magic" in str(err).lower()


def test_unsupported_version(tmp_path: Path, smollm2_path: Path, layout: Layout) -> None:
    bad = patched_copy(
        smollm2_path, tmp_path / "version.gguf", {layout.version_pos: struct.pack("<I", 99)}
    )
    err = _load_error(bad)
    assert type(err) is tallow.GgufError
    assert "version" in str(err).lower() and "99" in str(err)


def test_truncated_in_the_header(tmp_path: Path, smollm2_path: Path) -> None:
    # 4 KiB ends inside the vocabulary array of the metadata.
    bad = patched_copy(smollm2_path, tmp_path / "short.gguf", {}, length=4096)
    err = _load_error(bad)
    assert type(err) is tallow.GgufError
    assert "truncated" in str(err).lower()


def test_truncated_tensor_data(tmp_path: Path, smollm2_path: Path, layout: Layout) -> None:
    # The header is intact, the last tensor's data is cut short.
    size = smollm2_path.stat().st_size
    bad = patched_copy(smollm2_path, tmp_path / "cut.gguf", {}, length=size - 1000)
    err = _load_error(bad)
    assert type(err) is tallow.GgufError
    message = str(err)
    assert layout.tensors[-1].name in message
    assert "truncated" in message.lower() or "outside" in message.lower()


def test_tensor_offset_out_of_range(tmp_path: Path, smollm2_path: Path, layout: Layout) -> None:
    victim = layout.tensors[100]
    far = 1 << 40  # a multiple of the alignment, far past the end of the file
    bad = patched_copy(
        smollm2_path, tmp_path / "offset.gguf", {victim.offset_pos: struct.pack("<Q", far)}
    )
    err = _load_error(bad)
    assert type(err) is tallow.GgufError
    assert victim.name in str(err)
    assert str(far) in str(err)


def test_unsupported_tensor_type(tmp_path: Path, smollm2_path: Path, layout: Layout) -> None:
    victim = layout.tensors[5]
    # 40 is GGML's NVFP4: a real format that tallow does not implement.
    bad = patched_copy(
        smollm2_path, tmp_path / "type.gguf", {victim.type_pos: struct.pack("<I", 40)}
    )
    err = _load_error(bad)
    assert type(err) is tallow.UnsupportedError
    assert victim.name in str(err)
    assert "type" in str(err).lower()


def test_unknown_architecture(tmp_path: Path, smollm2_path: Path, layout: Layout) -> None:
    _, pos, _ = layout.values["general.architecture"]
    bad = patched_copy(smollm2_path, tmp_path / "arch.gguf", {pos + 8: b"llamz"})
    err = _load_error(bad)
    assert type(err) is tallow.UnsupportedError
    assert "llamz" in str(err)
    assert "architecture" in str(err).lower()


def test_errors_form_one_hierarchy() -> None:
    for cls in (
        tallow.GgufError,
        tallow.ModelNotFoundError,
        tallow.UnsupportedError,
        tallow.TokenizerError,
        tallow.ModelError,
        tallow.CatalogError,
        tallow.InvalidArgumentError,
    ):
        assert issubclass(cls, tallow.TallowError)
    assert issubclass(tallow.InvalidArgumentError, ValueError)
    assert issubclass(tallow.ModelNotFoundError, FileNotFoundError)
    assert tallow.errors.GgufError is _core.GgufError


def test_cli_reports_a_damaged_file_in_one_line(tmp_path: Path, smollm2_path: Path) -> None:
    bad = patched_copy(smollm2_path, tmp_path / "magic.gguf", {0: b"XXXX"})
    proc = run_cli("info", "-m", str(bad))
    assert proc.returncode == 1
    assert_one_line_error(proc, "magic")
    assert proc.stdout == b""


def test_cli_reports_a_missing_file_in_one_line(tmp_path: Path) -> None:
    proc = run_cli("generate", "hello", "-m", str(tmp_path / "absent.gguf"))
    assert proc.returncode == 1
    assert_one_line_error(proc, "absent.gguf", "not found")
    assert proc.stdout == b""
