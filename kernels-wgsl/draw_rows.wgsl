// The greedy token of each row of `x` (rows of `width` logits) into ids (one block per row),
// as the host's argmax picks it: the index of the largest value, the first on ties, NaN never
// the largest (the last index where every value is NaN). This backend's draws at a
// temperature are the host's (`draws` and `weights` are not read).

struct Params {
    x: u32, width: u32, draws: u32, weights: u32, ids: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> draws: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> reduce_u32: array<u32, 256>;

// A key that orders values as floats (-0 as +0), from 1 up; NaN never gets one (callers skip
// it), so 0 means no value.
fn key(v: f32) -> u32 {
    var bits = bitcast<u32>(v);
    if (bits == 0x80000000u) {
        bits = 0u;
    }
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

// The largest (`largest`) or smallest of every invocation's `v`, in every invocation.
fn block_u32(tid: u32, v: u32, largest: bool) -> u32 {
    workgroupBarrier();
    reduce_u32[tid] = v;
    workgroupBarrier();
    for (var half = 128u; half > 0u; half /= 2u) {
        if (tid < half && tid + half < BLOCK) {
            let a = reduce_u32[tid];
            let b = reduce_u32[tid + half];
            reduce_u32[tid] = select(min(a, b), max(a, b), largest);
        }
        workgroupBarrier();
    }
    return reduce_u32[0];
}

const NONE: u32 = 0xffffffffu;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let row = block_id(wid, n).x;
    if (row >= p.grid_x) {
        return;
    }
    let start = p.x / 4u + row * p.width;
    var best = 0u;
    var index = NONE;
    // Each invocation's indices rise, so only a larger value replaces its best.
    for (var i = tid; i < p.width; i += BLOCK) {
        let v = x[start + i];
        if (!is_nan(v) && key(v) > best) {
            best = key(v);
            index = i;
        }
    }
    let top = block_u32(tid, best, true);
    var token = block_u32(tid, select(NONE, index, best == top), false);
    if (token == NONE) {
        token = p.width - 1u;
    }
    if (tid == 0u) {
        ids[p.ids / 4u + row] = token;
    }
}
