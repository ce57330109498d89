// Q8_0: f16 scale d, 32 signed bytes; value d * q.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 34u;
    let d = f16_at(b);
    for (var w = 0u; w < 8u; w++) {
        let q = word_at(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            out[4u * w + i] = f32(i8_of(q, i)) * d;
        }
    }
    return out;
}
