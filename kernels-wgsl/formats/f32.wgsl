// F32: 4 bytes a value.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 128u;
    for (var i = 0u; i < 32u; i++) {
        out[i] = bitcast<f32>(word_at(b + 4u * i));
    }
    return out;
}
