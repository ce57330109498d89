#!/usr/bin/env bash
# Runs tallow's GPU suites and benchmarks from a kit that scripts/gpu-kit.sh packed, on a
# machine with an NVIDIA GPU, from the repository's root, writing each one's log into OUT:
#   1. the conformance suite on CUDA, then on wgpu over the GPU's Vulkan driver;
#   2. tests/test_cuda.py and tests/test_wgpu.py (less what needs the real models, which the
#      kit does not hold);
#   3. `tallow bench` on random-weight 1B Q4_K_M and MoE models on CUDA, with and without
#      CUDA graphs, then on wgpu; the engine's host time per decode step beside the forward's
#      (benches/engine_overhead.py) on CUDA.
# With `--llama`, it then builds llama.cpp for the GPU (about 6 minutes on 16 cores) and runs
# its llama-bench on the same models. Needs root for the Vulkan loader's packages.
#
# Usage: bash scripts/gpu-run.sh KIT OUT [--llama]
set -uo pipefail
kit=$(realpath "$1")
out=$(realpath "${2:?an output folder}")
llama=${3:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."

# The Vulkan loader and the Python packages from the kit.
for deb in "$kit"/gl/*.deb; do dpkg -x "$deb" /; done
ldconfig
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$kit"/wheels/*.whl
export PYTHONPATH=$kit/python:$site PYTHONUNBUFFERED=1
export TALLOW_SHARED_DIR=$kit/shared TALLOW_HOME=$(mktemp -d)
# NVIDIA's Vulkan and EGL driver files, where the system does not list them.
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
    [[ -f $icd ]] && export VK_DRIVER_FILES=$icd && break
done
# NVRTC: the CUDA toolkit's where there is one (tallow also looks in the PyPI wheel's folder).
for nvrtc in /usr/local/cuda/lib64/libnvrtc.so.13 /usr/local/cuda/lib64/libnvrtc.so.12; do
    [[ -f $nvrtc ]] && export TALLOW_NVRTC=$nvrtc && break
done

step() {
    local name=$1
    shift
    local start=$SECONDS
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
    tail -3 "$out/$name.log"
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
python3 -m tallow info --devices >"$out/devices.txt" 2>&1
cat "$out/devices.txt"
step cuda_conformance "$kit/bin/cuda_conformance" --test-threads 1
step wgpu_conformance "$kit/bin/wgpu_conformance" --test-threads 1
step pytest python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_wgpu.py \
    -k "not real_model and not perplexity and not q8_0_pages and not weights_go_to_the_device \
        and not asking_for_cuda and not device_number"

models=$(mktemp -d)
for size in 1b moe; do
    python3 benches/random_model.py "$kit/vocab.gguf" "$models/$size.gguf" "$size" >/dev/null
done
for size in 1b moe; do
    m=$models/$size.gguf
    step "bench_cuda_$size" python3 -m tallow bench -m "$m" --device cuda:0 -p 512 -n 128 -r 2
    step "bench_cuda_${size}_no_graphs" env TALLOW_CUDA_GRAPHS=0 \
        python3 -m tallow bench -m "$m" --device cuda:0 -p 512 -n 128 --npp 0 -r 2
    step "bench_wgpu_$size" python3 -m tallow bench -m "$m" --device gpu -p 512 -n 128 --npp 0 -r 2
done
step engine_overhead_cuda python3 benches/engine_overhead.py -m "$models/1b.gguf" --device cuda:0

if [[ $llama == --llama && -f $kit/llama.cpp.tar.xz ]]; then
    src=$(mktemp -d)
    tar xJf "$kit/llama.cpp.tar.xz" -C "$src"
    step llama_build cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_TYPE=Release
    step llama_make cmake --build "$src/build" -j"$(nproc)" --target llama-bench
    for size in 1b moe; do
        step "llama_bench_$size" "$src/build/bin/llama-bench" -m "$models/$size.gguf" -ngl 99 \
            -p 512 -n 128 -r 2
    done
fi
cat "$out/summary.txt"
