// Rotary position embedding: rotates each head (`head_dim` values, `row_len / head_dim` heads
// a row) of each token's row of `x` (one block per token) by the token's angles: `angles`
// holds, per token, a cosine and a sine for each of `pairs` rotated pairs (scaled, as the
// host's Rope::angles gives them). Pair `q` is dimensions (2q, 2q + 1) where `halves` is 0,
// (q, q + pairs) otherwise; dimensions past the pairs are kept.

struct Params {
    x: u32, angles: u32, row_len: u32, head_dim: u32, pairs: u32, halves: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> angles: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let t = block_id(wid, n).x;
    if (t >= p.grid_x) {
        return;
    }
    let row = p.x / 4u + t * p.row_len;
    let cs = p.angles / 4u + t * 2u * p.pairs;
    let heads = p.row_len / p.head_dim;
    for (var i = tid; i < heads * p.pairs; i += BLOCK) {
        let h = row + (i / p.pairs) * p.head_dim;
        let pair = i % p.pairs;
        let a = h + select(2u * pair, pair, p.halves != 0u);
        let b = h + select(2u * pair + 1u, pair + p.pairs, p.halves != 0u);
        let c = angles[cs + 2u * pair];
        let s = angles[cs + 2u * pair + 1u];
        let va = x[a];
        let vb = x[b];
        x[a] = va * c - vb * s;
        x[b] = va * s + vb * c;
    }
}
