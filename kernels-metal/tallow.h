// What every kernel of tallow's Metal backend shares: Metal's standard library, the launch
// constants the host code agrees on (tallow-backend-gpu's kernels.rs), threadgroup reductions,
// and the GGUF weight and KV page formats (kernels-gpu/formats.h, shared with CUDA's kernels).
//
// The host compiles every source of this directory as one library (headers inlined where
// they are included); the emulation compiles them as C++ after emulation/metal_emulation.h.
#pragma once

#include <metal_stdlib>
using namespace metal;

#include "formats.h"

// Tokens of one threadgroup of the decode products (matmul.metal), and so the most pairs of a
// mixture's tiles cut for them (experts.metal's group_pairs) where not every product of the
// mixture takes tiles.metal's.
#define PRODUCT_TOKENS 8

// An expert's offset in the table of a launch of experts' products whose buffer does not hold
// the expert (kernels.rs's NO_EXPERT): the tiles of that expert are another launch's.
#define NO_EXPERT 0xffffffffu

// Pair i of a mixture's tile (expert, first index in `pairs`, count, unused: experts.metal's
// group_pairs), the tile's last pair where i is past its count: the row of x it reads
// (pair / divisor) and the row of y it writes.
inline void tile_pair(device const uint32_t* pairs, device const uint32_t* tile, int i,
                      int divisor, thread int* in, thread int* out) {
    int count = (int)tile[2];
    int pair = (int)pairs[tile[1] + (i < count ? i : count - 1)];
    *in = pair / divisor;
    *out = pair;
}

// The sum of `v` over a threadgroup of whole SIMD-groups (at most 1024 threads), in every
// thread, `partial` holding 32 floats of the threadgroup's memory. Every thread of the
// threadgroup must call it.
inline float group_sum(float v, threadgroup float* partial, uint tid, uint threads) {
    v = simd_sum(v);
    uint lane = tid % 32, simd = tid / 32;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // an earlier call's sums have been read
    if (lane == 0) partial[simd] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = lane < threads / 32 ? partial[lane] : 0.0f;
    return simd_sum(v);
}

// The largest `v` over a threadgroup of whole SIMD-groups, in every thread (as group_sum).
inline float group_max(float v, threadgroup float* partial, uint tid, uint threads) {
    v = simd_max(v);
    uint lane = tid % 32, simd = tid / 32;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) partial[simd] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = lane < threads / 32 ? partial[lane] : -INFINITY;
    return simd_max(v);
}
