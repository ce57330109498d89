// IQ2_XXS: super-blocks of 256 values: f16 d, then per run of 32 a u64: four indices of
// IQ2XXS_GRID (8 values each), then four 7-bit sign indices and the run's scale s in the top
// 4 bits; value (d * (2s + 1) / 8) * grid * sign.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 66u;
    let g = b + 2u + 8u * (chunk % 8u);
    let indices = word_at(g);
    let aux = word_at(g + 4u);
    let dl = f16_at(b) * 0.125 * odd_scale(aux >> 28u);
    for (var i = 0u; i < 32u; i++) {
        let l = i / 8u;
        let m = grid8(IQ2XXS_GRID, (indices >> (8u * l)) & 0xffu, i % 8u);
        out[i] = dl * signed(m, ksign((aux >> (7u * l)) & 127u, i % 8u));
    }
    return out;
}
