// IQ1_S: super-blocks of 256 values: f16 d, 32 low bytes of 11-bit indices of IQ1S_GRID (8
// values of -1, 0 or 1), and per run of 32 a u16: the four indices' top 3 bits (bits
// 3l..3l + 2), the run's scale s (bits 12..14) and the sign of its shift (bit 15); value
// (d * (2s + 1) / 8) * (8 * grid ± 1).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 50u;
    let c = chunk % 8u;
    let low = word_at(b + 2u + 4u * c);
    let high = word_at(b + 34u + 2u * c) & 0xffffu;
    let dl = f16_at(b) * 0.125 * odd_scale((high >> 12u) & 7u);
    let shift = select(1, -1, (high & 0x8000u) != 0u);
    for (var i = 0u; i < 32u; i++) {
        let l = i / 8u;
        let e = ((low >> (8u * l)) & 0xffu) | (((high >> (3u * l)) & 7u) << 8u);
        out[i] = dl * f32(8 * grid8(IQ1S_GRID, e, i % 8u) + shift);
    }
    return out;
}
