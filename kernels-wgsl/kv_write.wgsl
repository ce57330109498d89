// Writing the step's keys and values into the KV pages, in the page format whose kv/*.wgsl
// come before. A layer's pages are one buffer: keys then values, each [KV head][page]
// [position] rows of the format. Token t's keys and values (rows of `n_head_kv * head_dim`
// values of `k` and `v`) go into its slot (`slots[2t]`: page, `slots[2t + 1]`: position in
// it). One block per token; an invocation per (K or V, head). Rows need not start at whole
// words (Q8_0 rows of 34 bytes), so bytes are stored one at a time, atomically.

struct Params {
    k: u32, v: u32, slots: u32, pages: u32, n_head_kv: u32, head_dim: u32, n_pages: u32,
    page_size: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> k: array<f32>;
@group(0) @binding(1) var<storage, read_write> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> pages: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> p: Params;

fn page_word(i: u32) -> u32 {
    return atomicLoad(&pages[i]);
}

fn store_byte(b: u32, value: u32) {
    let shift = (b & 3u) * 8u;
    atomicAnd(&pages[b >> 2u], ~(0xffu << shift));
    atomicOr(&pages[b >> 2u], (value & 0xffu) << shift);
}

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
    let row = p.n_head_kv * p.head_dim;
    let page = slots[p.slots / 4u + 2u * t];
    let offset = slots[p.slots / 4u + 2u * t + 1u];
    let row_bytes = kv_row_bytes(p.head_dim);
    let block = p.page_size * row_bytes;
    for (var i = tid; i < 2u * p.n_head_kv; i += BLOCK) {
        let kind = i / p.n_head_kv;
        let head = i % p.n_head_kv;
        let head_at = t * row + head * p.head_dim;
        var values: array<f32, 256>;
        for (var d = 0u; d < p.head_dim; d++) {
            values[d] = select(k[p.k / 4u + head_at + d], v[p.v / 4u + head_at + d], kind == 1u);
        }
        let at = ((kind * p.n_head_kv + head) * p.n_pages + page) * block + offset * row_bytes;
        kv_store(&values, p.head_dim, p.pages + at);
    }
}
