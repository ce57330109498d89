// Q4_0: f16 scale d, 16 bytes of nibbles; value j is d * (low nibble of byte j - 8), value
// j + 16 the high nibble's.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 18u;
    let d = f16_at(b);
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = d * (f32(byte & 0xfu) - 8.0);
            out[4u * w + i + 16u] = d * (f32(byte >> 4u) - 8.0);
        }
    }
    return out;
}
