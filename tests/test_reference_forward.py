"""tallow's forward pass against a plain numpy transformer over the same weights.

The numpy side dequantizes every tensor with the `gguf` package (an independent reader and
dequantizer) and computes in float64, so it measures how far tallow's quantized arithmetic
(8-bit activations, integer dot products) strays from exact math.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from tallow import _core


class NumpyLlama:
    """A llama-family forward pass in float64 numpy, written from the architecture's definition."""

    def __init__(self, path: Path) -> None:
        reader = GGUFReader(path)
        fields = {name: field.contents() for name, field in reader.fields.items()}
        arch = fields["general.architecture"]
        self.n_layer = fields[f"{arch}.block_count"]
        self.n_head = fields[f"{arch}.attention.head_count"]
        self.n_head_kv = fields[f"{arch}.attention.head_count_kv"]
        self.eps = fields[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.rope_base = fields[f"{arch}.rope.freq_base"]
        self.w: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            values = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = values.reshape(shape)
        self.output = self.w.get("output.weight", self.w["token_embd.weight"])
        self.head_dim = self.w["blk.0.attn_q.weight"].shape[0] // self.n_head

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x: np.ndarray) -> np.ndarray:
        """Rotates adjacent pairs (2i, 2i+1) of each head by pos * base^(-2i/head_dim)."""
        n, heads, hd = x.shape
        inv_freq = self.rope_base ** (-np.arange(0, hd, 2) / hd)
        angles = np.arange(n)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def forward(self, tokens: list[int]) -> np.ndarray:
        n, hd = len(tokens), self.head_dim
        x = self.w["token_embd.weight"][tokens]
        causal = np.triu(np.full((n, n), -np.inf), k=1)
        group = self.n_head // self.n_head_kv
        for i in range(self.n_layer):

            def w(name: str, i: int = i) -> np.ndarray:
                return self.w[f"blk.{i}.{name}.weight"]

            h = self.rms_norm(x, w("attn_norm"))
            q = self.rope((h @ w("attn_q").T).reshape(n, self.n_head, hd))
            k = self.rope((h @ w("attn_k").T).reshape(n, self.n_head_kv, hd))
            v = (h @ w("attn_v").T).reshape(n, self.n_head_kv, hd)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", scores, v).reshape(n, -1)
            x = x + attn @ w("attn_output").T
            h = self.rms_norm(x, w("ffn_norm"))
            gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w("ffn_down").T
        return self.rms_norm(x, self.w["output_norm.weight"]) @ self.output.T


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> NumpyLlama:
    return NumpyLlama(smollm2_path)


def test_logits_match_numpy_reference(smollm2_path: Path, reference: NumpyLlama) -> None:
    model = _core.Model(str(smollm2_path))
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. 1234", False, False)
    expected = reference.forward(tokens)
    got = model.new_context(64).eval(tokens, all_logits=True)
    assert got.shape == expected.shape == (len(tokens), model.n_vocab)
    for pos in range(len(tokens)):
        e, g = expected[pos], got[pos].astype(np.float64)
        corr = np.corrcoef(e, g)[0, 1]
        # 8-bit activations and an f16 KV cache cost a little precision (about 0.15 logits of
        # noise here), never the shape of the distribution: tallow's top token is the exact
        # top or within a near-tie of it.
        assert corr > 0.995, f"position {pos}: correlation {corr}"
        assert np.max(np.abs(e - g)) < 0.05 * np.ptp(e), f"position {pos}"
        assert e[np.argmax(g)] > e.max() - 0.5, f"position {pos}"


def test_incremental_decode_matches_one_pass(smollm2_path: Path) -> None:
    """Feeding tokens one at a time through the KV cache gives the logits of a single pass."""
    model = _core.Model(str(smollm2_path))
    tokens = model.tokenize("def fib(n):\n    return n if n < 2 else", False, False)
    whole = model.new_context(64).eval(tokens, all_logits=True)
    ctx = model.new_context(64)
    for pos, token in enumerate(tokens):
        step = ctx.eval([token])
        np.testing.assert_allclose(step, whole[pos], rtol=0, atol=1e-3)
    assert ctx.n_past == len(tokens)
