// y = x · wᵀ for the `n` tokens of x in tiles (products_tiles.wgsl): block (i, b) takes tokens
// 32i.. and rows 64b...

struct Params {
    w: u32, x: u32, y: u32, rows: u32, cols: u32, row_bytes: u32, n: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    let first = b.x * TILE_TOKENS;
    var rows: array<u32, 32>;
    for (var t = 0u; t < TILE_TOKENS; t++) {
        rows[t] = first + t;
    }
    multiply_tile(p.w, b.y * TILE_ROWS, tid, min(p.n - first, TILE_TOKENS), rows, rows);
}
