#!/usr/bin/env bash
# Packs what tallow's GPU suites and benchmarks take into one folder, for a machine with an
# NVIDIA GPU and its driver, Python 3.10+, pytest and numpy, but no Rust toolchain and no
# network. Built here from the working tree; `scripts/gpu-run.sh KIT OUT` runs it there.
#
#   bin/           the conformance suites' test binaries, CUDA's and wgpu's, stripped (the
#                  kernels' sources are compiled into them)
#   python/tallow  the Python package with its extension module
#   shared/        the reference models of every architecture and their oracles (two
#                  checkpoints: llama3's and gpt-oss's)
#   vocab.gguf     a tokenizer, which benches/random_model.py's random-weight models take
#   wheels/        the Python packages tallow and its tests need beyond pytest and numpy
#                  (CPython 3.12)
#   gl/            the Vulkan loader's Debian packages, for wgpu on the GPU's Vulkan driver
#   llama.cpp.tar.xz  llama.cpp's sources, for its CUDA build beside tallow's (see gpu-run.sh)
#
# Usage: bash scripts/gpu-kit.sh [KIT]   (default KIT: .gpu, ignored by git)
# Needs: cargo, maturin, the test dependencies' Python environment (for the extension and
# gguf), apt-get download rights, and llama.cpp's sources where build-llama-cpp.sh keeps them
# ($HOME/.cache/llama.cpp-peer; left out when missing). About 50 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=${1:-.gpu}
shared=${TALLOW_SHARED_DIR:-../shared}
rm -rf "$kit"
mkdir -p "$kit"/{bin,python,shared/reference,wheels,gl}

# The test binaries, found through cargo's messages.
binary() {
    cargo test --release "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}
cp "$(binary -p tallow-backend-cuda --features driver --test gpu_conformance)" "$kit/bin/cuda_conformance"
cp "$(binary -p tallow-backend-wgpu --test conformance)" "$kit/bin/wgpu_conformance"
strip "$kit"/bin/*

# The Python package, its extension built in release.
maturin develop --release -m rust/tallow-py/Cargo.toml >&2
cp -r python/tallow "$kit/python/"
find "$kit/python" -name __pycache__ -prune -exec rm -rf {} +

# The reference models without the checkpoints they were converted from, but for the two the
# lookup formats' test converts (llama3 to IQ4_NL and IQ4_XS, gpt-oss with MXFP4 experts).
(cd "$shared/reference" && tar cf - --exclude=hf arch) | tar xf - -C "$kit/shared/reference"
(cd "$shared/reference" && tar cf - arch/llama3/hf arch/gpt-oss/hf) | tar xf - -C "$kit/shared/reference"
python3 - "$kit/vocab.gguf" <<'EOF'
import sys
sys.path.insert(0, "benches")
import gguf
import random_model
from tallow.catalog import resolve_model
w = gguf.GGUFWriter(sys.argv[1], "llama")
random_model.copy_tokenizer(gguf.GGUFReader(resolve_model("smollm2-135m")), w)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
EOF

# Wheels of what a machine with pytest, numpy, httpx, jinja2 and anyio may lack (CPython 3.12).
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_$n"_x86_64); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d "$kit/wheels" \
    starlette uvicorn httpx2 httpcore2 truststore gguf openai pydantic pydantic-core \
    annotated-types typing-inspection jiter distro sniffio tokenizers >&2

# The Vulkan loader (a machine with NVIDIA's driver has the driver's Vulkan part only).
lists=$(mktemp -d)
apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
mkdir -p "$lists/partial"
apt-get "${apt_opts[@]}" update >&2
(cd "$kit/gl" && apt-get "${apt_opts[@]}" download libvulkan1 libegl1 libglvnd0 >&2)
rm -rf "$lists"

# llama.cpp's sources, less what a CUDA build of llama-bench does not read (the other
# backends, the server and its web page, the tests, the models, the Python tools).
llama=$HOME/.cache/llama.cpp-peer
if [[ -f $llama/CMakeLists.txt ]]; then
    skip=(build build-avx2 .git .github models docs examples media tests benches conversion
        gguf-py scripts tools/ui tools/server ggml/src/ggml-vulkan
        ggml/src/ggml-sycl ggml/src/ggml-cann ggml/src/ggml-musa ggml/src/ggml-opencl
        ggml/src/ggml-metal ggml/src/ggml-webgpu ggml/src/ggml-openvino ggml/src/ggml-et
        ggml/src/ggml-hexagon ggml/src/ggml-zdnn)
    tar cJf "$kit/llama.cpp.tar.xz" -C "$llama" "${skip[@]/#/--exclude=./}" .
fi
du -sh "$kit"
