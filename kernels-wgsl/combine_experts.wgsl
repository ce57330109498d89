// Each of the `n` values of the output (rows of `width`): the weighted sum of its token's
// `top_k` pairs' values.

struct Params {
    out: u32, rows: u32, weights: u32, n: u32, width: u32, top_k: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> rows: array<f32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = block_id(wid, n).x * BLOCK + tid;
    if (i >= p.n) {
        return;
    }
    let t = i / p.width;
    let c = i % p.width;
    var sum = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        let pair = t * p.top_k + j;
        sum += weights[p.weights / 4u + pair] * rows[p.rows / 4u + pair * p.width + c];
    }
    out[p.out / 4u + i] = sum;
}
