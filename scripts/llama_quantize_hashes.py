"""Prints the hashes of llama-quantize's output that `file_types_quantize_as_llama_quantize`
(rust/tallow-convert/tests/reference.rs) compares tallow's conversions with.

Usage: python scripts/llama_quantize_hashes.py PATH/TO/llama-quantize [ARCH_DIR]
(ARCH_DIR: shared/reference/arch). For each file type it quantizes every reference
architecture's F32 GGUF with llama-quantize (no importance matrix) and prints FNV-1a over the
architectures in the test's order, each one's tensors by name: the name, the type's id (u32,
little-endian) and the tensor's bytes.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from ggml_quantize_hashes import fnv1a, rust_hex
from gguf import GGUFReader

ARCHS = [
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma2",
    "gemma3",
    "mixtral",
    "qwen2moe",
    "qwen3moe",
    "gpt-oss",
]
FILE_TYPES = [
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("quantize", type=Path, help="llama.cpp's llama-quantize")
    default_dir = Path(__file__).resolve().parents[2] / "shared/reference/arch"
    parser.add_argument("arch_dir", type=Path, nargs="?", default=default_dir)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for file_type in FILE_TYPES:
            hashed = bytearray()
            for arch in ARCHS:
                out = Path(tmp) / f"{arch}-{file_type}.gguf"
                subprocess.run(
                    [
                        str(args.quantize),
                        str(args.arch_dir / arch / f"{arch}-f32.gguf"),
                        str(out),
                        file_type,
                    ],
                    check=True,
                    capture_output=True,
                )
                for t in sorted(GGUFReader(out).tensors, key=lambda t: t.name):
                    hashed += t.name.encode() + int(t.tensor_type).to_bytes(4, "little")
                    hashed += t.data.tobytes()
            h = fnv1a(bytes(hashed))
            print(f"    (FileType::{file_type}, {rust_hex(h)}),")


if __name__ == "__main__":
    main()
