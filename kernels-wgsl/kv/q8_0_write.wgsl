// Storing a row of Q8_0 blocks (kv/q8_0_read.wgsl), rounded as ggml's quantize_row_q8_0_ref:
// d = max|x| / 127 (as f16), q = round(x / d); through kv_write.wgsl's `store_byte`.

fn kv_store(values: ptr<function, array<f32, 256>>, head_dim: u32, row: u32) {
    for (var i = 0u; i < head_dim / 32u; i++) {
        let b = row + 34u * i;
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            amax = max(amax, abs((*values)[32u * i + j]));
        }
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d != 0.0);
        let h = f32_to_f16(d);
        store_byte(b, h & 0xffu);
        store_byte(b + 1u, h >> 8u);
        for (var j = 0u; j < 32u; j++) {
            let q = i32(round_away((*values)[32u * i + j] * id));
            store_byte(b + 2u + j, bitcast<u32>(q) & 0xffu);
        }
    }
}
