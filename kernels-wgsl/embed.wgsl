// Embedding: row ids[t] of `w` (rows of `row_bytes`, `cols` values, in the format whose
// `dequant32` comes before) times `scale`, into row t of `out` (one block per id).

struct Params {
    w: u32, ids: u32, cols: u32, row_bytes: u32, scale: f32, out: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let t = block_id(wid, n).x;
    if (t >= p.grid_x) {
        return;
    }
    let row = p.w + ids[p.ids / 4u + t] * p.row_bytes;
    let dst = p.out / 4u + t * p.cols;
    for (var r = tid; r < p.cols / 32u; r += BLOCK) {
        let values = dequant32(row, r);
        for (var i = 0u; i < 32u; i++) {
            out[dst + 32u * r + i] = values[i] * p.scale;
        }
    }
}
