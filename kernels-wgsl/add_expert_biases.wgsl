// Each of the `n` values of the pairs' rows (`width` each) plus its pair's expert's bias
// (`biases`: every expert's, `width` each).

struct Params {
    rows: u32, biases: u32, chosen: u32, n: u32, width: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> rows: array<f32>;
@group(0) @binding(1) var<storage, read_write> biases: array<f32>;
@group(0) @binding(2) var<storage, read_write> chosen: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = block_id(wid, n).x * BLOCK + tid;
    if (i < p.n) {
        let expert = chosen[p.chosen / 4u + i / p.width];
        rows[p.rows / 4u + i] += biases[p.biases / 4u + expert * p.width + i % p.width];
    }
}
