"""Models by Hugging Face Hub name, against a stand-in for the Hub (``hub_server.py``) served
here: tag resolution, ``hf://`` files, split models, resumed downloads, gated repos, damaged
downloads and the offline cache, through the Python API, the command line and the server.

huggingface_hub reads ``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` when it is
imported, so each download runs in a fresh process with its own environment: a private cache
per test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
from conftest import all_logits, assert_one_line_error, free_port, run_cli, serving
from hub_server import TOKEN, FakeHub, Repo, sha256
from hub_server import serving as serving_hub

import tallow
from tallow import _core, hub
from tallow._progress import format_bytes

TINY = "tallow-test/tiny-GGUF"
SPLIT = "tallow-test/split-GGUF"
GATED = "tallow-test/gated-GGUF"
BIG = "tallow-test/big-GGUF"


def write_split(source: Path, dest: Path, parts: int) -> list[Path]:
    """Split the GGUF ``source`` into ``parts`` files as llama.cpp's gguf-split does
    (``<dest stem>-00001-of-0000N.gguf``, ...), with gguf-py's writer; returns their paths."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    per_part = math.ceil(len(reader.tensors) / parts)
    writer = gguf.GGUFWriter(dest, arch, split_max_tensors=per_part)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths = [
        dest.with_name(f"{dest.stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)
    ]
    assert all(p.is_file() for p in paths), sorted(dest.parent.iterdir())
    return paths


@pytest.fixture(scope="module")
def files(arch_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny llama of ``reference/arch`` in Q8_0 and F16, and its Q8_0 split in three."""
    split = write_split(
        arch_dir / "llama3" / "llama3-q8_0.gguf", tmp_path_factory.mktemp("split") / "tiny.gguf", 3
    )
    return {
        "Q8_0": arch_dir / "llama3" / "llama3-q8_0.gguf",
        "F16": arch_dir / "llama3" / "llama3-f16.gguf",
        **{f"part{i}": path for i, path in enumerate(split, 1)},
    }


@pytest.fixture(scope="module")
def fake_hub(files: dict[str, Path]) -> Iterator[FakeHub]:
    q8, f16 = files["Q8_0"].read_bytes(), files["F16"].read_bytes()
    # Bigger than huggingface_hub's read chunk (10 MiB), so that a dropped download has
    # something to resume from; its content is never loaded.
    big = np.random.default_rng(0).bytes(12 << 20)
    repos = {
        TINY: Repo(
            {
                "README.md": b"# tiny\n",
                "tiny-F16.gguf": f16,
                "tiny-Q8_0.gguf": q8,
                "mmproj-tiny-F16.gguf": f16,  # a projector: never picked by a tag
            }
        ),
        SPLIT: Repo(
            {
                # A folder named by the quantization, as some repos hold split models.
                **{
                    f"Q8_0/tiny-{i:05d}-of-00003.gguf": files[f"part{i}"].read_bytes()
                    for i in (1, 2, 3)
                },
                "tiny-F16.gguf": f16,
            }
        ),
        GATED: Repo({"tiny-Q8_0.gguf": q8}, gated=True),
        BIG: Repo({"big-Q4_0.gguf": big}),
    }
    with serving_hub(FakeHub(repos)) as served:
        yield served


@pytest.fixture
def env(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a process that uses the stand-in Hub, with a private cache and no
    token."""
    fake_hub.reset()
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return {
        "HF_ENDPOINT": fake_hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def run_python(code: str, env: Mapping[str, str]) -> dict[str, str]:
    """Run ``code`` in a fresh interpreter with ``env`` added; it prints one JSON object, which
    is returned."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, str] = json.loads(proc.stdout)
    return result


def pull_each(env: Mapping[str, str], *names: str) -> dict[str, str]:
    """``tallow.pull`` each name in a fresh process: its path, or ``"<error class>: <message>"``."""
    code = f"""
import json, tallow
out = {{}}
for name in {list(names)!r}:
    try:
        out[name] = str(tallow.pull(name, progress=False))
    except tallow.TallowError as exc:
        out[name] = f"{{type(exc).__name__}}: {{exc}}"
print(json.dumps(out))
"""
    return run_python(code, env)


def snapshot(env: Mapping[str, str], repo: str, fake_hub: FakeHub) -> Path:
    """The folder of ``repo``'s snapshot in the private cache."""
    folder = "models--" + repo.replace("/", "--")
    return Path(env["HF_HUB_CACHE"]) / folder / "snapshots" / fake_hub.repos[repo].commit


def test_names_pick_files_as_llama_cpp_does() -> None:
    assert hub.parse("user/repo") == hub.HubName("user/repo")
    assert hub.parse("user/repo:q4_k_m") == hub.HubName("user/repo", "q4_k_m")
    assert hub.parse("hf://user/repo/sub/model.gguf") == hub.HubName(
        "user/repo", file="sub/model.gguf"
    )
    assert hub.parse("hf://user/repo:Q8_0") == hub.HubName("user/repo", "Q8_0")
    for path in ("model.gguf", "dir/model.gguf", "./user/repo", "../models", "/abs/repo", "a/b/c"):
        assert hub.parse(path) is None, path
    with pytest.raises(tallow.InvalidArgumentError, match="hf://user/repo/path/file.gguf"):
        hub.parse("hf://user")

    files = [
        "README.md",
        "mmproj-m-Q4_K_M.gguf",
        "m.q8_0.gguf",
        "m-Q4_K_M.gguf",
        "m-UD-Q4_K_XL.gguf",
        "Q5_K_M/m-00001-of-00002.gguf",
        "Q5_K_M/m-00002-of-00002.gguf",
    ]

    def pick(name: str) -> str:
        parsed = hub.parse(name)
        assert parsed is not None
        return hub.select_file(parsed, files)

    assert pick("u/r") == "m-Q4_K_M.gguf"  # Q4_K_M first; the projector is no model
    assert pick("u/r:Q8_0") == "m.q8_0.gguf"  # any case, after a dot
    assert pick("u/r:q5_k_m") == "Q5_K_M/m-00001-of-00002.gguf"  # a folder; the first part
    assert pick("u/r:UD-Q4_K_XL") == pick("u/r:Q4_K_XL") == "m-UD-Q4_K_XL.gguf"
    assert pick("hf://u/r/Q5_K_M/m-00002-of-00002.gguf") == "Q5_K_M/m-00001-of-00002.gguf"
    assert hub.select_file(hub.HubName("u/r"), ["b-F16.gguf", "a-Q8_0.gguf"]) == "a-Q8_0.gguf"
    assert hub.select_file(hub.HubName("u/r"), ["b-F16.gguf", "a-BF16.gguf"]) == "a-BF16.gguf"
    with pytest.raises(tallow.ModelNotFoundError) as info:
        pick("u/r:IQ4_XS")
    assert str(info.value) == "no IQ4_XS file in u/r; there are: Q4_K_M, Q4_K_XL, Q5_K_M, Q8_0"


def test_tags_pick_and_download_a_file(
    env: dict[str, str], fake_hub: FakeHub, files: dict[str, Path]
) -> None:
    got = pull_each(env, f"{TINY}:q8_0", f"{TINY}:F16", TINY, f"{TINY}:Q5_K_M")
    folder = snapshot(env, TINY, fake_hub)
    assert got[f"{TINY}:q8_0"] == str(folder / "tiny-Q8_0.gguf")
    assert got[f"{TINY}:F16"] == str(folder / "tiny-F16.gguf")
    # No tag: Q4_K_M, else Q8_0 (although F16 comes first), as llama.cpp picks.
    assert got[TINY] == str(folder / "tiny-Q8_0.gguf")
    assert Path(got[TINY]).read_bytes() == files["Q8_0"].read_bytes()
    assert Path(got[f"{TINY}:F16"]).read_bytes() == files["F16"].read_bytes()
    assert got[f"{TINY}:Q5_K_M"] == (
        f"ModelNotFoundError: no Q5_K_M file in {TINY}; there are: F16, Q8_0"
    )
    # Each file was downloaded once; nothing else was.
    assert len(fake_hub.gets(TINY, "tiny-Q8_0.gguf")) == 1
    assert len(fake_hub.gets(TINY, "tiny-F16.gguf")) == 1
    assert [r for r in fake_hub.requests if r.method == "GET" and "/resolve/" in r.path] == (
        fake_hub.gets(TINY, "tiny-Q8_0.gguf") + fake_hub.gets(TINY, "tiny-F16.gguf")
    )


def test_hf_uris_name_exact_files(env: dict[str, str], fake_hub: FakeHub) -> None:
    code = f"""
import json, tallow
llm = tallow.LLM("hf://{TINY}/tiny-F16.gguf", n_ctx=64, progress=False)
out = {{"path": str(llm.path), "arch": llm.architecture}}
try:
    tallow.resolve_model("hf://{TINY}/absent.gguf")
except tallow.ModelNotFoundError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""
    got = run_python(code, env)
    assert got["path"] == str(snapshot(env, TINY, fake_hub) / "tiny-F16.gguf")
    assert got["arch"] == "llama"
    assert (
        got["error"]
        == f"no file absent.gguf in {TINY}; its GGUF models: tiny-F16.gguf, tiny-Q8_0.gguf"
    )


def test_split_model_loads_as_one(
    env: dict[str, str], fake_hub: FakeHub, files: dict[str, Path], prompt: list[int]
) -> None:
    path = Path(pull_each(env, f"{SPLIT}:Q8_0")[f"{SPLIT}:Q8_0"])
    folder = snapshot(env, SPLIT, fake_hub) / "Q8_0"
    assert path == folder / "tiny-00001-of-00003.gguf"
    for i in (1, 2, 3):
        part = folder / f"tiny-{i:05d}-of-00003.gguf"
        assert part.read_bytes() == files[f"part{i}"].read_bytes()
    split = _core.Model(path)
    whole = _core.Model(files["Q8_0"])
    assert split.file_size == sum(files[f"part{i}"].stat().st_size for i in (1, 2, 3))
    assert [t[0] for t in split.tensors()] == [t[0] for t in whole.tensors()]
    np.testing.assert_array_equal(all_logits(split, prompt), all_logits(whole, prompt))

    # A part missing from the disk is named.
    (folder / "tiny-00003-of-00003.gguf").unlink()
    with pytest.raises(tallow.ModelNotFoundError, match="part 3 of 3 of the split model"):
        _core.Model(path)


def test_command_line_and_server_take_hub_names(env: dict[str, str], fake_hub: FakeHub) -> None:
    proc = run_cli("pull", f"{SPLIT}:Q8_0", env=env)
    assert proc.returncode == 0, proc.stderr
    first = snapshot(env, SPLIT, fake_hub) / "Q8_0" / "tiny-00001-of-00003.gguf"
    assert proc.stdout.decode().strip() == str(first)
    assert_one_line_error(
        run_cli("pull", f"{SPLIT}:Q5_K_M", env=env), "no Q5_K_M file", "F16, Q8_0"
    )

    proc = run_cli("info", "-m", f"{TINY}:F16", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "architecture: llama" in proc.stdout.decode()

    proc = run_cli("list", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.decode().splitlines()]
    split_size = sum(len(data) for data in fake_hub.repos[SPLIT].files.values()) - len(
        fake_hub.repos[SPLIT].files["tiny-F16.gguf"]
    )
    f16_size = len(fake_hub.repos[TINY].files["tiny-F16.gguf"])
    split_row = [SPLIT, *format_bytes(split_size).split(), "Q8_0/tiny-00001-of-00003.gguf"]
    assert [*split_row, "(3", "parts)"] in rows
    assert [TINY, *format_bytes(f16_size).split(), "tiny-F16.gguf"] in rows

    with serving("-m", f"{TINY}:F16", "--ctx", "64", env=env) as url:
        models = httpx.get(f"{url}/v1/models").json()["data"]
    assert models[0]["id"] == f"{TINY}:F16"


def test_a_dropped_download_resumes(env: dict[str, str], fake_hub: FakeHub) -> None:
    cut = 11 << 20
    fake_hub.drop_after[f"{BIG}/big-Q4_0.gguf"] = cut
    path = Path(pull_each(env, BIG)[BIG])
    assert path.read_bytes() == fake_hub.repos[BIG].files["big-Q4_0.gguf"]
    first, second = fake_hub.gets(BIG, "big-Q4_0.gguf")
    assert first.range is None
    # The second request asks for the rest of what the first one wrote.
    assert second.range is not None and second.range.startswith("bytes=")
    resumed_at = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= cut


def test_gated_and_missing_repos(
    env: dict[str, str], fake_hub: FakeHub, files: dict[str, Path]
) -> None:
    got = pull_each(env, GATED, "tallow-test/absent-GGUF")
    assert got[GATED].startswith(f"CatalogError: {GATED} is a gated repo: accept its conditions")
    assert "set HF_TOKEN" in got[GATED]
    assert got["tallow-test/absent-GGUF"] == (
        "ModelNotFoundError: no model tallow-test/absent-GGUF on the Hub (if it is private: set "
        "HF_TOKEN to an access token of your account, or log in with `hf auth login`)"
    )
    assert not fake_hub.gets(GATED, "tiny-Q8_0.gguf")  # refused at the HEAD request

    path = Path(pull_each({**env, "HF_TOKEN": TOKEN}, GATED)[GATED])
    assert path.read_bytes() == files["Q8_0"].read_bytes()
    assert [get.authorization for get in fake_hub.gets(GATED, "tiny-Q8_0.gguf")] == [
        f"Bearer {TOKEN}"
    ]


def test_a_damaged_download_is_caught(
    env: dict[str, str], fake_hub: FakeHub, files: dict[str, Path]
) -> None:
    key = f"{TINY}/tiny-Q8_0.gguf"
    data = files["Q8_0"].read_bytes()
    middle = len(data) // 2
    damaged = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
    fake_hub.corrupt.add(key)
    got = pull_each(env, f"{TINY}:Q8_0")[f"{TINY}:Q8_0"]
    assert got == (
        f"CatalogError: {key}: sha256 mismatch: expected {sha256(data)} (listed by the Hub), got "
        f"{sha256(damaged)}; the damaged download was removed from the cache"
    )
    cache = Path(env["HF_HUB_CACHE"]) / "models--tallow-test--tiny-GGUF"
    assert not (cache / "blobs" / sha256(data)).exists()
    assert not (snapshot(env, TINY, fake_hub) / "tiny-Q8_0.gguf").exists()

    # The next pull downloads it again.
    fake_hub.corrupt.clear()
    path = Path(pull_each(env, f"{TINY}:Q8_0")[f"{TINY}:Q8_0"])
    assert path.read_bytes() == data
    assert len(fake_hub.gets(TINY, "tiny-Q8_0.gguf")) == 2


def test_cached_models_load_without_the_hub(env: dict[str, str], fake_hub: FakeHub) -> None:
    path = pull_each(env, f"{SPLIT}:Q8_0")[f"{SPLIT}:Q8_0"]
    fake_hub.requests.clear()
    offline = pull_each({**env, "HF_HUB_OFFLINE": "1"}, f"{SPLIT}:Q8_0", f"{SPLIT}:F16")
    assert offline == {
        f"{SPLIT}:Q8_0": path,
        f"{SPLIT}:F16": f"ModelNotFoundError: no F16 file in {SPLIT}; there are: Q8_0",
    }
    unreachable = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    assert pull_each(unreachable, f"{SPLIT}:Q8_0") == {f"{SPLIT}:Q8_0": path}
    assert fake_hub.requests == []
