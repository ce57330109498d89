// The KV pages of one layer slot: K then V, each [KV head][page][position][head_dim] of f16,
// two to a word.

struct Params {
    tokens: u32,
    n_head_kv: u32,
    head_dim: u32,
    page_size: u32,
    n_pages: u32,
    stride_x: u32,
}

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
// (page, position in the page) of each token.
@group(0) @binding(2) var<storage, read> slots: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> pages: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

// Writes two values of each token's keys and values: one invocation per (token, pair).
@compute @workgroup_size(64)
fn write(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_dim = p.head_dim / 2u;
    let kv_pairs = p.n_head_kv * half_dim;
    let i = gid.x + gid.y * p.stride_x;
    if (i >= p.tokens * kv_pairs) {
        return;
    }
    let token = i / kv_pairs;
    let head = (i % kv_pairs) / half_dim;
    let pair = i % half_dim;
    let slot = slots[token];
    let row = token * p.n_head_kv * p.head_dim + head * p.head_dim + 2u * pair;
    let at = ((head * p.n_pages + slot.x) * p.page_size + slot.y) * half_dim + pair;
    let kind = p.n_head_kv * p.n_pages * p.page_size * half_dim;
    pages[at] = pack2x16float(vec2<f32>(k[row], k[row + 1u]));
    pages[kind + at] = pack2x16float(vec2<f32>(v[row], v[row + 1u]));
}
