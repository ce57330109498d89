// Q2_K: super-blocks of 256 values: 16 bytes of 4-bit scale (low) and min (high) per group of
// 16, 64 bytes of 2-bit quants (byte l of half h holds value 128h + 32k + l at bits
// 2k..2k+2), f16 d and dmin last; value (d * scale) * q - (dmin * min).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 84u;
    let j = chunk % 8u;
    let dd = unpack2x16float(word_at(b + 80u));
    let qs = b + 16u + 32u * (j / 4u);
    let shift = 2u * (j % 4u);
    for (var h = 0u; h < 2u; h++) {
        let s = byte_at(b + 2u * j + h);
        let dl = dd.x * f32(s & 0xfu);
        let ml = dd.y * f32(s >> 4u);
        for (var w = 0u; w < 4u; w++) {
            let q = word_at(qs + 16u * h + 4u * w);
            for (var i = 0u; i < 4u; i++) {
                out[16u * h + 4u * w + i] = dl * f32((q >> (8u * i + shift)) & 3u) - ml;
            }
        }
    }
    return out;
}
