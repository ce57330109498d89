// GGUF's weight formats and the KV page formats, as the GPU kernels of every API read them:
// included by CUDA's kernels (kernels-cuda/, after tallow.cuh) and Metal's (kernels-metal/,
// after tallow.h), and by the emulation's C++ builds of both, in the spellings of dialect.h.
//
// Each weight format decodes the 32 values of one run of a row (a block, or a 32-value part
// of a K-quant super-block) with the float operations, in the order, of ggml's
// dequantize_row_* (so the values are tallow-quant's reference dequantization's).
//
// The quantized formats also give a run as integers, for the integer products (CUDA's
// matvec.cu): `ints(row, r, q, scale, offset)` writes the run's quants as bytes, four to a
// word in the order of the values (q[k] holds values 4k..4k + 4), such that value 16h + i of
// the run is scale[h] * (quant_i - ZERO) + offset[h] (h: the run's first or second half of
// 16). HALVES is 2 where the halves' scales differ (Q2_K, Q3_K, Q6_K), 1 where they are the
// same.
#pragma once

#include "dialect.h"
#include "grids.h"

// A float's bits.
GPU_FN uint32_t as_bits(float f) {
#ifdef __METAL_VERSION__
    return as_type<uint32_t>(f);
#else
    return __float_as_uint(f);
#endif
}

// An f16's bits as f32 (CUDA: no cuda_fp16.h, as NVRTC's wheel ships no headers).
GPU_FN float f16_to_f32(uint16_t h) {
#if defined(__CUDACC_RTC__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#elif defined(__METAL_VERSION__) && !defined(TALLOW_EMULATION)
    return (float)as_type<half>(h);
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0) {
        // Zero or subnormal: mantissa * 2^-24.
        float v = ldexpf((float)mantissa, -24);
        return sign ? -v : v;
    }
    uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                   : sign | ((exponent + 112) << 23) | (mantissa << 13);
    return float_from_bits(bits);
#endif
}

// The f16 nearest `f` (ties to even), as bits. In integer operations on every GPU: PTX's
// cvt.rn.f16.f32 into a 16-bit register whose bytes are then stored one at a time loses the low
// byte on an H200 (sm_90, NVRTC 12.9, driver 580), which the conformance suite catches there.
GPU_FN uint16_t f32_to_f16(float f) {
    uint32_t x = as_bits(f);
    uint32_t sign = (x >> 16) & 0x8000, exponent = (x >> 23) & 0xff, mantissa = x & 0x7fffff;
    if (exponent == 0xff) return (uint16_t)(sign | 0x7c00 | (mantissa ? 0x200 : 0));
    int e = (int)exponent - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        // Subnormal (or zero): the mantissa with its implicit bit, shifted into place.
        if (e < -10) return (uint16_t)sign;
        uint32_t m = mantissa | 0x800000;
        int shift = 14 - e;
        uint32_t bits = m >> shift, rest = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (bits & 1))) ++bits;
        return (uint16_t)(sign | bits);
    }
    uint32_t bits = sign | (uint32_t)e << 10 | mantissa >> 13, rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (bits & 1))) ++bits;  // may carry into exponent
    return (uint16_t)bits;
}

// A bf16's bits as f32.
GPU_FN float bf16_to_f32(uint16_t h) { return float_from_bits((uint32_t)h << 16); }

// Bytes are read one at a time: rows of most formats are not aligned to words.
GPU_FN uint32_t u16_at(GLOBAL const uint8_t* p) { return p[0] | (uint32_t)p[1] << 8; }
GPU_FN uint32_t u32_at(GLOBAL const uint8_t* p) {
    return u16_at(p) | u16_at(p + 2) << 16;
}
GPU_FN float f16_at(GLOBAL const uint8_t* p) { return f16_to_f32((uint16_t)u16_at(p)); }

// Whole-word loads, for the integer products: a 32-bit word at an address aligned to 4 bytes
// (`word_at`), or made of two 16-bit halves at one aligned to 2 (`word_at2`, for formats whose
// blocks are an odd number of halves: Q4_0's 18 bytes). The emulation faults on a misaligned
// address, as a GPU does.
GPU_FN uint32_t half_at(GLOBAL const uint8_t* p) {
#ifdef TALLOW_EMULATION
    if ((uintptr_t)p % 2 != 0) tallow_emu::fault("a 2-byte load from an odd address");
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#else
    return *(GLOBAL const uint16_t*)p;
#endif
}
GPU_FN int word_at(GLOBAL const uint8_t* p) {
#ifdef TALLOW_EMULATION
    if ((uintptr_t)p % 4 != 0) tallow_emu::fault("a 4-byte load from a misaligned address");
    int v;
    memcpy(&v, p, 4);
    return v;
#else
    return *(GLOBAL const int*)p;
#endif
}
GPU_FN int word_at2(GLOBAL const uint8_t* p) {
    return (int)(half_at(p) | half_at(p + 2) << 16);
}

