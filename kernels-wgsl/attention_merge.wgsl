// Out row t = tokens[x] (head h) from the n_splits partial results of attention.wgsl's blocks
// (x, h, z): each split's sum and outputs rescaled to the largest maximum, a sink joining the
// sum as there. Block (x, h) of 128 invocations.

struct Params {
    partials: u32, out: u32, n_head: u32, head_dim: u32, n_splits: u32, sinks: u32,
    has_sinks: u32, tokens: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> sinks: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

// Below every score: WGSL has no infinities in constants.
const NEG_INF: f32 = -3.0e38;

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
    let t = tokens[p.tokens / 4u + b.x];
    let h = b.y;
    let width = p.head_dim + 2u;
    let part = p.partials / 4u + (b.x * p.n_head + h) * p.n_splits * width;
    let sink = select(NEG_INF, sinks[p.sinks / 4u + h], p.has_sinks != 0u);
    var m = sink;
    for (var z = 0u; z < p.n_splits; z++) {
        m = max(m, partials[part + z * width]);
    }
    var sum = select(0.0, exp(sink - m), p.has_sinks != 0u);
    for (var z = 0u; z < p.n_splits; z++) {
        let split = part + z * width;
        if (partials[split + 1u] > 0.0) {
            sum += partials[split + 1u] * exp(partials[split] - m);
        }
    }
    for (var d = tid; d < p.head_dim; d += BLOCK) {
        var value = 0.0;
        for (var z = 0u; z < p.n_splits; z++) {
            let split = part + z * width;
            if (partials[split + 1u] > 0.0) {
                value += partials[split + 2u + d] * exp(partials[split] - m);
            }
        }
        out[p.out / 4u + (t * p.n_head + h) * p.head_dim + d] = value / sum;
    }
}
