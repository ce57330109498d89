// Q5_K: as Q4_K with a fifth bit per value: f16 d and dmin, 12 scale bytes, 32 bytes qh (bit j
// of byte l is the fifth bit of value l of sub-block j), 128 bytes of nibbles.

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 176u;
    let j = chunk % 8u;
    let sub = k4_sub_scales(b, j);
    let dl = sub.x;
    let ml = sub.y;
    let shift = 4u * (j & 1u);
    let qs = b + 48u + 32u * (j / 2u);
    for (var w = 0u; w < 8u; w++) {
        let q = word_at(qs + 4u * w);
        let h = word_at(b + 16u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let lo = (q >> (8u * i + shift)) & 0xfu;
            let hi = ((h >> (8u * i + j)) & 1u) << 4u;
            out[4u * w + i] = dl * f32(lo | hi) - ml;
        }
    }
    return out;
}
