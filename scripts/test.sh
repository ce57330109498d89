#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this script). Works on a fresh machine that
# has only a Rust toolchain and CPython >= 3.10 with pip: it makes a virtual environment in .venv,
# installs the test tools there, builds the extension in release mode (inference in a debug
# build is far too slow to test), pulls the test models, installs Mesa's software Vulkan driver
# for the GPU tests and Chromium for the chat page's where they are missing (Debian packages),
# then runs every check.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step prints the seconds since the start, so a slow run shows where its time went.
step() { printf '\n==> [%ds] %s\n' "$SECONDS" "$*"; }

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    step "creating .venv"
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate

step "cargo fmt"
cargo fmt --all -- --check

step "installing the build and test tools"
python -m pip install --quiet --disable-pip-version-check 'maturin>=1.5,<2'

step "building tallow (release) with the test extra"
maturin develop --release --extras test

step "ruff"
ruff check python tests
ruff format --check python tests

step "mypy (the package, strict) and stubtest (_core.pyi against the built extension)"
mypy
python -m mypy.stubtest tallow._core

step "pulling the test models (the default one and gemma3-270m)"
tallow pull
tallow pull gemma3-270m

step "a Vulkan driver for the wgpu tests (Mesa's llvmpipe where there is no GPU)"
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    bash scripts/apt-install.sh mesa-vulkan-drivers libvulkan1
fi

step "Chromium for the chat page tests (Debian's package, driven by Playwright)"
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    bash scripts/apt-install.sh chromium
fi

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The module without GPU support (the wgpu feature off) builds as well.
cargo clippy -p tallow-py --no-default-features -- -D warnings

step "macOS: the Metal device code checked for Apple silicon"
bash scripts/check-macos.sh

step "cargo test"
# The CUDA backend's NVRTC test compiles with the PyPI wheel's library (a test dependency).
TALLOW_NVRTC="$(python -c 'import os; from tallow import _nvrtc; _nvrtc.point_to_the_wheel(); print(os.environ["TALLOW_NVRTC"])')"
export TALLOW_NVRTC
cargo test --workspace
# The conformance suite on the CPU's lesser kernel tables too (the ISA is picked per process).
for isa in avx2 scalar; do
    TALLOW_ISA=$isa cargo test -p tallow-conformance --test cpu
done

step "pytest"
# The chat page's tests leave their screenshots here.
TALLOW_SCREENSHOTS="${TALLOW_SCREENSHOTS:-target/screenshots}" python -m pytest --durations=30 "$@"

step "NEON: the kernel, KV and model crates' tests built for aarch64, run under qemu"
bash scripts/test-aarch64.sh
step "done"
