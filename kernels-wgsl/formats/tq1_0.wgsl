// TQ1_0: super-blocks of 256 ternary values: 48 bytes of five base-3 digits each and 4 of
// four, then f16 d. Digit n of byte x is ((x * 3^n) mod 256) * 3 >> 8 (the byte is a
// fixed-point fraction of 3^5); bytes 0..32 hold values 32n + m (digit n of byte m), bytes
// 32..48 values 160 + 16n + m, bytes 48..52 values 240 + 4n + m; value d * (t - 1).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + (chunk / 8u) * 54u;
    let d = f16_at(b + 52u);
    for (var i = 0u; i < 32u; i++) {
        let e = 32u * (chunk % 8u) + i;
        var byte = e % 32u;
        var n = e / 32u;
        if (e >= 240u) {
            byte = 48u + (e - 240u) % 4u;
            n = (e - 240u) / 4u;
        } else if (e >= 160u) {
            byte = 32u + (e - 160u) % 16u;
            n = (e - 160u) / 16u;
        }
        let power = select(select(select(select(81u, 27u, n == 3u), 9u, n == 2u), 3u, n == 1u), 1u, n == 0u);
        let t = (((byte_at(b + byte) * power) & 0xffu) * 3u) >> 8u;
        out[i] = d * (f32(t) - 1.0);
    }
    return out;
}
