// RMSNorm of each row of `width` values of `x` (one block per row) times `gain`, into `out`
// (which may be `x`).

struct Params { x: u32, gain: u32, eps: f32, out: u32, width: u32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> gain: array<f32>;
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
    let row = p.x / 4u + b.x * p.width;
    let dst = p.out / 4u + b.x * p.width;
    var squares = 0.0;
    for (var i = tid; i < p.width; i += BLOCK) {
        squares += x[row + i] * x[row + i];
    }
    let scale = inverseSqrt(block_sum(tid, squares) / f32(p.width) + p.eps);
    for (var i = tid; i < p.width; i += BLOCK) {
        out[dst + i] = x[row + i] * scale * gain[p.gain / 4u + i];
    }
}
