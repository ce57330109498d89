// KV pages of f16 values: a position's row of a head is 2 * head_dim bytes. Read through the
// kernel's `page_word`.

fn kv_row_bytes(head_dim: u32) -> u32 {
    return 2u * head_dim;
}

// Value `d` of the row at byte `row` (rows start at even bytes).
fn kv_at(row: u32, d: u32) -> f32 {
    let b = row + 2u * d;
    return unpack2x16float((page_word(b >> 2u) >> ((b & 2u) * 8u)) & 0xffffu).x;
}
