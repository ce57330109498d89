// IQ2_XS: super-blocks of 256 values: f16 d, 32 u16 of a 9-bit index of IQ2XS_GRID (8 values)
// and a 7-bit sign index each, and a 4-bit scale s per group of 16 (nibbles, low first);
// value (d * (2s + 1) / 8) * grid * sign.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 74u;
    let c = chunk % 8u;
    let unit = f16_at(b) * 0.125;
    let scales = byte_at(b + 66u + c);
    for (var i = 0u; i < 32u; i++) {
        let v = word_at(b + 2u + 2u * (4u * c + i / 8u)) & 0xffffu;
        let dl = unit * odd_scale(scales >> (4u * (i / 16u)));
        out[i] = dl * signed(grid8(IQ2XS_GRID, v & 511u, i % 8u), ksign(v >> 9u, i % 8u));
    }
    return out;
}
