"""RoPE stretched past the training context: YaRN and Phi-3's long-context factors.

No tiny reference model carries either, so the tests add them to the F32 files of
``shared/reference/arch`` (YaRN keys on the Mistral file, long and short factor tensors on the
Phi-3 one) and compare tallow with a float64 numpy forward whose RoPE follows transformers'
``_compute_yarn_parameters`` and ``_compute_longrope_parameters``. The numpy forward is first
checked against transformers' own logits on the unmodified files.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
import pytest
from conftest import all_logits

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig

F64 = npt.NDArray[np.float64]


def rewrite(
    src: Path,
    dst: Path,
    fields: dict[str, object],
    tensors: dict[str, F64],
    drop: frozenset[str] = frozenset(),
) -> Path:
    """``src`` with metadata ``fields`` set (ints as u32, floats as f32, strings, bools, lists),
    float32 ``tensors`` added (in place of any of the same name) and the tensors named in
    ``drop`` left out."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in fields:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for name, value in fields.items():
        if isinstance(value, list):
            writer.add_array(name, value)
            continue
        kind = {
            int: gguf.GGUFValueType.UINT32,
            float: gguf.GGUFValueType.FLOAT32,
            str: gguf.GGUFValueType.STRING,
            bool: gguf.GGUFValueType.BOOL,
        }[type(value)]
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        if tensor.name in drop or tensor.name in tensors:
            continue
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    for name, values in tensors.items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


