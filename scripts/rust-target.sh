#!/usr/bin/env bash
# Makes sure the Rust standard library for target $1 is installed (with rustup), for the
# scripts that build for another platform. Exits non-zero, saying why, where it cannot be had
# (no rustup, or no network to fetch it); the callers then skip their checks.
set -euo pipefail

target="$1"
if ! command -v rustup >/dev/null; then
    echo "no rustup to install the Rust standard library for $target"
    exit 1
fi
if ! rustup target list --installed | grep -qx "$target"; then
    if ! timeout 600 rustup target add "$target"; then
        echo "the Rust standard library for $target cannot be installed here"
        exit 1
    fi
fi
