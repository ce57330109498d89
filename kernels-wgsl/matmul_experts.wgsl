// A mixture of experts' products (products.wgsl): block (b, i) takes tile i of `tiles`
// (expert, first index in `pairs`, count, unused; count 0 past the last, see
// group_pairs.wgsl): its expert's weights (expert e's at `w + offsets[e]`) by the rows of x
// its pairs name (row pair / divisor), into the pairs' rows of y.

struct Params {
    w: u32, offsets: u32, x: u32, y: u32, rows: u32, cols: u32, row_bytes: u32, pairs: u32,
    tiles: u32, divisor: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(5) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(6) var<uniform> p: Params;

// An expert's offset where the launch's buffer does not hold it: its tiles are another
// launch's.
const NO_EXPERT: u32 = 0xffffffffu;

// The tile's count, or 0 where the tile is another launch's.
var<workgroup> tile_count: u32;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    let tile = p.tiles / 4u + 4u * b.y;
    if (tid == 0u) {
        let mine = offsets[p.offsets / 4u + tiles[tile]] != NO_EXPERT;
        tile_count = select(0u, tiles[tile + 2u], mine);
    }
    let count = workgroupUniformLoad(&tile_count);
    if (count == 0u) {
        return;  // the whole block
    }
    var ins: array<u32, 8>;
    var outs: array<u32, 8>;
    for (var t = 0u; t < TOKENS; t++) {
        let pair = pairs[p.pairs / 4u + tiles[tile + 1u] + min(t, count - 1u)];
        ins[t] = pair / p.divisor;
        outs[t] = pair;
    }
    let w = p.w + offsets[p.offsets / 4u + tiles[tile]];
    multiply(w, b.x, tid, count, ins, outs);
}
