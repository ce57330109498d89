// TQ2_0: super-blocks of 256 ternary values: 64 bytes of 2-bit digits t, then f16 d. Byte
// 32h + m holds value 128h + 32l + m at bits 2l..2l + 1; value d * (t - 1).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 66u;
    let c = chunk % 8u;
    let d = f16_at(b + 64u);
    let qs = b + 32u * (c / 4u);
    for (var i = 0u; i < 32u; i++) {
        let t = (byte_at(qs + i) >> (2u * (c % 4u))) & 3u;
        out[i] = d * (f32(t) - 1.0);
    }
    return out;
}
