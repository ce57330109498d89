// The few spellings that differ between the dialects of the GPU kernels that kernels-gpu/'s
// headers serve: CUDA's (kernels-cuda/, NVRTC) and Metal's (kernels-metal/), and the
// emulation's C++ builds of both.
#pragma once

#ifdef __METAL_VERSION__
// Metal: functions are inline, pointers name their address space (GLOBAL: device memory,
// PRIVATE: the thread's own, TABLE: a table of the program's constants), and the math
// functions are overloaded by type.
#define GPU_FN inline
#define GLOBAL device
#define PRIVATE thread
#define TABLE constant
#define float_from_bits(u) as_type<float>((uint32_t)(u))
#define fmaxf fmax
#define fabsf fabs
#define roundf round
#define ldexpf ldexp
#else
#define GPU_FN __device__ __forceinline__
#define GLOBAL
#define PRIVATE
// In global memory, not __constant__: a warp's lanes look up different entries, which the
// constant cache would serve one after the other.
#define TABLE __device__ const
#define float_from_bits(u) __uint_as_float(u)
#endif
