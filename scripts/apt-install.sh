#!/usr/bin/env bash
# Installs Debian packages (`apt-get install`, refreshing the package lists once if that
# fails), as root or through passwordless sudo. Exits non-zero, saying why, when they cannot be
# had; callers decide whether that fails the test run.
set -euo pipefail

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    sudo="sudo -n"
fi
if ! command -v apt-get >/dev/null; then
    echo "no apt-get to install $*" >&2
    exit 1
fi
install() { timeout 600 $sudo apt-get install -y -q "$@" >/dev/null; }
if ! install "$@"; then
    if ! { timeout 600 $sudo apt-get update -q >/dev/null && install "$@"; }; then
        echo "apt-get could not install $*" >&2
        exit 1
    fi
fi
