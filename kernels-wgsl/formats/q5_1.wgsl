// Q5_1: f16 scale d and min m, 32 high bits qh, 16 bytes of low nibbles (ordered as Q4_0's);
// bit j of qh is value j's fifth bit; value d * q + m.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 24u;
    let dm = unpack2x16float(word_at(b));
    let qh = word_at(b + 4u);
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(b + 8u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            let byte = (q >> (8u * i)) & 0xffu;
            let lo = (byte & 0xfu) | (((qh >> j) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            out[j] = dm.x * f32(lo) + dm.y;
            out[j + 16u] = dm.x * f32(hi) + dm.y;
        }
    }
    return out;
}
