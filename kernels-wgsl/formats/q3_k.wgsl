// Q3_K: super-blocks of 256 values: 32 bytes of high bits (bit j of byte l: value 32j + l),
// 2-bit quants as Q2_K's, 12 bytes of 6-bit scales, f16 d last; value
// (d * (scale - 32)) * (q - 4 where the high bit is clear).

// The signed 6-bit scale of group `g` (0..16) of the scales at `s`.
fn q3k_scale(s: u32, g: u32) -> f32 {
    let low = (byte_at(s + g % 8u) >> (4u * (g / 8u))) & 0xfu;
    let high = (byte_at(s + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 110u;
    let j = chunk % 8u;
    let d = f16_at(b + 108u);
    let qs = b + 32u + 32u * (j / 4u);
    let shift = 2u * (j % 4u);
    for (var h = 0u; h < 2u; h++) {
        let dl = d * q3k_scale(b + 96u, 2u * j + h);
        for (var w = 0u; w < 4u; w++) {
            let q = word_at(qs + 16u * h + 4u * w);
            let hm = word_at(b + 16u * h + 4u * w);
            for (var i = 0u; i < 4u; i++) {
                let low = i32((q >> (8u * i + shift)) & 3u);
                let high = (hm >> (8u * i + j)) & 1u;
                out[16u * h + 4u * w + i] = dl * f32(select(low - 4, low, high != 0u));
            }
        }
    }
    return out;
}
