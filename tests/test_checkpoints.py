"""Hugging Face checkpoint folders (``config.json``, ``*.safetensors``, ``tokenizer.model`` or
``tokenizer.json``):
loaded as they are, converted in memory, and written as GGUF files by ``tallow convert``.

Oracles: the GGUF files llama.cpp's converter made from the same folders of the tiny
reference models (``shared/reference/arch/<arch>/hf``), whose logits and token ids the
converted folder must give exactly, and transformers' logits.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import all_logits, assert_one_line_error, run_cli
from gguf.quants import dequantize as gguf_dequantize
from test_architectures import ARCHITECTURES
from tokenizers import Tokenizer

import tallow
from tallow import _core

CONVERTED = [arch for arch, _ in ARCHITECTURES] + ["mixtral", "qwen2moe", "qwen3moe", "gpt-oss"]
"""Every reference architecture."""
TEXTS = ["Hello world", "  leading spaces and\ttabs\n", "naïve café ☕ 123", ""]


@pytest.mark.parametrize("arch", CONVERTED)
def test_a_folder_computes_what_llama_cpp_s_conversion_computes(
    arch_dir: Path, prompt: list[int], arch: str
) -> None:
    folder = _core.Model(str(arch_dir / arch / "hf"))
    converted = _core.Model(str(arch_dir / arch / f"{arch}-f32.gguf"))
    got = all_logits(folder, prompt)
    np.testing.assert_array_equal(got, all_logits(converted, prompt))
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    assert float(np.abs(got - reference).max()) <= 1e-4
    for text in TEXTS:
        assert folder.tokenize(text, True, False) == converted.tokenize(text, True, False)
    assert folder.architecture == converted.architecture


@pytest.mark.parametrize("arch", ["llama3", "gemma3", "qwen3moe"])
def test_a_folder_quantized_as_it_loads(arch_dir: Path, prompt: list[int], arch: str) -> None:
    """``quantize="q8_0"``: the matrices rounded on the way, to the bytes of llama.cpp's own
    Q8_0 file of the folder, so to its logits."""
    ours = tallow.LLM(arch_dir / arch / "hf", quantize="q8_0", progress=False)
    theirs = _core.Model(str(arch_dir / arch / f"{arch}-q8_0.gguf"))
    np.testing.assert_array_equal(all_logits(ours._model, prompt), all_logits(theirs, prompt))
    # Every matrix but a mixture's routers (which stay F32).
    tensors = ours._model.tensors()
    assert {k for n, k, dims in tensors if len(dims) >= 2 and "gate_inp" not in n} == {"Q8_0"}
    with pytest.raises(tallow.InvalidArgumentError, match="Q4_K_M, Q5_K_S"):
        tallow.LLM(arch_dir / arch / "hf", quantize="iq2_xxs", progress=False)
    with pytest.raises(tallow.InvalidArgumentError, match="applies to a checkpoint folder"):
        tallow.LLM(arch_dir / arch / f"{arch}-f32.gguf", quantize="q8_0", progress=False)


def test_tallow_convert_writes_the_gguf(arch_dir: Path, tmp_path: Path, prompt: list[int]) -> None:
    out = tmp_path / "qwen3.gguf"
    proc = run_cli("convert", str(arch_dir / "qwen3" / "hf"), str(out))
    assert proc.returncode == 0, proc.stderr
    written = _core.Model(str(out))
    np.testing.assert_array_equal(
        all_logits(written, prompt),
        all_logits(_core.Model(str(arch_dir / "qwen3" / "qwen3-f32.gguf")), prompt),
    )
    assert not (tmp_path / "qwen3.gguf.partial").exists()
    small = tmp_path / "qwen3-q4_0.gguf"
    proc = run_cli("convert", str(arch_dir / "qwen3" / "hf"), str(small), "--type", "Q4_0")
    assert proc.returncode == 0, proc.stderr
    # As llama-quantize's Q4_0: every matrix but the output layer, which gets Q6_K, or Q8_0
    # where its rows are no whole number of Q6_K blocks.
    kinds = {name: kind for name, kind, dims in _core.Model(str(small)).tensors() if len(dims) == 2}
    assert kinds.pop("output.weight") == "Q8_0"
    assert set(kinds.values()) == {"Q4_0"}
    assert small.stat().st_size < out.stat().st_size / 4
    assert_one_line_error(
        run_cli("convert", str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")),
        "no checkpoint folder",
    )
    assert_one_line_error(
        run_cli("convert", str(arch_dir / "qwen3" / "hf"), str(small), "--type", "q3"),
        "not converted to q3",
    )


def test_k_quant_mixtures_from_the_command_line_and_at_load(
    arch_dir: Path, tmp_path: Path, prompt: list[int]
) -> None:
    """``--type Q4_K_M`` and ``quantize="q4_k"`` (its alias): llama-quantize's mixture (the
    Rust tests hold its bytes against llama-quantize's), the same model either way."""
    out = tmp_path / "llama3-q4_k_m.gguf"
    proc = run_cli("convert", str(arch_dir / "llama3" / "hf"), str(out), "--type", "Q4_K_M")
    assert proc.returncode == 0, proc.stderr
    written = _core.Model(str(out))
    assert written.metadata_value("general.file_type") == 15
    kinds = {name: kind for name, kind, dims in written.tensors() if len(dims) == 2}
    # Two layers: the down projection of the last gets more bits; rows of 64 fall back to
    # Q5_0 (Q4_K's 256-element blocks do not fit them).
    assert (kinds["blk.0.ffn_down.weight"], kinds["blk.1.ffn_down.weight"]) == ("Q4_K", "Q6_K")
    assert kinds["blk.0.attn_q.weight"] == "Q5_0"
    loaded = tallow.LLM(arch_dir / "llama3" / "hf", quantize="q4_k", progress=False)
    assert loaded._model.tensors() == written.tensors()
    np.testing.assert_array_equal(all_logits(loaded._model, prompt), all_logits(written, prompt))


