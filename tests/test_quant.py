"""Dequantization is bit-identical to the ``gguf`` package's ``gguf.quants.dequantize`` (a numpy
port of ggml's ``dequantize_row_*``) for every block format tallow reads.

The blocks are random bytes, with every f16 field (block scales and minimums, and the elements of
F16 tensors) replaced by a random finite half, so that no NaN or infinity goes through a float
operation: numpy and tallow may legitimately differ in how they propagate NaN payloads. F32 and
BF16 elements are plain bit copies and keep their random bytes, NaNs included. Results are
compared bit for bit (as uint32), which also tells -0.0 from 0.0.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

import tallow
from tallow import _core

# Byte offsets of the f16 fields inside one block (ggml-common.h).
F16_FIELDS: dict[str, list[int]] = {
    "F32": [],
    "F16": [0],
    "BF16": [],
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    # Its scale is an E8M0 byte: any value is finite.
    "MXFP4": [],
    "IQ2_XXS": [0],
    "IQ2_XS": [0],
    "IQ2_S": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ1_S": [0],
    # Its f16 scale is split over the top nibbles of four words: see IQ1M_SCALE_BYTES.
    "IQ1_M": [],
    "TQ1_0": [52],
    "TQ2_0": [64],
}

IQ1M_SCALE_BYTES = [49, 51, 53, 55]
"""The bytes of an IQ1_M block whose top nibbles hold its f16 scale, lowest nibble first."""


def set_iq1m_scales(blocks: np.ndarray, halves: np.ndarray) -> None:
    """Writes one f16 scale (bits) per IQ1_M block into the top nibbles that hold it."""
    for k, at in enumerate(IQ1M_SCALE_BYTES):
        nibble = ((halves >> (4 * k)) & 0xF).astype(np.uint8)
        blocks[:, at] = (blocks[:, at] & 0x0F) | (nibble << 4)


def finite_halves(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random f16 bit patterns over the whole finite range (subnormals included)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] ^= 0x4000  # now exponent 15: an ordinary finite value
    return bits


def random_blocks(type_name: str, n_blocks: int, seed: int) -> bytes:
    qtype = GGMLQuantizationType[type_name]
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in F16_FIELDS[type_name]:
        halves = finite_halves(rng, (n_blocks,))
        blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    if type_name == "IQ1_M":
        set_iq1m_scales(blocks, finite_halves(rng, (n_blocks,)))
    return blocks.tobytes()


@pytest.mark.parametrize("type_name", sorted(F16_FIELDS))
@pytest.mark.parametrize(("n_rows", "blocks_per_row"), [(1, 1), (1, 7), (16, 12)])
def test_dequantize_is_bit_exact_against_gguf(
    type_name: str, n_rows: int, blocks_per_row: int
) -> None:
    qtype = GGMLQuantizationType[type_name]
    block_len, block_bytes = GGML_QUANT_SIZES[qtype]
    seed = 1000 * n_rows + blocks_per_row + sum(map(ord, type_name))
    data = random_blocks(type_name, n_rows * blocks_per_row, seed)

    rows = np.frombuffer(data, dtype=np.uint8).reshape(n_rows, blocks_per_row * block_bytes)
    expected = np.asarray(gguf_dequantize(rows, qtype), dtype=np.float32).reshape(-1)
    got = _core.dequantize(type_name, data)

    assert got.dtype == np.float32
    assert got.shape == (n_rows * blocks_per_row * block_len,)
    mismatches = np.flatnonzero(expected.view(np.uint32) != got.view(np.uint32))
    assert np.array_equal(expected.view(np.uint32), got.view(np.uint32)), (
        f"{type_name}: {mismatches.size} elements differ, first at {mismatches[:5]}: "
        f"gguf {expected[mismatches[:5]]}, tallow {got[mismatches[:5]]}"
    )


def test_scales_change_the_result() -> None:
    """Guard against a comparison that cannot fail: another scale gives other values."""
    data = bytearray(random_blocks("Q4_K", 2, seed=5))
    before = _core.dequantize("Q4_K", bytes(data))
    data[0:2] = np.array([1.5], dtype=np.float16).tobytes()
    after = _core.dequantize("Q4_K", bytes(data))
    assert not np.array_equal(before[:256], after[:256])
    assert np.array_equal(before[256:], after[256:])


@pytest.mark.parametrize(
    ("type_name", "data"),
    [("Q4_0", b"\x00" * 19), ("Q6_K", b"\x00" * 209), ("NOT_A_TYPE", b"")],
)
def test_dequantize_rejects_bad_input(type_name: str, data: bytes) -> None:
    with pytest.raises(tallow.TallowError):
        _core.dequantize(type_name, data)
