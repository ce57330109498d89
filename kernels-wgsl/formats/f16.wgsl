// F16: 2 bytes a value.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 64u;
    for (var i = 0u; i < 16u; i++) {
        let pair = unpack2x16float(word_at(b + 4u * i));
        out[2u * i] = pair.x;
        out[2u * i + 1u] = pair.y;
    }
    return out;
}
