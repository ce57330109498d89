// RoPE: rotates pair i of every head of each token's row by the angle whose cosine and sine
// (times the RoPE's magnitude) are angles[token][i]. Interleaved pairs (2i, 2i + 1), or halves
// (i, i + pairs). One invocation per (token, head, pair).

struct Params {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    pairs: u32,
    // 0: interleaved, 1: halves.
    halves: u32,
    stride_x: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> angles: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.stride_x;
    if (i >= p.tokens * p.heads * p.pairs) {
        return;
    }
    let pair = i % p.pairs;
    let head = (i / p.pairs) % p.heads;
    let token = i / (p.pairs * p.heads);
    let base = (token * p.heads + head) * p.head_dim;
    var a = base + 2u * pair;
    var b = a + 1u;
    if (p.halves == 1u) {
        a = base + pair;
        b = a + p.pairs;
    }
    let cs = (token * p.pairs + pair) * 2u;
    let c = angles[cs];
    let s = angles[cs + 1u];
    let xa = x[a];
    let xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
}
