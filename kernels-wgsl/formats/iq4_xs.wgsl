// IQ4_XS: super-blocks of 256 values in 8 sub-blocks of 32: f16 d, 2 bytes of the sub-blocks'
// scales' top 2 bits (bits 2j..2j+1: sub-block j's), 4 bytes of their low 4 bits (byte j / 2,
// the low nibble for even j), and each sub-block's 16 bytes of nibbles as Q4_0's; value
// (d * (scale - 32)) * IQ4_VALUES[q].

const IQ4_VALUES = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 136u;
    let j = chunk % 8u;
    let low = (byte_at(b + 4u + j / 2u) >> (4u * (j & 1u))) & 0xfu;
    let high = (word_at(b + 2u) >> (2u * j)) & 3u;
    let dl = f16_at(b) * (f32(low | (high << 4u)) - 32.0);
    let qs = b + 8u + 16u * j;
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(qs + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = dl * IQ4_VALUES[byte & 0xfu];
            out[4u * w + i + 16u] = dl * IQ4_VALUES[byte >> 4u];
        }
    }
    return out;
}
