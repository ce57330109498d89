// What the IQ1, IQ2, IQ3 and ternary formats' dequant32 share: their codebooks (ggml's
// iq*_grid) in the buffer of bind group 1, `codebooks`, which the host declares above this
// file with the first word of each table in it (IQ2XXS_GRID and so on: codebooks.rs). Each
// entry's values are its bytes, first value lowest; an entry of 8 values is two words.

// Value j (0..8) of entry e of the codebook of 8-value entries at word `at`.
fn grid8(at: u32, e: u32, j: u32) -> i32 {
    return i8_of(codebooks[at + 2u * e + j / 4u], j % 4u);
}

// Value j (0..4) of entry e of the codebook of 4-value entries at word `at`.
fn grid4(at: u32, e: u32, j: u32) -> i32 {
    return i8_of(codebooks[at + e], j);
}

// Whether value j (0..8) of 8 values with 7-bit sign index i is negative: ggml's
// ksigns_iq2xs, the seven bits and an eighth that makes their count even.
fn ksign(i: u32, j: u32) -> bool {
    let signs = i | ((countOneBits(i) & 1u) << 7u);
    return ((signs >> j) & 1u) != 0u;
}

// Magnitude m, negative where `negative`.
fn signed(m: i32, negative: bool) -> f32 {
    return f32(select(m, -m, negative));
}

// The odd scale 2s + 1 of the low 4 bits s of `bits`.
fn odd_scale(bits: u32) -> f32 {
    return f32(2u * (bits & 0xfu) + 1u);
}
