// Q4_1: f16 scale d and min m, 16 bytes of nibbles (ordered as Q4_0's); value d * q + m.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 20u;
    let dm = unpack2x16float(word_at(b));
    let d = dm.x;
    let m = dm.y;
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(b + 4u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = d * f32(byte & 0xfu) + m;
            out[4u * w + i + 16u] = d * f32(byte >> 4u) + m;
        }
    }
    return out;
}
