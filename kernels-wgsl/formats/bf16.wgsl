// BF16: 2 bytes a value, the high half of an f32.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 64u;
    for (var i = 0u; i < 16u; i++) {
        let pair = word_at(b + 4u * i);
        out[2u * i] = bitcast<f32>(pair << 16u);
        out[2u * i + 1u] = bitcast<f32>(pair & 0xffff0000u);
    }
    return out;
}
