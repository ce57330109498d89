// KV pages of Q8_0 blocks: a position's row of a head is head_dim / 32 blocks of an f16 scale
// d and 32 signed bytes (value d * q). Read through the kernel's `page_word`.

fn kv_row_bytes(head_dim: u32) -> u32 {
    return head_dim / 32u * 34u;
}

// Value `d` of the row at byte `row` (rows start at even bytes).
fn kv_at(row: u32, d: u32) -> f32 {
    let b = row + d / 32u * 34u;
    let scale = unpack2x16float((page_word(b >> 2u) >> ((b & 2u) * 8u)) & 0xffffu).x;
    let q = b + 2u + d % 32u;
    let byte = (page_word(q >> 2u) >> ((q & 3u) * 8u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u) * scale;
}
