// out[t] = row ids[t] of the table (rows first_row .. first_row + rows of it are in this
// binding, from its row weight_row on), dequantized, times scale. One invocation per run of 32 values of a token.

struct Params {
    rows: u32,
    cols: u32,
    tokens: u32,
    row_bytes: u32,
    first_row: u32,
    scale: f32,
    stride_x: u32,
    weight_row: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.stride_x;
    let chunks = p.cols / 32u;
    let c = i % chunks;
    let t = i / chunks;
    if (t >= p.tokens) {
        return;
    }
    let id = ids[t];
    if (id < p.first_row || id >= p.first_row + p.rows) {
        return;
    }
    let w = dequant32((p.weight_row + id - p.first_row) * p.row_bytes, c);
    for (var i = 0u; i < 32u; i++) {
        out[t * p.cols + c * 32u + i] = w[i] * p.scale;
    }
}
