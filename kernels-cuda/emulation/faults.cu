// Kernels with the faults the emulator reports instead of guessing at (never compiled for a
// GPU): a warp operation that half of a warp does not reach.

#include "tallow.cuh"

extern "C" __global__ void divergent_shuffle(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(FULL_WARP, v, 1);
    out[threadIdx.x] = v;
}
TALLOW_EXPORT(divergent_shuffle)
