// `n` bytes from `src` to `dst`, which need not start at whole words and may lie in one
// buffer (not overlapping): the backend's copies that a buffer copy cannot make. An
// invocation per byte, stored atomically (its neighbours may share its word).

struct Params { src: u32, dst: u32, n: u32, grid_x: u32, grid_y: u32, grid_z: u32 }

@group(0) @binding(0) var<storage, read_write> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<atomic<u32>>;
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
    let at = p.src + i;
    let byte = (src[at >> 2u] >> ((at & 3u) * 8u)) & 0xffu;
    let to = p.dst + i;
    let shift = (to & 3u) * 8u;
    atomicAnd(&dst[to >> 2u], ~(0xffu << shift));
    atomicOr(&dst[to >> 2u], byte << shift);
}
