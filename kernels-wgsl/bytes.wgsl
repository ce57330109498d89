// Reading GGUF blocks as they lie in the file: `weights` holds the bytes of a tensor (padded to
// whole words), little-endian, with blocks at any byte offset (a Q4_0 block is 18 bytes).

fn byte_at(b: u32) -> u32 {
    return (weights[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

// The four bytes from `b` on, whatever its alignment.
fn word_at(b: u32) -> u32 {
    let shift = (b & 3u) << 3u;
    let lo = weights[b >> 2u];
    if (shift == 0u) {
        return lo;
    }
    return (lo >> shift) | (weights[(b >> 2u) + 1u] << (32u - shift));
}

fn f16_at(b: u32) -> f32 {
    return unpack2x16float(word_at(b) & 0xffffu).x;
}

// Byte `i` (0..3) of `w` as a signed integer.
fn i8_of(w: u32, i: u32) -> i32 {
    return bitcast<i32>(w << (24u - 8u * i)) >> 24u;
}

// d * scale and dmin * min of sub-block `j` (0..7) of the Q4_K or Q5_K super-block at `b`
// (f16 d and dmin, then the 12 bytes of 6-bit scales and mins).
fn k4_sub_scales(b: u32, j: u32) -> vec2<f32> {
    return unpack2x16float(word_at(b)) * k4_scale_min(b + 4u, j);
}

// The 6-bit scale and min of sub-block `j` (0..7) of a Q4_K or Q5_K super-block whose 12
// scale bytes start at `s`.
fn k4_scale_min(s: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(s + j) & 63u), f32(byte_at(s + j + 4u) & 63u));
    }
    let sc = (byte_at(s + j + 4u) & 0xfu) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let m = (byte_at(s + j + 4u) >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// The 16 values of IQ4_NL's and IQ4_XS's quants (ggml's kvalues_iq4nl), and of MXFP4's,
// doubled (its E2M1 values: kvalues_mxfp4).
const IQ4_VALUES = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
const MXFP4_VALUES = array<f32, 16>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

// The 32 values d * values[q] of the nibbles of the 16 bytes at `qs` (Q4_0's layout: byte j
// holds value j in its low nibble and value j + 16 in its high one).
fn looked_up32(qs: u32, d: f32, values: array<f32, 16>) -> array<f32, 32> {
    var out: array<f32, 32>;
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(qs + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = d * values[byte & 0xfu];
            out[4u * w + i + 16u] = d * values[byte >> 4u];
        }
    }
    return out;
}
