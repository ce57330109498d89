// IQ1_M: super-blocks of 256 values: 32 low bytes of 11-bit indices of IQ1S_GRID (8 values of
// -1, 0 or 1), 16 bytes of a nibble per index (its top 3 bits, and in bit 3 the sign of its
// shift), and four u16 of 3-bit group scales s (bits 0..11) whose top nibbles hold the
// block's f16 d; value (d * (2s + 1) / 8) * (8 * grid ± 1).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 56u;
    let c = chunk % 8u;
    let low = word_at(b + 4u * c);
    let high = word_at(b + 32u + 2u * c) & 0xffffu;
    let s01 = word_at(b + 48u);
    let s23 = word_at(b + 52u);
    let d_bits = ((s01 >> 12u) & 0xfu) | ((s01 >> 24u) & 0xf0u) | ((s23 >> 4u) & 0xf00u)
        | ((s23 >> 16u) & 0xf000u);
    let unit = unpack2x16float(d_bits).x * 0.125;
    // The u16 of scales that holds groups 2c and 2c + 1.
    let scales = (word_at(b + 48u + 2u * (c / 2u)) & 0xffffu);
    for (var i = 0u; i < 32u; i++) {
        let l = i / 8u;
        let e = ((low >> (8u * l)) & 0xffu) | (((high >> (4u * l)) & 7u) << 8u);
        let shift = select(1, -1, ((high >> (4u * l + 3u)) & 1u) != 0u);
        let g = 2u * c + i / 16u;
        let dl = unit * odd_scale((scales >> (3u * (g % 4u))) & 7u);
        out[i] = dl * f32(8 * grid8(IQ1S_GRID, e, i % 8u) + shift);
    }
    return out;
}
