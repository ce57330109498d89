#!/bin/bash
# A profile-guided build of the extension, measured beside the plain release build.
#
# 1. builds the extension instrumented (-Cprofile-generate) into $WORK/instrumented;
# 2. runs the profile workload on it: tallow bench (prefill, decode, batched) on smollm2-135m
#    and gemma3-270m, with the best kernels and capped to AVX2;
# 3. merges the profiles (llvm-profdata; $PROFDATA names it, e.g. llvm-profdata-19) and builds
#    the extension with them (-Cprofile-use) into $WORK/pgo;
# 4. runs tallow bench with the installed build (`maturin develop --release`) and the PGO one in
#    turns, ROUNDS times, on both models and instruction sets.
#
#   bash benches/pgo.sh [WORK=/tmp/tallow-pgo] [PROFDATA=llvm-profdata] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/tallow-pgo}
PROFDATA=${PROFDATA:-llvm-profdata}
ROUNDS=${ROUNDS:-2}
PYTHON=${PYTHON:-python}
MODELS=(smollm2-135m gemma3-270m)

build() { # build NAME RUSTFLAGS: the extension, unpacked beside a copy of the package
    rm -rf "$WORK/$1" && mkdir -p "$WORK/$1/py"
    CARGO_TARGET_DIR="$WORK/target-$1" RUSTFLAGS="$2" maturin build --release -o "$WORK/$1/wheel"
    cp -r python/tallow "$WORK/$1/py/" && rm -f "$WORK/$1/py/tallow/_core.abi3.so"
    "$PYTHON" -c "import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob(sys.argv[1])[0]); \
open(sys.argv[2], 'wb').write(z.read('tallow/_core.abi3.so'))" \
        "$WORK/$1/wheel/*.whl" "$WORK/$1/py/tallow/_core.abi3.so"
}

rm -rf "$WORK/profiles"
build instrumented "-Cprofile-generate=$WORK/profiles"
for isa in "" avx2; do
    for m in "${MODELS[@]}"; do
        TALLOW_ISA=$isa PYTHONPATH="$WORK/instrumented/py" "$PYTHON" -m tallow bench -m "$m" \
            -p 256 -n 64 -r 1
        TALLOW_ISA=$isa PYTHONPATH="$WORK/instrumented/py" "$PYTHON" -m tallow bench -m "$m" \
            --npp 64 --ntg 32 --npl 8 -r 1
    done
done
"$PROFDATA" merge -o "$WORK/merged.profdata" "$WORK"/profiles/*.profraw
build pgo "-Cprofile-use=$WORK/merged.profdata"
for round in $(seq "$ROUNDS"); do
    for isa in "" avx2; do
        for m in "${MODELS[@]}"; do
            for b in release pgo; do
                echo "== round $round, kernels ${isa:-best}, $m, $b build"
                path=""; [ "$b" = pgo ] && path="$WORK/pgo/py"
                TALLOW_ISA=$isa PYTHONPATH="$path" "$PYTHON" -m tallow bench -m "$m" \
                    -p 512 -n 128 --npp 128 --ntg 128 --npl 16 -r 3 2>/dev/null
            done
        done
    done
done
