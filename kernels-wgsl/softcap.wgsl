// x = cap * tanh(x / cap) for `n` values.

struct Params { x: u32, n: u32, cap: f32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = block_id(wid, n).x * BLOCK + tid;
    if (i < p.n) {
        x[p.x / 4u + i] = p.cap * tanh(x[p.x / 4u + i] / p.cap);
    }
}
