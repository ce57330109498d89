// IQ4_NL: f16 scale d, 16 bytes of nibbles as Q4_0's; value d * IQ4_VALUES[q].

const IQ4_VALUES = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 18u;
    let d = f16_at(b);
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = d * IQ4_VALUES[byte & 0xfu];
            out[4u * w + i + 16u] = d * IQ4_VALUES[byte >> 4u];
        }
    }
    return out;
}
