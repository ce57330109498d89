"""Prints the hashes of ggml's own quantizers that tallow's are compared with
(`k_and_iq4_quants_quantize_bit_identically_to_ggml` in rust/tallow-quant/src/tests/golden.rs).

Usage: python scripts/ggml_quantize_hashes.py PATH/TO/libggml-base.so
(a llama.cpp build, e.g. the one ../shared/tools/build-llama-cpp.sh makes, under build/bin).
It builds the test's values exactly as the Rust test does, quantizes them with
``ggml_quantize_chunk`` (no importance matrix) and prints FNV-1a of each format's bytes.
With ``--dump DIR`` it also writes each format's bytes to DIR/<TYPE>.bin.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

MASK = (1 << 64) - 1
TYPES = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23}
BYTES_PER_256 = {
    "Q2_K": 84,
    "Q3_K": 110,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
    "IQ4_NL": 144,
    "IQ4_XS": 136,
}


class SplitMix64:
    """The Rust tests' generator (tallow-quant's testing::Rng)."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def golden_values(blocks: int) -> np.ndarray:
    """The Rust test's `golden_values`, float for float."""
    rng = SplitMix64(0x90170A17)
    out = np.zeros(blocks * 256, dtype=np.float32)

    def centred() -> np.float32:
        return np.float32((rng.next_u64() >> 40) - (1 << 23))

    for block in range(blocks):
        kind = block % 8
        e = (-80 if kind == 5 else -12) + rng.next_u64() % 15
        scale = np.float32(2.0 ** (e - 23))
        constant = centred() * scale
        for i in range(256):
            v = centred() * scale
            if kind == 1:
                v = abs(v)
            elif kind == 2:
                v = np.float32(0.0)
            elif kind == 3:
                v = constant
            elif kind == 4 and i % 37 == 0:
                v = v * np.float32(64.0)
            elif kind == 6:
                v = -abs(v)
            elif kind == 7 and i % 11 != 0:
                v = np.float32(0.0)
            out[block * 256 + i] = v
    return out


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def rust_hex(h: int) -> str:
    """``h`` as a Rust u64 literal in groups of four hex digits."""
    digits = f"{h:016x}"
    return "0x" + "_".join(digits[i : i + 4] for i in range(0, 16, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lib", type=Path, help="libggml-base.so of a llama.cpp build")
    parser.add_argument("--dump", type=Path, help="write each format's bytes here")
    args = parser.parse_args()
    ggml = ctypes.CDLL(str(args.lib))
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    blocks = 64
    x = golden_values(blocks)
    for name, ty in TYPES.items():
        out = ctypes.create_string_buffer(blocks * BYTES_PER_256[name])
        ggml.ggml_quantize_chunk(ty, x.ctypes.data, out, 0, blocks, 256, None)
        data = out.raw
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.bin").write_bytes(data)
        h = fnv1a(data)
        print(f"    (GgmlType::{name}, {rust_hex(h)}),")


if __name__ == "__main__":
    main()
