// MXFP4: an E8M0 exponent e, 16 bytes of nibbles as Q4_0's; value 2^(e - 128) * MXFP4_VALUES[q]
// (the E2M1 values, doubled).

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    let b = row + chunk * 17u;
    let e = byte_at(b);
    // 2^(e - 128), exact: the two smallest are subnormals.
    let d = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
    return looked_up32(b + 1u, d, MXFP4_VALUES);
}
