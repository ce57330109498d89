// Row rows[i] of `x` (rows of `width`) into row i of `out`. One block per row.

struct Params { x: u32, rows: u32, out: u32, width: u32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> rows: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    let src = p.x / 4u + rows[p.rows / 4u + b.x] * p.width;
    for (var i = tid; i < p.width; i += BLOCK) {
        out[p.out / 4u + b.x * p.width + i] = x[src + i];
    }
}
