// Each row of `width` values of `x` times the sigmoid of its row's `gates` value, for `n`
// values (a shared expert's gate).

struct Params { x: u32, gates: u32, n: u32, width: u32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> gates: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = block_id(wid, n).x * BLOCK + tid;
    if (i < p.n) {
        x[p.x / 4u + i] *= 1.0 / (1.0 + exp(-gates[p.gates / 4u + i / p.width]));
    }
}
