// MXFP4: an E8M0 exponent e, 16 bytes of nibbles as Q4_0's; value 2^(e - 128) * VALUES[q] (the
// E2M1 values, doubled).

const MXFP4_VALUES = array<f32, 16>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

fn dequant32(row: u32, chunk: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    let b = row + chunk * 17u;
    let e = byte_at(b);
    // 2^(e - 128), exact: the two smallest are subnormals.
    let d = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
    for (var w = 0u; w < 4u; w++) {
        let q = word_at(b + 1u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let byte = (q >> (8u * i)) & 0xffu;
            out[4u * w + i] = d * MXFP4_VALUES[byte & 0xfu];
            out[4u * w + i + 16u] = d * MXFP4_VALUES[byte >> 4u];
        }
    }
    return out;
}