// Bits 0..4 of `bits` moved to bit 4 of each byte of a word (the fifth bits of Q5_0, Q5_1).
GPU_FN int fifth_bits(uint32_t bits) {
    return (int)((bits & 1) << 4 | (bits & 2) << 11 | (bits & 4) << 18 | (bits & 8) << 25);
}

// The 6-bit scale and min of group j (0..8) of a Q4_K or Q5_K super-block's 12 packed bytes.
GPU_FN void k4_scale_min(GLOBAL const uint8_t* s, int j, PRIVATE float* scale,
                         PRIVATE float* minimum) {
    if (j < 4) {
        *scale = (float)(s[j] & 63);
        *minimum = (float)(s[j + 4] & 63);
    } else {
        *scale = (float)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
        *minimum = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// The signed 6-bit scale of group g (0..16) of a Q3_K super-block.
GPU_FN float q3k_scale(GLOBAL const uint8_t* s, int g) {
    int low = (s[g % 8] >> (4 * (g / 8))) & 0xf;
    int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (float)((low | (high << 4)) - 32);
}

struct F32 {
    enum : int { RUN_BYTES = 128 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* p = row + r * RUN_BYTES;
        for (int i = 0; i < 32; ++i) out[i] = float_from_bits(u32_at(p + 4 * i));
    }
};

struct F16 {
    enum : int { RUN_BYTES = 64 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* p = row + r * RUN_BYTES;
        for (int i = 0; i < 32; ++i) out[i] = f16_at(p + 2 * i);
    }
};

struct BF16 {
    enum : int { RUN_BYTES = 64 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* p = row + r * RUN_BYTES;
        for (int i = 0; i < 32; ++i) out[i] = bf16_to_f32((uint16_t)u16_at(p + 2 * i));
    }
};

// d, 16 bytes of nibbles: byte j holds element j (low) and j + 16 (high); d * (q - 8).
struct Q4_0 {
    enum : int { RUN_BYTES = 18 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        float d = f16_at(b);
        for (int j = 0; j < 16; ++j) {
            out[j] = d * (float)((b[2 + j] & 0xf) - 8);
            out[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
    enum : int { ZERO = 8 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        for (int k = 0; k < 4; ++k) {
            uint32_t v = (uint32_t)word_at2(b + 2 + 4 * k);
            q[k] = (int)(v & 0x0f0f0f0f);
            q[k + 4] = (int)(v >> 4 & 0x0f0f0f0f);
        }
        scale[0] = scale[1] = f16_at(b);
        offset[0] = offset[1] = 0.0f;
    }
};

// d, m, nibbles as Q4_0; d * q + m.
struct Q4_1 {
    enum : int { RUN_BYTES = 20 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        float d = f16_at(b), m = f16_at(b + 2);
        for (int j = 0; j < 16; ++j) {
            out[j] = d * (float)(b[4 + j] & 0xf) + m;
            out[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        for (int k = 0; k < 4; ++k) {
            uint32_t v = (uint32_t)word_at(b + 4 + 4 * k);
            q[k] = (int)(v & 0x0f0f0f0f);
            q[k + 4] = (int)(v >> 4 & 0x0f0f0f0f);
        }
        scale[0] = scale[1] = f16_at(b);
        offset[0] = offset[1] = f16_at(b + 2);
    }
};

// d, 4 bytes whose bit j is bit 4 of element j, nibbles as Q4_0; d * (q - 16).
struct Q5_0 {
    enum : int { RUN_BYTES = 22 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        float d = f16_at(b);
        uint32_t high = u32_at(b + 2);
        for (int j = 0; j < 16; ++j) {
            int lo = (b[6 + j] & 0xf) | ((high >> j) & 1) << 4;
            int hi = (b[6 + j] >> 4) | ((high >> (j + 16)) & 1) << 4;
            out[j] = d * (float)(lo - 16);
            out[j + 16] = d * (float)(hi - 16);
        }
    }
    enum : int { ZERO = 16 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        uint32_t high = (uint32_t)word_at2(b + 2);
        for (int k = 0; k < 4; ++k) {
            uint32_t v = (uint32_t)word_at2(b + 6 + 4 * k);
            q[k] = (int)(v & 0x0f0f0f0f) | fifth_bits(high >> 4 * k);
            q[k + 4] = (int)(v >> 4 & 0x0f0f0f0f) | fifth_bits(high >> (16 + 4 * k));
        }
        scale[0] = scale[1] = f16_at(b);
        offset[0] = offset[1] = 0.0f;
    }
};

// d, m, high bits and nibbles as Q5_0; d * q + m.
struct Q5_1 {
    enum : int { RUN_BYTES = 24 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        float d = f16_at(b), m = f16_at(b + 2);
        uint32_t high = u32_at(b + 4);
        for (int j = 0; j < 16; ++j) {
            int lo = (b[8 + j] & 0xf) | ((high >> j) & 1) << 4;
            int hi = (b[8 + j] >> 4) | ((high >> (j + 16)) & 1) << 4;
            out[j] = d * (float)lo + m;
            out[j + 16] = d * (float)hi + m;
        }
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        uint32_t high = (uint32_t)word_at(b + 4);
        for (int k = 0; k < 4; ++k) {
            uint32_t v = (uint32_t)word_at(b + 8 + 4 * k);
            q[k] = (int)(v & 0x0f0f0f0f) | fifth_bits(high >> 4 * k);
            q[k + 4] = (int)(v >> 4 & 0x0f0f0f0f) | fifth_bits(high >> (16 + 4 * k));
        }
        scale[0] = scale[1] = f16_at(b);
        offset[0] = offset[1] = f16_at(b + 2);
    }
};

// d, 32 signed bytes; q * d.
struct Q8_0 {
    enum : int { RUN_BYTES = 34 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        float d = f16_at(b);
        for (int i = 0; i < 32; ++i) out[i] = (float)(int8_t)b[2 + i] * d;
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        for (int k = 0; k < 8; ++k) q[k] = word_at2(b + 2 + 4 * k);
        scale[0] = scale[1] = f16_at(b);
        offset[0] = offset[1] = 0.0f;
    }
};

// Super-blocks of 256 values, 8 runs each. Q2_K: 16 bytes of 4-bit scale (low) and min
// (high) per group of 16, 64 bytes of 2-bit quants (byte l of half h holds element
// 128h + 32k + l at bits 2k..2k+2), d, dmin; (d * sc) * q - (dmin * m).
struct Q2_K {
    enum : int { BLOCK_BYTES = 84 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int l = 0; l < 32; ++l) {
            int g = 2 * j + l / 16;
            float dl = d * (float)(b[g] & 0xf), ml = dmin * (float)(b[g] >> 4);
            int q = (b[16 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
            out[l] = dl * (float)q - ml;
        }
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 2 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        GLOBAL const uint8_t* quants = b + 16 + 32 * (j / 4);
        for (int k = 0; k < 8; ++k) {
            q[k] = (int)((uint32_t)word_at(quants + 4 * k) >> 2 * (j % 4) & 0x03030303);
        }
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int h = 0; h < 2; ++h) {
            scale[h] = d * (float)(b[2 * j + h] & 0xf);
            offset[h] = -(dmin * (float)(b[2 * j + h] >> 4));
        }
    }
};

// 32 bytes of high bits (bit j of byte l: element 32j + l), 2-bit quants as Q2_K, 12 bytes
// of 6-bit scales, d; (d * (sc - 32)) * (q - 4 where the high bit is clear).
struct Q3_K {
    enum : int { BLOCK_BYTES = 110 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        float d = f16_at(b + 108);
        for (int l = 0; l < 32; ++l) {
            float dl = d * q3k_scale(b + 96, 2 * j + l / 16);
            int low = (b[32 + 32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
            int q = (b[l] >> j) & 1 ? low : low - 4;
            out[l] = dl * (float)q;
        }
    }
    enum : int { ZERO = 4 };
    enum : int { HALVES = 2 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        GLOBAL const uint8_t* quants = b + 32 + 32 * (j / 4);
        for (int k = 0; k < 8; ++k) {
            uint32_t low = (uint32_t)word_at2(quants + 4 * k) >> 2 * (j % 4) & 0x03030303;
            uint32_t high = (uint32_t)word_at2(b + 4 * k) >> j & 0x01010101;
            q[k] = (int)(low | high << 2);
        }
        float d = f16_at(b + 108);
        for (int h = 0; h < 2; ++h) {
            scale[h] = d * q3k_scale(b + 96, 2 * j + h);
            offset[h] = 0.0f;
        }
    }
};

// d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles (bytes 32i..32i + 32:
// group 2i low, 2i + 1 high); (d * sc) * q - (dmin * m).
struct Q4_K {
    enum : int { BLOCK_BYTES = 144 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        float sc, m;
        k4_scale_min(b + 4, j, &sc, &m);
        float dl = f16_at(b) * sc, ml = f16_at(b + 2) * m;
        for (int l = 0; l < 32; ++l) {
            int q = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
            out[l] = dl * (float)q - ml;
        }
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        GLOBAL const uint8_t* quants = b + 16 + 32 * (j / 2);
        for (int k = 0; k < 8; ++k) {
            q[k] = (int)((uint32_t)word_at(quants + 4 * k) >> 4 * (j % 2) & 0x0f0f0f0f);
        }
        float sc, m;
        k4_scale_min(b + 4, j, &sc, &m);
        scale[0] = scale[1] = f16_at(b) * sc;
        offset[0] = offset[1] = -(f16_at(b + 2) * m);
    }
};

// As Q4_K with 32 bytes of fifth bits before the nibbles (bit j of byte l: group j, element l).
struct Q5_K {
    enum : int { BLOCK_BYTES = 176 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        float sc, m;
        k4_scale_min(b + 4, j, &sc, &m);
        float dl = f16_at(b) * sc, ml = f16_at(b + 2) * m;
        for (int l = 0; l < 32; ++l) {
            int q = (b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
            q |= ((b[16 + l] >> j) & 1) << 4;
            out[l] = dl * (float)q - ml;
        }
    }
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8;
        GLOBAL const uint8_t* quants = b + 48 + 32 * (j / 2);
        for (int k = 0; k < 8; ++k) {
            uint32_t low = (uint32_t)word_at(quants + 4 * k) >> 4 * (j % 2) & 0x0f0f0f0f;
            uint32_t high = (uint32_t)word_at(b + 16 + 4 * k) >> j & 0x01010101;
            q[k] = (int)(low | high << 4);
        }
        float sc, m;
        k4_scale_min(b + 4, j, &sc, &m);
        scale[0] = scale[1] = f16_at(b) * sc;
        offset[0] = offset[1] = -(f16_at(b + 2) * m);
    }
};

// 128 bytes of low nibbles, 64 of top 2 bits, 16 signed scales (groups of 16), d. In part
// h (of 128), element 32k + l: low bits from ql[64h + 32(k % 2) + l] (high nibble for k >= 2), top
// bits 2k..2k+2 of qh[32h + l]; (d * sc) * (q - 32).
struct Q6_K {
    enum : int { BLOCK_BYTES = 210 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8, part = j / 4, k = j % 4;
        float d = f16_at(b + 208);
        for (int l = 0; l < 32; ++l) {
            float dl = d * (float)(int8_t)b[192 + 2 * j + l / 16];
            int low = (b[64 * part + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xf;
            int high = (b[128 + 32 * part + l] >> (2 * k)) & 3;
            out[l] = dl * (float)((low | high << 4) - 32);
        }
    }
    enum : int { ZERO = 32 };
    enum : int { HALVES = 2 };
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        int j = r % 8, part = j / 4, k4 = j % 4;
        GLOBAL const uint8_t* lows = b + 64 * part + 32 * (k4 % 2);
        for (int k = 0; k < 8; ++k) {
            uint32_t low = (uint32_t)word_at2(lows + 4 * k) >> 4 * (k4 / 2) & 0x0f0f0f0f;
            uint32_t high = (uint32_t)word_at2(b + 128 + 32 * part + 4 * k) >> 2 * k4 & 0x03030303;
            q[k] = (int)(low | high << 4);
        }
        float d = f16_at(b + 208);
        for (int h = 0; h < 2; ++h) {
            scale[h] = d * (float)(int8_t)b[192 + 2 * j + h];
            offset[h] = 0.0f;
        }
    }
};

// The 16 values of IQ4_NL's and IQ4_XS's quants (ggml's kvalues_iq4nl), and of MXFP4's, times
// 2 (its E2M1 values; kvalues_mxfp4).
TABLE int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
TABLE int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

struct Iq4Values {
    static GPU_FN int at(uint32_t n) { return IQ4_VALUES[n]; }
};
struct Mxfp4Values {
    static GPU_FN int at(uint32_t n) { return MXFP4_VALUES[n]; }
};

// The values of the nibbles at bits 0, 8, 16 and 24 of `v`, as signed bytes of a word.
template <class Values>
GPU_FN int looked_up(uint32_t v) {
    uint32_t word = 0;
    for (int i = 0; i < 4; ++i) word |= (uint32_t)(Values::at(v >> 8 * i & 0xf) & 0xff) << 8 * i;
    return (int)word;
}

// Runs of 32 values `scale * Values[q]` whose 16 bytes of nibbles (as Q4_0's) start at `qs`:
// the values, and as integers (one scale for both halves; `qs` aligned to ALIGN bytes).
template <class Values>
GPU_FN void looked_up_run(GLOBAL const uint8_t* qs, float d, PRIVATE float* out) {
    for (int j = 0; j < 16; ++j) {
        out[j] = d * (float)Values::at(qs[j] & 0xf);
        out[j + 16] = d * (float)Values::at(qs[j] >> 4);
    }
}
template <class Values, int ALIGN>
GPU_FN void looked_up_ints(GLOBAL const uint8_t* qs, float d, PRIVATE int* q,
                           PRIVATE float* scale, PRIVATE float* offset) {
    for (int k = 0; k < 4; ++k) {
        GLOBAL const uint8_t* p = qs + 4 * k;
        uint32_t v = ALIGN == 4 ? (uint32_t)word_at(p) : ALIGN == 2 ? (uint32_t)word_at2(p) : u32_at(p);
        q[k] = looked_up<Values>(v);
        q[k + 4] = looked_up<Values>(v >> 4);
    }
    scale[0] = scale[1] = d;
    offset[0] = offset[1] = 0.0f;
}

// d, 16 bytes of nibbles as Q4_0; d * IQ4_VALUES[q].
struct IQ4_NL {
    enum : int { RUN_BYTES = 18 };
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        looked_up_run<Iq4Values>(b + 2, f16_at(b), out);
    }
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        looked_up_ints<Iq4Values, 2>(b + 2, f16_at(b), q, scale, offset);
    }
};

// Super-blocks of 256 values, 8 runs each: d, 2 bytes of the scales' top 2 bits (bits 2j..2j+2:
// run j's), 4 bytes of their low 4 (byte j / 2, the low nibble for even j), and each run's 16
// bytes of nibbles as Q4_0's; (d * (scale - 32)) * IQ4_VALUES[q].
struct IQ4_XS {
    enum : int { BLOCK_BYTES = 136 };
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN float run_scale(GLOBAL const uint8_t* b, int j) {
        int low = b[4 + j / 2] >> 4 * (j % 2) & 0xf, high = (int)(u16_at(b + 2) >> 2 * j & 3);
        return f16_at(b) * (float)((low | high << 4) - 32);
    }
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        looked_up_run<Iq4Values>(b + 8 + 16 * (r % 8), run_scale(b, r % 8), out);
    }
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * BLOCK_BYTES;
        looked_up_ints<Iq4Values, 4>(b + 8 + 16 * (r % 8), run_scale(b, r % 8), q, scale, offset);
    }
};

// 2^(e - 128) for an E8M0 exponent e: half of MXFP4's scale, as its doubled values want it
// (exact; the two smallest as subnormals).
GPU_FN float e8m0_half(uint32_t e) {
    return float_from_bits(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// An E8M0 exponent e, 16 bytes of nibbles as Q4_0; e8m0_half(e) * MXFP4_VALUES[q]. Runs are
// 17 bytes: their words lie at any address, read a byte at a time.
struct MXFP4 {
    enum : int { RUN_BYTES = 17 };
    enum : int { ZERO = 0 };
    enum : int { HALVES = 1 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        looked_up_run<Mxfp4Values>(b + 1, e8m0_half(b[0]), out);
    }
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + r * RUN_BYTES;
        looked_up_ints<Mxfp4Values, 1>(b + 1, e8m0_half(b[0]), q, scale, offset);
    }
};

// The IQ1, IQ2, IQ3 and ternary formats: super-blocks of 256 values, small integers (codebook
// entries with signs; 8 * entry ± 1 for IQ1; -1, 0 or 1 for the ternary ones) times an
// integer scale per group of 16, times d * unit. Grid<F> is format F's run and ints, where F
// gives BLOCK_BYTES, unit(), d(b) and chunk(b, c, q, scales): the 32 integers of run c of the
// block at b as signed bytes of 8 words, and its two groups' scales. (A template around each
// format rather than a base class: Metal has no derived classes.) The values are exact in f32
// (at most 22 significant bits), so they are ggml's whatever the order of the multiplies.
template <class F>
struct Grid {
    enum : int { ZERO = 0 };
    enum : int { HALVES = 2 };
    static GPU_FN void run(GLOBAL const uint8_t* row, int r, PRIVATE float* out) {
        GLOBAL const uint8_t* b = row + (r / 8) * F::BLOCK_BYTES;
        int q[8], s[2];
        F::chunk(b, r % 8, q, s);
        float unit = F::d(b) * F::unit();
        for (int i = 0; i < 32; ++i) {
            float dl = unit * (float)s[i / 16];
            out[i] = dl * (float)(int8_t)(q[i / 4] >> 8 * (i % 4));
        }
    }
    static GPU_FN void ints(GLOBAL const uint8_t* row, int r, PRIVATE int* q, PRIVATE float* scale, PRIVATE float* offset) {
        GLOBAL const uint8_t* b = row + (r / 8) * F::BLOCK_BYTES;
        int s[2];
        F::chunk(b, r % 8, q, s);
        float unit = F::d(b) * F::unit();
        for (int h = 0; h < 2; ++h) {
            scale[h] = unit * (float)s[h];
            offset[h] = 0.0f;
        }
    }
};

// The four bytes of `magnitudes` (each at least 1), negated where bit j of `signs` is set.
GPU_FN int signed_bytes(uint32_t magnitudes, uint32_t signs) {
    // Bit j to bit 8j, then 0xff in those bytes: (v ^ 0xff) + 1 is -v, with no carry out.
    uint32_t mask = ((signs & 0xf) * 0x00204081u & 0x01010101u) * 0xffu;
    return (int)((magnitudes ^ mask) + (mask & 0x01010101u));
}

// The 8 signs of 7-bit sign index i of the IQ2 and IQ3 formats (ggml's ksigns_iq2xs): the
// seven bits and an eighth that makes their count even.
GPU_FN uint32_t ksigns(uint32_t i) {
    uint32_t parity = i ^ i >> 4;
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return i | (parity & 1) << 7;
}

// Values 8k..8k + 8 of a run: entry `e` of an 8-value codebook with 8 sign bits, as q[2k] and
// q[2k + 1].
#define SIGNED_ENTRY(q, k, grid, e, signs)                              \
    do {                                                                \
        q[2 * (k)] = signed_bytes(grid[2 * (e)], (signs));              \
        q[2 * (k) + 1] = signed_bytes(grid[2 * (e) + 1], (signs) >> 4); \
    } while (0)

// The odd scale 2s + 1 of a 4-bit s.
GPU_FN int odd_scale(uint32_t s) { return 2 * (int)(s & 0xf) + 1; }

// d, and per run of 32 a u64: four indices of IQ2XXS_GRID (bytes 0..4), then four 7-bit sign
// indices and the run's scale s in the top 4 bits; (d * (2s + 1) / 8) * grid * sign.
struct Iq2Xxs {
    enum : int { BLOCK_BYTES = 66 };
    static GPU_FN float unit() { return 0.125f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        GLOBAL const uint8_t* g = b + 2 + 8 * c;
        uint32_t indices = (uint32_t)word_at2(g), aux = (uint32_t)word_at2(g + 4);
        for (int l = 0; l < 4; ++l) {
            SIGNED_ENTRY(q, l, IQ2XXS_GRID, indices >> 8 * l & 0xff, ksigns(aux >> 7 * l & 127));
        }
        scales[0] = scales[1] = odd_scale(aux >> 28);
    }
};

// d, 32 u16 of a 9-bit index of IQ2XS_GRID and a 7-bit sign index each (8 values), and a
// 4-bit scale s per group of 16 (nibbles, low first); (d * (2s + 1) / 8) * grid * sign.
struct Iq2Xs {
    enum : int { BLOCK_BYTES = 74 };
    static GPU_FN float unit() { return 0.125f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        for (int l = 0; l < 4; ++l) {
            uint32_t v = half_at(b + 2 + 2 * (4 * c + l));
            SIGNED_ENTRY(q, l, IQ2XS_GRID, v & 511, ksigns(v >> 9));
        }
        scales[0] = odd_scale(b[66 + c]);
        scales[1] = odd_scale(b[66 + c] >> 4);
    }
};

// d, 32 low bytes of 10-bit indices of IQ2S_GRID (8 values), 32 bytes of signs (bit j: value
// j's), 8 bytes of the indices' top 2 bits (bits 2l..2l + 2 of byte k / 4: index k's), and
// scales as IQ2_XS's.
struct Iq2S {
    enum : int { BLOCK_BYTES = 82 };
    static GPU_FN float unit() { return 0.125f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        for (int l = 0; l < 4; ++l) {
            int k = 4 * c + l;
            uint32_t index = b[2 + k] | (uint32_t)(b[66 + c] >> 2 * l & 3) << 8;
            SIGNED_ENTRY(q, l, IQ2S_GRID, index, (uint32_t)b[34 + k]);
        }
        scales[0] = odd_scale(b[74 + c]);
        scales[1] = odd_scale(b[74 + c] >> 4);
    }
};

// d, 64 indices of IQ3XXS_GRID (4 values each), and per run of 32 a u32 of four 7-bit sign
// indices (one per 8 values) and the run's scale s in the top 4 bits;
// (d * (2s + 1) / 4) * grid * sign.
struct Iq3Xxs {
    enum : int { BLOCK_BYTES = 98 };
    static GPU_FN float unit() { return 0.25f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        uint32_t aux = (uint32_t)word_at2(b + 66 + 4 * c);
        for (int k = 0; k < 8; ++k) {
            uint32_t signs = ksigns(aux >> 7 * (k / 2) & 127) >> 4 * (k % 2);
            q[k] = signed_bytes(IQ3XXS_GRID[b[2 + 8 * c + k]], signs);
        }
        scales[0] = scales[1] = odd_scale(aux >> 28);
    }
};

// d, 64 low bytes of 9-bit indices of IQ3S_GRID (4 values), 8 bytes of their ninth bits (bit
// j % 8 of byte j / 8: index j's), 32 bytes of signs (bit e % 8 of byte e / 8: value e's), and
// a 4-bit scale s per run (nibbles, low first); (d * (2s + 1)) * grid * sign.
struct Iq3S {
    enum : int { BLOCK_BYTES = 110 };
    static GPU_FN float unit() { return 1.0f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        for (int k = 0; k < 8; ++k) {
            uint32_t index = b[2 + 8 * c + k] | (uint32_t)(b[66 + c] >> k & 1) << 8;
            q[k] = signed_bytes(IQ3S_GRID[index], (uint32_t)b[74 + 4 * c + k / 2] >> 4 * (k % 2));
        }
        scales[0] = scales[1] = odd_scale(b[106 + c / 2] >> 4 * (c % 2));
    }
};

// The IQ1 formats' runs: entry l (8 values) of IQ1S_GRID is byte l of the run's u32 of
// indices' low bytes with bits STRIDE * l..STRIDE * l + 3 of its u16 `high` above them; each
// value is 8 * grid ± 1, negative where bit 4l + 3 of `negative` is set.
template <int STRIDE>
GPU_FN void iq1_chunk(uint32_t low, uint32_t high, uint32_t negative, PRIVATE int* q) {
    for (int l = 0; l < 4; ++l) {
        uint32_t index = (low >> 8 * l & 0xff) | (high >> STRIDE * l & 7) << 8;
        int shift = negative >> (4 * l + 3) & 1 ? -1 : 1;
        for (int w = 0; w < 2; ++w) {
            uint32_t grid = IQ1S_GRID[2 * index + w], word = 0;
            for (int i = 0; i < 4; ++i) {
                int v = 8 * (int)(int8_t)(grid >> 8 * i) + shift;
                word |= (uint32_t)(v & 0xff) << 8 * i;
            }
            q[2 * l + w] = (int)word;
        }
    }
}

// d, 32 low bytes of 11-bit indices of IQ1S_GRID, and per run of 32 a u16: the four indices'
// top 3 bits (bits 3l..3l + 3), the run's scale s (bits 12..15) and the sign of its shift
// (bit 15); (d * (2s + 1) / 8) * (8 * grid ± 1).
struct Iq1S {
    enum : int { BLOCK_BYTES = 50 };
    static GPU_FN float unit() { return 0.125f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        uint32_t high = half_at(b + 34 + 2 * c);
        iq1_chunk<3>((uint32_t)word_at2(b + 2 + 4 * c), high, high & 0x8000 ? 0x8888 : 0, q);
        scales[0] = scales[1] = odd_scale(high >> 12 & 7);
    }
};

// 32 low bytes of 11-bit indices of IQ1S_GRID, 16 bytes of a nibble per index (its top 3 bits,
// and in bit 3 the sign of its shift), and four u16 of 3-bit group scales s (bits 0..12) whose
// top nibbles hold the block's f16 d; (d * (2s + 1) / 8) * (8 * grid ± 1).
struct Iq1M {
    enum : int { BLOCK_BYTES = 56 };
    static GPU_FN float unit() { return 0.125f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) {
        uint32_t s0 = half_at(b + 48), s1 = half_at(b + 50), s2 = half_at(b + 52);
        uint32_t s3 = half_at(b + 54);
        uint32_t bits = s0 >> 12 | (s1 >> 8 & 0x00f0) | (s2 >> 4 & 0x0f00) | (s3 & 0xf000);
        return f16_to_f32((uint16_t)bits);
    }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        uint32_t high = half_at(b + 32 + 2 * c);
        iq1_chunk<4>((uint32_t)word_at(b + 4 * c), high, high, q);
        uint32_t sc = half_at(b + 48 + 2 * (c / 2));
        for (int h = 0; h < 2; ++h) {
            int g = 2 * c + h;
            scales[h] = odd_scale(sc >> 3 * (g % 4) & 7);
        }
    }
};

// 48 bytes of five base-3 digits each and 4 of four, then d: value e is a digit t of a byte, as
// the fixed-point fraction of 3^5 it is (digit n of byte x: (x * 3^n mod 256) * 3 >> 8), and
// d * (t - 1). Bytes 0..32 hold values n * 32 + m (digit n of byte m), bytes 32..48 values
// 160 + 16n + m, the last 4 values 240 + 4n + m.
struct Tq1_0 {
    enum : int { BLOCK_BYTES = 54 };
    static GPU_FN float unit() { return 1.0f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b + 52); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        for (int k = 0; k < 8; ++k) {
            uint32_t word = 0;
            for (int i = 0; i < 4; ++i) {
                int e = 32 * c + 4 * k + i, byte, n;
                if (e < 160) {
                    byte = e % 32, n = e / 32;
                } else if (e < 240) {
                    byte = 32 + (e - 160) % 16, n = (e - 160) / 16;
                } else {
                    byte = 48 + (e - 240) % 4, n = (e - 240) / 4;
                }
                uint32_t power = n == 0 ? 1 : n == 1 ? 3 : n == 2 ? 9 : n == 3 ? 27 : 81;
                int t = (int)(((b[byte] * power & 0xff) * 3) >> 8);
                word |= (uint32_t)((t - 1) & 0xff) << 8 * i;
            }
            q[k] = (int)word;
        }
        scales[0] = scales[1] = 1;
    }
};

// 64 bytes of 2-bit digits t, then d: byte 32h + m holds value 128h + 32l + m at bits
// 2l..2l + 2; d * (t - 1).
struct Tq2_0 {
    enum : int { BLOCK_BYTES = 66 };
    static GPU_FN float unit() { return 1.0f; }
    static GPU_FN float d(GLOBAL const uint8_t* b) { return f16_at(b + 64); }
    static GPU_FN void chunk(GLOBAL const uint8_t* b, int c, PRIVATE int* q, PRIVATE int* scales) {
        GLOBAL const uint8_t* qs = b + 32 * (c / 4);
        for (int k = 0; k < 8; ++k) {
            uint32_t digits = (uint32_t)word_at2(qs + 4 * k) >> 2 * (c % 4) & 0x03030303u;
            // One less in every byte: each with its top bit set first, so that no byte borrows.
            q[k] = (int)(((digits | 0x80808080u) - 0x01010101u) ^ 0x80808080u);
        }
        scales[0] = scales[1] = 1;
    }
};

// The activations of the integer products (CUDA's matvec.cu, tiles.cu): each run of 32 values of a
// row as signed bytes q (x ≈ d * q), and beside the bytes, the run's d and the sums of q over
// its two halves of 16 (the quantize_q8 kernel).
struct Q8Run {
    float d;
    int sums[2];
    int unused;
};

// The KV page formats: each position of a head is a row of `row_bytes(head_dim)` bytes.
// f16 values.
struct KvF16 {
    static GPU_FN int row_bytes(int head_dim) { return 2 * head_dim; }
    static GPU_FN float at(GLOBAL const uint8_t* row, int d) { return f16_at(row + 2 * d); }
    static GPU_FN void store(GLOBAL const float* x, int head_dim, GLOBAL uint8_t* row) {
        for (int d = 0; d < head_dim; ++d) {
            uint16_t h = f32_to_f16(x[d]);
            row[2 * d] = (uint8_t)h;
            row[2 * d + 1] = (uint8_t)(h >> 8);
        }
    }
};

// Q8_0 blocks of 32 values, rounded as ggml's quantize_row_q8_0_ref: d = max|x| / 127 (as
// f16), q = round(x / d).
struct KvQ8_0 {
    static GPU_FN int row_bytes(int head_dim) { return head_dim / 32 * 34; }
    static GPU_FN float at(GLOBAL const uint8_t* row, int d) {
        GLOBAL const uint8_t* b = row + d / 32 * 34;
        return (float)(int8_t)b[2 + d % 32] * f16_at(b);
    }
    static GPU_FN void store(GLOBAL const float* x, int head_dim, GLOBAL uint8_t* row) {
        for (int i = 0; i < head_dim / 32; ++i) {
            GLOBAL const float* v = x + 32 * i;
            GLOBAL uint8_t* b = row + 34 * i;
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            uint16_t h = f32_to_f16(d);
            b[0] = (uint8_t)h;
            b[1] = (uint8_t)(h >> 8);
            for (int j = 0; j < 32; ++j) b[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
        }
    }
};

#define FOR_EACH_KV_FORMAT(X) \
    X(f16, KvF16)             \
    X(q8_0, KvQ8_0)

// The quantized formats, for the integer products (CUDA's matvec.cu): X(name, Format).
#define FOR_EACH_QUANTIZED_FORMAT(X) \
    X(q4_0, Q4_0)                    \
    X(q4_1, Q4_1)                    \
    X(q5_0, Q5_0)                    \
    X(q5_1, Q5_1)                    \
    X(q8_0, Q8_0)                    \
    X(q2_k, Q2_K)                    \
    X(q3_k, Q3_K)                    \
    X(q4_k, Q4_K)                    \
    X(q5_k, Q5_K)                    \
    X(q6_k, Q6_K)                    \
    X(iq4_nl, IQ4_NL)                \
    X(iq4_xs, IQ4_XS)                \
    X(mxfp4, MXFP4)                  \
    X(iq2_xxs, Grid<Iq2Xxs>)         \
    X(iq2_xs, Grid<Iq2Xs>)           \
    X(iq2_s, Grid<Iq2S>)             \
    X(iq3_xxs, Grid<Iq3Xxs>)         \
    X(iq3_s, Grid<Iq3S>)             \
    X(iq1_s, Grid<Iq1S>)             \
    X(iq1_m, Grid<Iq1M>)             \
    X(tq1_0, Grid<Tq1_0>)            \
    X(tq2_0, Grid<Tq2_0>)

// Every format, for kernels instantiated once per format: X(name, Format).
#define FOR_EACH_FORMAT(X) \
    X(f32, F32)            \
    X(f16, F16)            \
    X(bf16, BF16)          \
    FOR_EACH_QUANTIZED_FORMAT(X)
