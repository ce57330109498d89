"""KV pages in q8_0, q4_0 and bf16: page sizes, perplexity within a stated bound of f16 pages
(the engine's concurrency tests run on q8_0 pages too, see test_async_llm), and clear errors
for a type that does not exist or a device that does not hold it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

import tallow
from tallow import InvalidArgumentError, UnsupportedError, _core

TEXT = Path(__file__).parents[2] / "shared" / "reference" / "perplexity" / "apache-2.0.txt"

# Perplexity on the reference text (ctx 256) with quantized KV pages, beside f16 pages: q8_0
# moves it by less than 1%, q4_0 (a quarter of f16's memory) by less than 10% (keys and values
# rotated before they are quantized; unrotated q4_0 pages cost 28% here), bf16 (3 bits fewer
# than f16, f32's range) by less than 1%.
BOUNDS = {"q8_0": 1.01, "q4_0": 1.10, "bf16": 1.01}


@pytest.fixture(scope="module")
def f16_ppl(smollm2: tallow.LLM) -> float:
    return smollm2.perplexity(TEXT.read_text(), ctx=256)


@pytest.mark.parametrize("kv_dtype", ["q8_0", "q4_0", "bf16"])
def test_perplexity_stays_within_its_bound(
    smollm2_path: Path, f16_ppl: float, kv_dtype: str
) -> None:
    llm = tallow.LLM(smollm2_path, n_ctx=512, kv_dtype=kv_dtype)
    ppl = llm.perplexity(TEXT.read_text(), ctx=256)
    assert ppl != f16_ppl  # the keys and values are rounded otherwise
    assert f16_ppl / BOUNDS[kv_dtype] < ppl < f16_ppl * BOUNDS[kv_dtype]


def test_pages_are_smaller(smollm2_path: Path) -> None:
    model = _core.Model(str(smollm2_path))
    f16 = model.kv_page_bytes(16, "f16")
    # A row of 64 values: 128 bytes in f16 and bf16, two blocks of 34 (q8_0) or 18 (q4_0)
    # bytes.
    assert model.kv_page_bytes(16, "q8_0") * 128 == f16 * 68
    assert model.kv_page_bytes(16, "q4_0") * 128 == f16 * 36
    assert model.kv_page_bytes(16, "bf16") == f16 == model.kv_page_bytes(16, "f32") // 2


def test_bad_types_are_refused(smollm2_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="kv_dtype must be one of"):
        tallow.LLM(smollm2_path, kv_dtype="q5_0")
    proc = run_cli("perplexity", "-f", str(TEXT), "--kv-dtype", "int8")
    assert_one_line_error(proc, "kv_dtype must be one of")


@pytest.mark.parametrize("dtype", ["q4_0", "bf16"])
def test_the_gpu_refuses_pages_it_does_not_read(smollm2_path: Path, dtype: str) -> None:
    model = _core.Model(str(smollm2_path), device="gpu")
    with pytest.raises(UnsupportedError, match=f"wgpu does not hold KV pages of {dtype}"):
        model.new_kv_cache(dtype=dtype, max_pages=4)


def test_bench_and_perplexity_take_the_type() -> None:
    proc = run_cli(
        "bench", "-p", "32", "-n", "4", "-d", "40", "--npp", "0", "-r", "1", "--kv-dtype", "q4_0"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [line for line in proc.stdout.decode().splitlines() if "@ d40" in line]
    assert [row.split("|")[5].strip() for row in rows] == ["pp32 @ d40", "tg4 @ d40"]
    proc = run_cli("perplexity", "-f", str(TEXT), "--ctx", "256", "--kv-dtype", "q8_0")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().startswith("PPL = ")