class NumpyForward:
    """The Llama (GGUF ``llama``: RoPE on adjacent pairs) or Phi-3 (fused QKV and gate/up,
    RoPE on halves) forward in float64, with RoPE's inverse frequencies and magnitude given."""

    def __init__(self, path: Path) -> None:
        reader = gguf.GGUFReader(path)
        fields = {name: field.contents() for name, field in reader.fields.items()}
        self.arch = arch = fields["general.architecture"]
        self.n_head = fields[f"{arch}.attention.head_count"]
        self.n_head_kv = fields[f"{arch}.attention.head_count_kv"]
        self.eps = fields[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.base = fields[f"{arch}.rope.freq_base"]
        self.n_layer = fields[f"{arch}.block_count"]
        self.w = {
            t.name: np.asarray(t.data, dtype=np.float64).reshape(
                [int(d) for d in reversed(t.shape.tolist())]
            )
            for t in reader.tensors
        }
        self.head_dim = fields[f"{arch}.embedding_length"] // self.n_head

    def plain_inv_freq(self) -> F64:
        return 1.0 / self.base ** (np.arange(0, self.head_dim, 2) / self.head_dim)

    def rope(self, x: F64, inv_freq: F64, magnitude: float) -> F64:
        n = x.shape[0]
        angles = np.arange(n)[:, None] * inv_freq[None, :]
        cos = np.cos(angles)[:, None, :] * magnitude
        sin = np.sin(angles)[:, None, :] * magnitude
        if self.arch == "phi3":
            half = self.head_dim // 2
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def rms_norm(self, x: F64, weight: F64) -> F64:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def forward(self, tokens: list[int], inv_freq: F64, magnitude: float = 1.0) -> F64:
        n, hd = len(tokens), self.head_dim
        q_dim, kv_dim = self.n_head * hd, self.n_head_kv * hd
        x = self.w["token_embd.weight"][tokens]
        causal = np.triu(np.full((n, n), -np.inf), k=1)
        for i in range(self.n_layer):

            def w(name: str, i: int = i) -> F64:
                return self.w[f"blk.{i}.{name}.weight"]

            h = self.rms_norm(x, w("attn_norm"))
            if self.arch == "phi3":
                qkv = h @ w("attn_qkv").T
                q, k, v = qkv[:, :q_dim], qkv[:, q_dim : q_dim + kv_dim], qkv[:, q_dim + kv_dim :]
            else:
                q, k, v = h @ w("attn_q").T, h @ w("attn_k").T, h @ w("attn_v").T
            q = self.rope(q.reshape(n, self.n_head, hd), inv_freq, magnitude)
            k = self.rope(k.reshape(n, self.n_head_kv, hd), inv_freq, magnitude)
            v = v.reshape(n, self.n_head_kv, hd)
            group = self.n_head // self.n_head_kv
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            x = x + np.einsum("hqk,khd->qhd", scores, v).reshape(n, -1) @ w("attn_output").T
            h = self.rms_norm(x, w("ffn_norm"))
            if self.arch == "phi3":
                gate, up = np.split(h @ w("ffn_up").T, 2, axis=-1)
            else:
                gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w("ffn_down").T
        output = self.w.get("output.weight", self.w["token_embd.weight"])
        return self.rms_norm(x, self.w["output_norm.weight"]) @ output.T


def hf_yarn(base: float, dim: int, factor: float, original: int) -> tuple[F64, float]:
    """transformers' ``_compute_yarn_parameters`` (beta_fast 32, beta_slow 1)."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(32)), 0)
    high = min(math.ceil(correction_dim(1)), dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (
        1 / pos_freqs
    ) * extrapolation_factor
    return inv_freq, 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize("arch", ["mistral", "phi3"])
def test_the_numpy_forward_matches_transformers(
    arch_dir: Path, prompt: list[int], arch: str
) -> None:
    reference = NumpyForward(arch_dir / arch / f"{arch}-f32.gguf")
    expected = np.load(arch_dir / arch / "ref_logits.npy")
    got = reference.forward(prompt, reference.plain_inv_freq())
    assert np.max(np.abs(got - expected)) < 1e-4


def test_yarn_matches_the_reference_formula(
    arch_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    # An original context of 256 stretched 4 times: the ramp spans the first 3 of 8 pairs.
    factor, original = 4.0, 256
    path = rewrite(
        arch_dir / "mistral" / "mistral-f32.gguf",
        tmp_path / "mistral-yarn.gguf",
        {
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": factor,
            "llama.rope.scaling.original_context_length": original,
        },
        {},
    )
    reference = NumpyForward(path)
    inv_freq, magnitude = hf_yarn(reference.base, reference.head_dim, factor, original)
    expected = reference.forward(prompt, inv_freq, magnitude)
    unscaled = reference.forward(prompt, reference.plain_inv_freq())
    got = all_logits(_core.Model(path), prompt).astype(np.float64)
    assert np.max(np.abs(got - expected)) < 1e-4
    # YaRN moves the logits far more than the tolerance.
    assert np.max(np.abs(unscaled - expected)) > 0.05


@pytest.fixture(scope="module")
def phi3_long(arch_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Phi-3 file as a model trained at 32 positions and stretched to 128 with LongRoPE
    factors, written as llama.cpp's converter writes Phi-3 128k."""
    rng = np.random.default_rng(7)
    pairs = 8
    scale, original = 128 / 32, 32
    return rewrite(
        arch_dir / "phi3" / "phi3-f32.gguf",
        tmp_path_factory.mktemp("phi3") / "phi3-long.gguf",
        {
            "phi3.context_length": 128,
            "phi3.rope.scaling.original_context_length": original,
            "phi3.rope.scaling.attn_factor": math.sqrt(1 + math.log(scale) / math.log(original)),
        },
        {
            "rope_factors_long.weight": 1 + rng.random(pairs) * np.arange(1, pairs + 1) * 4,
            "rope_factors_short.weight": 1 + rng.random(pairs) * 0.3,
        },
    )


def _long_rope(path: Path, which: str) -> tuple[F64, float]:
    """The ``which`` ("long" or "short") factors of ``path``, and its attention factor."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    factors = np.asarray(tensors[f"rope_factors_{which}.weight"].data, dtype=np.float64)
    field = gguf.GGUFReader(path).fields["phi3.rope.scaling.attn_factor"]
    return factors, float(field.contents())


def test_long_rope_uses_the_factors_of_the_context(phi3_long: Path, prompt: list[int]) -> None:
    reference = NumpyForward(phi3_long)
    plain = reference.plain_inv_freq()
    outputs = {}
    for which, n_ctx in [("short", None), ("long", 128)]:
        factors, attn_factor = _long_rope(phi3_long, which)
        expected = reference.forward(prompt, plain / factors, attn_factor)
        model = _core.Model(phi3_long, n_ctx=n_ctx)
        got = all_logits(model, prompt).astype(np.float64)
        assert np.max(np.abs(got - expected)) < 1e-4, which
        outputs[which] = expected
    assert np.max(np.abs(outputs["short"] - outputs["long"])) > 0.05


def test_long_rope_contexts(phi3_long: Path) -> None:
    short = _core.Model(phi3_long)
    assert (short.n_ctx_max, short.n_ctx_train) == (32, 128)
    assert _core.Model(phi3_long, n_ctx=32).n_ctx_max == 32
    assert _core.Model(phi3_long, n_ctx=33).n_ctx_max == 128
    # The front ends load the model for the context they are asked for.
    assert tallow.LLM(phi3_long, progress=False).n_ctx == 32
    assert tallow.LLM(phi3_long, n_ctx=100, progress=False).n_ctx == 100
    with pytest.raises(tallow.InvalidArgumentError, match="load it with n_ctx=64"):
        Engine(short, EngineConfig(n_ctx=64))
    with pytest.raises(tallow.InvalidArgumentError, match="beyond the 128 positions"):
        _core.Model(phi3_long, n_ctx=129)
    with pytest.raises(tallow.InvalidArgumentError, match="n_ctx must be from 1 to 32"):
        short.new_context(33)


def test_an_unknown_rope_scaling_is_refused(arch_dir: Path, tmp_path: Path) -> None:
    path = rewrite(
        arch_dir / "mistral" / "mistral-f32.gguf",
        tmp_path / "mistral-dynamic.gguf",
        {"llama.rope.scaling.type": "dynamic"},
        {},
    )
    with pytest.raises(tallow.UnsupportedError, match="RoPE scaling 'dynamic'"):
        _core.Model(path)


@pytest.mark.parametrize(
    ("fields", "tensors", "error", "match"),
    [
        ({"phi3.rope.scaling.type": 3}, {}, tallow.ModelError, "rope.scaling.type"),
        ({"phi3.rope.scaling.attn_factor": -1.0}, {}, tallow.ModelError, "attn_factor"),
        ({"phi3.rope.scaling.original_context_length": 0}, {}, tallow.ModelError, "original"),
        ({}, {"rope_factors_long.weight": np.ones(8)}, tallow.ModelError, "rope_factors_short"),
        (
            {},
            {"rope_factors_long.weight": np.ones(7), "rope_factors_short.weight": np.ones(7)},
            tallow.ModelError,
            "rope_factors_long",
        ),
        (
            {
                "phi3.rope.scaling.type": "yarn",
                "phi3.rope.scaling.factor": 4.0,
                "phi3.rope.scaling.yarn_log_multiplier": 0.1,
            },
            {},
            tallow.UnsupportedError,
            "yarn_log_multiplier",
        ),
    ],
)
def test_bad_rope_scaling_metadata_is_a_clear_error(
    arch_dir: Path,
    tmp_path: Path,
    fields: dict[str, object],
    tensors: dict[str, F64],
    error: type[Exception],
    match: str,
) -> None:
    path = rewrite(arch_dir / "phi3" / "phi3-f32.gguf", tmp_path / "bad.gguf", fields, tensors)
    with pytest.raises(error, match=match):
        _core.Model(path)


def test_a_long_rope_checkpoint_converts_to_the_long_rope_gguf(
    arch_dir: Path, tmp_path: Path, phi3_long: Path, prompt: list[int]
) -> None:
    """A Phi-3 folder whose config holds LongRoPE factors (as Phi-3 128k's and Phi-4-mini's
    do) loads as the GGUF llama.cpp's converter writes of it: the same factors, attention
    factor and contexts, so the same logits with either set of factors."""
    folder = tmp_path / "phi3-long"
    shutil.copytree(arch_dir / "phi3" / "hf", folder)
    config = json.loads((folder / "config.json").read_text())
    long, _ = _long_rope(phi3_long, "long")
    short, _ = _long_rope(phi3_long, "short")
    config["max_position_embeddings"] = 128
    config["original_max_position_embeddings"] = 32
    config["rope_parameters"] = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
        "long_factor": long.tolist(),
        "short_factor": short.tolist(),
    }
    (folder / "config.json").write_text(json.dumps(config))
    for n_ctx in (None, 128):
        ours = _core.Model(str(folder), n_ctx=n_ctx)
        theirs = _core.Model(phi3_long, n_ctx=n_ctx)
        assert (ours.n_ctx_max, ours.n_ctx_train) == (theirs.n_ctx_max, theirs.n_ctx_train)
        np.testing.assert_array_equal(all_logits(ours, prompt), all_logits(theirs, prompt))
    attn = "phi3.rope.scaling.attn_factor"
    assert ours.metadata_value(attn) == theirs.metadata_value(attn)
    config["rope_parameters"]["short_factor"] = short.tolist()[:-1]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(tallow.ModelError, match="short_factor has 7 factors"):
        _core.Model(str(folder))
