// Q6_K: super-blocks of 256 values: 128 bytes of low nibbles ql, 64 bytes of 2-bit high parts
// qh, 16 signed scales (one per 16 values), f16 d last. Value e of half n (128 values each),
// with e = 32k + l: low nibble of ql[64n + l + 32(k & 1)] (high nibble when k >= 2), bits
// 2k..2k+1 of qh[32n + l]; value d * scale[e / 16] * (q - 32).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 210u;
    let n = (chunk % 8u) / 4u;
    let k = chunk % 4u;
    let d = f16_at(b + 208u);
    let ql = b + 64u * n + 32u * (k & 1u);
    let qh = b + 128u + 32u * n;
    let nibble = 4u * (k / 2u);
    let scales = word_at(b + 192u + 8u * n + 2u * k);
    let d0 = d * f32(i8_of(scales, 0u));
    let d1 = d * f32(i8_of(scales, 1u));
    for (var w = 0u; w < 8u; w++) {
        let lo = word_at(ql + 4u * w);
        let hi = word_at(qh + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let q = ((lo >> (8u * i + nibble)) & 0xfu) | (((hi >> (8u * i + 2u * k)) & 3u) << 4u);
            let dl = select(d1, d0, w < 4u);
            out[4u * w + i] = dl * (f32(q) - 32.0);
        }
    }
    return out;
}