def copy_of(arch_dir: Path, tmp_path: Path, arch: str = "qwen3") -> Path:
    folder = tmp_path / f"{arch}-copy"
    shutil.copytree(arch_dir / arch / "hf", folder)
    return folder


def test_bad_folders_are_clear_errors(arch_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(arch_dir, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(tallow.ModelError, match="outside the data section"):
        _core.Model(str(folder))
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(tallow.ModelError, match="not a safetensors file"):
        _core.Model(str(folder))
    weights.write_bytes(data)
    (folder / "tokenizer.model").unlink()
    with pytest.raises(tallow.ModelError, match="tokenizer.model"):
        _core.Model(str(folder))
    (folder / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(tallow.UnsupportedError, match="BertModel"):
        _core.Model(str(folder))
    (folder / "config.json").unlink()
    with pytest.raises(tallow.ModelNotFoundError, match="config.json"):
        _core.Model(str(folder))


def test_mutated_checkpoints_never_crash(arch_dir: Path, tmp_path: Path) -> None:
    """Bytes of the safetensors header changed at random: a model or a clear error."""
    folder = copy_of(arch_dir, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(7)
    for _ in range(40):
        mutated = bytearray(data)
        for at in rng.integers(0, header, size=int(rng.integers(1, 4))):
            mutated[int(at)] = int(rng.integers(0, 256))
        weights.write_bytes(bytes(mutated))
        with contextlib.suppress(tallow.TallowError):
            _core.Model(str(folder))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file of F32 tensors."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F32"
        start, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + start : 8 + n + end], np.float32).reshape(
            entry["shape"]
        )
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """``tensors`` as a safetensors file of ``dtype`` (F32, F16 or BF16; byte arrays as U8)."""
    blobs = []
    for values in tensors.values():
        if values.dtype == np.uint8:
            blobs.append(values)
        elif dtype == "BF16":
            blobs.append((values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        else:
            blobs.append(values.astype({"F32": np.float32, "F16": np.float16}[dtype]))
    header, offset = {}, 0
    for (name, values), blob in zip(tensors.items(), blobs, strict=True):
        header[name] = {
            "dtype": "U8" if values.dtype == np.uint8 else dtype,
            "shape": list(values.shape),
            "data_offsets": [offset, offset + blob.nbytes],
        }
        offset += blob.nbytes
    raw = json.dumps(header).encode()
    with path.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for blob in blobs:
            out.write(blob.tobytes())


def test_sharded_checkpoints_load_as_one(arch_dir: Path, tmp_path: Path, prompt: list[int]) -> None:
    folder = copy_of(arch_dir, tmp_path)
    tensors = read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    for file, part in shards.items():
        write_safetensors(folder / file, {n: tensors[n] for n in part}, "F32")
    index = {"weight_map": {n: file for file, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    want = all_logits(_core.Model(str(arch_dir / "qwen3" / "qwen3-f32.gguf")), prompt)
    np.testing.assert_array_equal(all_logits(_core.Model(str(folder)), prompt), want)
    # A shard the index names but the folder lacks.
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(tallow.ModelNotFoundError, match="00002-of-00002"):
        _core.Model(str(folder))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_checkpoints_keep_their_precision(
    arch_dir: Path, tmp_path: Path, prompt: list[int], dtype: str
) -> None:
    folder = copy_of(arch_dir, tmp_path)
    tensors = read_safetensors(folder / "model.safetensors")
    write_safetensors(folder / "model.safetensors", tensors, dtype)
    model = _core.Model(str(folder))
    kinds = {kind for _, kind, dims in model.tensors() if len(dims) == 2}
    assert kinds == {dtype}
    reference = np.load(arch_dir / "qwen3" / "ref_logits.npy")
    # transformers' logits, to the half formats' rounding of the weights.
    assert float(np.abs(all_logits(model, prompt) - reference).max()) <= 0.05


@pytest.mark.parametrize("arch", ["qwen2moe", "qwen3moe"])
def test_tokenizer_json_ids_equal_hf_tokenizers(
    arch_dir: Path, reference_dir: Path, arch: str
) -> None:
    """A folder's byte-level BPE (``tokenizer.json``, Llama 3's pre-tokenizer) gives the ids HF
    ``tokenizers`` gives, on the reference texts."""
    folder = arch_dir / arch / "hf"
    model = _core.Model(str(folder))
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    files = sorted((reference_dir / "tokenizer").glob("*.*"))
    texts = [p.read_text(encoding="utf-8") for p in files if not p.name.endswith(".json")]
    assert len(texts) >= 3
    for text in [*texts, *TEXTS]:
        assert model.tokenize(text, False, False) == hf.encode(text, add_special_tokens=False).ids


FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
"""The sixteen values of an MXFP4 element (E2M1)."""


def to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``w`` (``[..., n]``) as gpt-oss's released files hold them: blocks ``[..., n/32,
    16]`` of two values a byte (the first in the low nibble) and E8M0 scales ``[..., n/32]``,
    each block's scale the power of two that brings its largest magnitude within 6."""
    blocks = w.reshape(*w.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    scaled = blocks / np.ldexp(np.float32(1.0), exp)[..., None]
    index = np.abs(scaled[..., None] - FP4_VALUES).argmin(axis=-1).astype(np.uint8)
    return index[..., 0::2] | (index[..., 1::2] << 4), (exp + 127).astype(np.uint8)


def from_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' dequantization of gpt-oss's MXFP4 (``convert_moe_packed_tensors``)."""
    pairs = np.stack([FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]], axis=-1)
    values = pairs.reshape(*blocks.shape[:-1], 32)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*values.shape[:-2], -1)


def released_gpt_oss(
    arch_dir: Path, tmp_path: Path
) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A folder of the tiny gpt-oss as gpt-oss is released: the experts' matrices in MXFP4
    blocks and scales (``[experts, out, in]``, gate and up rows interleaved). Returns the
    folder, its tensors, and the values transformers reads from each expert matrix, by the
    name of the GGUF tensor that holds them."""
    folder = copy_of(arch_dir, tmp_path, "gpt-oss")
    tensors = read_safetensors(folder / "model.safetensors")
    expected = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = to_mxfp4(np.swapaxes(tensors.pop(name), -1, -2))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        values, layer = from_mxfp4(blocks, scales), name.split(".")[2]
        if name.endswith("gate_up_proj"):
            expected[f"blk.{layer}.ffn_gate_exps.weight"] = values[:, 0::2]
            expected[f"blk.{layer}.ffn_up_exps.weight"] = values[:, 1::2]
        else:
            expected[f"blk.{layer}.ffn_down_exps.weight"] = values
    write_safetensors(folder / "model.safetensors", tensors, "F32")
    return folder, tensors, expected


def test_gpt_oss_as_released_has_its_mxfp4_experts_repacked(
    arch_dir: Path, tmp_path: Path, prompt: list[int]
) -> None:
    """gpt-oss as released, its experts repacked into GGML's MXFP4 with the values
    transformers reads from them (against the ``gguf`` package's dequantization); every other
    tensor as the F32 folder converts."""
    folder, tensors, expected = released_gpt_oss(arch_dir, tmp_path)
    out = tmp_path / "gpt-oss-mxfp4.gguf"
    _core.convert_checkpoint(folder, out)
    converted = {t.name: t for t in gguf.GGUFReader(out).tensors}
    plain = {t.name: t for t in gguf.GGUFReader(arch_dir / "gpt-oss" / "gpt-oss-f32.gguf").tensors}
    assert converted.keys() == plain.keys()
    for name, t in converted.items():
        if name in expected:
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            got = gguf_dequantize(t.data, t.tensor_type).reshape(expected[name].shape)
            np.testing.assert_array_equal(got, expected[name], err_msg=name)
        else:
            assert t.data.tobytes() == plain[name].data.tobytes(), name
    logits = all_logits(_core.Model(str(out)), prompt)
    assert np.isfinite(logits).all()
    tensors["model.layers.0.mlp.experts.down_proj_scales"] = tensors[
        "model.layers.0.mlp.experts.down_proj_scales"
    ][:, :-1]
    write_safetensors(folder / "model.safetensors", tensors, "F32")
    with pytest.raises(tallow.ModelError, match="does not fit the blocks"):
        _core.Model(str(folder))
