// IQ4_NL: f16 scale d, 16 bytes of nibbles as Q4_0's; value d * IQ4_VALUES[q].

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    let b = row + chunk * 18u;
    return looked_up32(b + 2u, f16_at(b), IQ4_VALUES);
}
