// IQ4_XS: super-blocks of 256 values in 8 sub-blocks of 32: f16 d, 2 bytes of the sub-blocks'
// scales' top 2 bits (bits 2j..2j+1: sub-block j's), 4 bytes of their low 4 bits (byte j / 2,
// the low nibble for even j), and each sub-block's 16 bytes of nibbles as Q4_0's; value
// (d * (scale - 32)) * IQ4_VALUES[q].

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    let b = row + (chunk / 8u) * 136u;
    let j = chunk % 8u;
    let low = (byte_at(b + 4u + j / 2u) >> (4u * (j & 1u))) & 0xfu;
    let high = (word_at(b + 2u) >> (2u * j)) & 3u;
    let dl = f16_at(b) * (f32(low | (high << 4u)) - 32.0);
    return looked_up32(b + 8u + 16u * j, dl, IQ4_VALUES);
}
