#!/usr/bin/env bash
# The tests of the crates with per-architecture code (tallow-quant's kernels, tallow-kv, the
# CPU backend's attention, tallow-model's forward) built for aarch64 and run under qemu's user-mode
# emulator, which runs the NEON kernels. Installs qemu-user and an aarch64 cross linker
# (Debian packages) and the Rust aarch64 target where they are missing; where they cannot be
# had (no apt-get or no package mirror, no rustup target), says so and stops without failing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=aarch64-unknown-linux-gnu
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    packages=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
    if ! bash scripts/apt-install.sh "${packages[@]}"; then
        echo "skipped: ${packages[*]} cannot be installed here"
        exit 0
    fi
fi
if ! bash scripts/rust-target.sh "$target"; then
    echo "skipped: no Rust standard library for $target"
    exit 0
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target "$target" -p tallow-quant -p tallow-kv -p tallow-backend -p tallow-backend-cpu -p tallow-model
