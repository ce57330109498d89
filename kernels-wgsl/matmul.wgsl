// y = x · wᵀ for the `n` tokens of x (products.wgsl): block (b, i) takes rows 8b.. and tokens
// 8i...

struct Params {
    w: u32, x: u32, y: u32, rows: u32, cols: u32, row_bytes: u32, n: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    let first = b.y * TOKENS;
    var rows: array<u32, 8>;
    for (var t = 0u; t < TOKENS; t++) {
        rows[t] = first + t;
    }
    multiply(p.w, b.x, tid, min(p.n - first, TOKENS), rows, rows);
}
