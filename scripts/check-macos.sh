#!/usr/bin/env bash
# The code that only macOS builds (the Metal backend's device, the module's Metal entry)
# checked and linted for Apple silicon (aarch64-apple-darwin): checking needs no macOS SDK.
# Installs the Rust target where it is missing; where it cannot be had (no rustup, or no
# network to fetch it), says so and stops without failing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=aarch64-apple-darwin
if ! bash scripts/rust-target.sh "$target"; then
    echo "skipped: no Rust standard library for $target"
    exit 0
fi
cargo clippy --target "$target" -p tallow-py -p tallow-backend-metal --all-targets -- -D warnings
