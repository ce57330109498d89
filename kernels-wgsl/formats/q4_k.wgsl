// Q4_K: super-blocks of 256 values in 8 sub-blocks of 32: f16 d and dmin, 12 bytes of 6-bit
// scales and mins, 128 bytes of nibbles (sub-blocks 2i and 2i + 1 are the low and high
// nibbles of bytes 32i..32i + 31); value d * scale * q - dmin * min.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 144u;
    let j = chunk % 8u;
    let sub = k4_sub_scales(b, j);
    let dl = sub.x;
    let ml = sub.y;
    let shift = 4u * (j & 1u);
    let qs = b + 16u + 32u * (j / 2u);
    for (var w = 0u; w < 8u; w++) {
        let q = word_at(qs + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            out[4u * w + i] = dl * f32((q >> (8u * i + shift)) & 0xfu) - ml;
        }
    }
    return out;
}
