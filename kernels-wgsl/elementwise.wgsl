// Element-wise operations over `n` values, one invocation each (invocation i is
// gid.x + gid.y * stride_x).

struct Params {
    n: u32,
    stride_x: u32,
    // add_bias: the bias's length; gated: 0 for SiLU, 1 for GELU-tanh, 2 for the clamped
    // SwiGLU; softcap: the cap; scale_by_sigmoid: floats a row.
    arg: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

fn index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * p.stride_x;
}

// x += y
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        x[i] += y[i];
    }
}

// x += bias, the bias repeated over each row
@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        x[i] += y[i % p.arg];
    }
}

// x = act(x) * y: SiLU, or GELU with the tanh approximation written as
// x * sigmoid(2 sqrt(2 / pi) (x + 0.044715 x^3)); or gpt-oss's clamped SwiGLU,
// g * sigmoid(1.702 g) * (clamp(y, -7, 7) + 1) with g = min(x, 7).
@compute @workgroup_size(64)
fn gated(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        var v = x[i];
        var u = y[i];
        var z = v;
        if (p.arg == 1u) {
            z = 2.0 * 0.7978846 * (v + 0.044715 * v * v * v);
        } else if (p.arg == 2u) {
            v = min(v, 7.0);
            z = 1.702 * v;
            u = clamp(u, -7.0, 7.0) + 1.0;
        }
        x[i] = v / (1.0 + exp(-z)) * u;
    }
}

// x *= sigmoid(y[row]), rows of `arg` values (a shared expert's gate).
@compute @workgroup_size(64)
fn scale_by_sigmoid(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        x[i] *= 1.0 / (1.0 + exp(-y[i / p.arg]));
    }
}

// x = cap * tanh(x / cap)
@compute @workgroup_size(64)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.n) {
        let cap = bitcast<f32>(p.arg);
        x[i] = cap * tanh(x[i] / cap);
    }
}
