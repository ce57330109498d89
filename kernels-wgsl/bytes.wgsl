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
