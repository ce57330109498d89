// IQ3_S: super-blocks of 256 values: f16 d, 64 low bytes of 9-bit indices of IQ3S_GRID (4
// values), 8 bytes of their ninth bits (bit j % 8 of byte j / 8: index j's), 32 bytes of signs
// (bit e % 8 of byte e / 8: value e's), and a 4-bit scale s per run (nibbles, low first);
// value (d * (2s + 1)) * grid * sign.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 110u;
    let c = chunk % 8u;
    let ninths = byte_at(b + 66u + c);
    let dl = f16_at(b) * 1.0 * odd_scale(byte_at(b + 106u + c / 2u) >> (4u * (c % 2u)));
    for (var i = 0u; i < 32u; i++) {
        let q = i / 4u;
        let e = byte_at(b + 2u + 8u * c + q) | (((ninths >> q) & 1u) << 8u);
        let negative = ((byte_at(b + 74u + 4u * c + i / 8u) >> (i % 8u)) & 1u) != 0u;
        out[i] = dl * signed(grid4(IQ3S_GRID, e, i % 4u), negative);
    }
    return out;
}
