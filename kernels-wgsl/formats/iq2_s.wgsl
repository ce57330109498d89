// IQ2_S: super-blocks of 256 values: f16 d, 32 low bytes of 10-bit indices of IQ2S_GRID (8
// values), 32 bytes of signs (bit j: value j's), 8 bytes of the indices' top 2 bits (bits
// 2l..2l + 1 of byte k / 4: index k's), and a 4-bit scale s per group of 16 (nibbles, low
// first); value (d * (2s + 1) / 8) * grid * sign.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 82u;
    let c = chunk % 8u;
    let unit = f16_at(b) * 0.125;
    let high = byte_at(b + 66u + c);
    let scales = byte_at(b + 74u + c);
    for (var i = 0u; i < 32u; i++) {
        let l = i / 8u;
        let k = 4u * c + l;
        let e = byte_at(b + 2u + k) | (((high >> (2u * l)) & 3u) << 8u);
        let negative = ((byte_at(b + 34u + k) >> (i % 8u)) & 1u) != 0u;
        let dl = unit * odd_scale(scales >> (4u * (i / 16u)));
        out[i] = dl * signed(grid8(IQ2S_GRID, e, i % 8u), negative);
    }
    return out;
}
