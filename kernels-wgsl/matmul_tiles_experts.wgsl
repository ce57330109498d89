// A mixture of experts' products in tiles (products_tiles.wgsl): block (i, b) takes tile i of
// `tiles` (expert, first index in `pairs`, count, unused; count 0 past the last, see
// group_pairs.wgsl), rows 64b.. of its expert's weights (expert e's at `w + offsets[e]`) by
// the rows of x its pairs name (row pair / divisor), into the pairs' rows of y.

struct Params {
    w: u32, offsets: u32, x: u32, y: u32, rows: u32, cols: u32, row_bytes: u32, pairs: u32,
    tiles: u32, divisor: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(5) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(6) var<uniform> p: Params;

// An expert's offset where the launch's buffer does not hold it: its tiles are another
// launch's.
const NO_EXPERT: u32 = 0xffffffffu;

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    let tile = p.tiles / 4u + 4u * b.x;
    let count = tiles[tile + 2u];
    let offset = offsets[p.offsets / 4u + tiles[tile]];
    if (count == 0u || offset == NO_EXPERT) {
        return;  // the whole block
    }
    var ins: array<u32, 32>;
    var outs: array<u32, 32>;
    for (var t = 0u; t < TILE_TOKENS; t++) {
        let pair = pairs[p.pairs / 4u + tiles[tile + 1u] + min(t, count - 1u)];
        ins[t] = pair / p.divisor;
        outs[t] = pair;
    }
    multiply_tile(p.w + offset, b.y * TILE_ROWS, tid, count, ins, outs);
}
