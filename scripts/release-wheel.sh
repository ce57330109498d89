#!/bin/bash
# Builds the release wheel: CPU, wgpu and CUDA in one, for any x86-64 Linux with glibc 2.28 or
# later. maturin checks the manylinux_2_28 policy (no symbol from a newer glibc); zig, from
# PyPI, links against glibc 2.28 whatever this machine's is. Usage: scripts/release-wheel.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check 'maturin>=1.5,<2' 'ziglang>=0.13'
maturin build --release --compatibility manylinux_2_28 --zig -o "${1:-dist}"
