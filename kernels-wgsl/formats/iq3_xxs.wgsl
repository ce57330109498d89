// IQ3_XXS: super-blocks of 256 values: f16 d, 64 indices of IQ3XXS_GRID (4 values each), and
// per run of 32 a u32 of four 7-bit sign indices (one per 8 values) and the run's scale s in
// the top 4 bits; value (d * (2s + 1) / 4) * grid * sign.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 98u;
    let c = chunk % 8u;
    let aux = word_at(b + 66u + 4u * c);
    let dl = f16_at(b) * 0.25 * odd_scale(aux >> 28u);
    for (var i = 0u; i < 32u; i++) {
        let m = grid4(IQ3XXS_GRID, byte_at(b + 2u + 8u * c + i / 4u), i % 4u);
        out[i] = dl * signed(m, ksign((aux >> (7u * (i / 8u))) & 127u, i % 8u));
    }
    return out;
}
