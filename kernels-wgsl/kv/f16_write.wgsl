// Storing a row of f16 values (kv/f16_read.wgsl), through kv_write.wgsl's `store_byte`.

fn kv_store(values: ptr<function, array<f32, 256>>, head_dim: u32, row: u32) {
    for (var d = 0u; d < head_dim; d++) {
        let h = f32_to_f16((*values)[d]);
        store_byte(row + 2u * d, h & 0xffu);
        store_byte(row + 2u * d + 1u, h >> 8u);
    }
}
