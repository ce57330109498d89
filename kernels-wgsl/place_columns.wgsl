// Row t's `width` values of `x` into columns first.. of row t of `out` (rows of `out_width`),
// for `n` values: the products of one part of a matrix cut into parts.

struct Params {
    x: u32, out: u32, n: u32, width: u32, out_width: u32, first: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = block_id(wid, n).x * BLOCK + tid;
    if (i < p.n) {
        out[p.out / 4u + (i / p.width) * p.out_width + p.first + i % p.width] = x[p.x / 4u + i];
    }
}
