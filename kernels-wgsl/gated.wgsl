// gate = act(gate) * up for `n` values, as the CPU computes them: SiLU where `activation` is
// 0; GELU's tanh form (`x * sigmoid(2c(x + 0.044715 x^3))`) where 1; gpt-oss's clamped
// SwiGLU (`g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)`, `g = min(gate, 7)`) where 2.

struct Params { gate: u32, up: u32, n: u32, activation: u32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> gate: array<f32>;
@group(0) @binding(1) var<storage, read_write> up: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

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
    var x = gate[p.gate / 4u + i];
    var u = up[p.up / 4u + i];
    var z = x;
    if (p.activation == 1u) {
        z = 2.0 * 0.7978846 * (x + 0.044715 * x * x * x);
    } else if (p.activation == 2u) {
        x = min(x, 7.0);
        z = 1.702 * x;
        u = clamp(u, -7.0, 7.0) + 1.0;
    }
    gate[p.gate / 4u + i] = x / (1.0 + exp(-z)) * u;
}
