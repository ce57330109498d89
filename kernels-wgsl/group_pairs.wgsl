// One invocation: a counting sort of the `n_pairs` pairs by expert (in token order within an
// expert) into `pairs`, then each expert's run cut into tiles of `per_tile` pairs, written as
// (expert, first index in pairs, count, 0); the tiles past the last, up to `n_tiles`, are
// empty. `starts` holds experts + 1 counts.

struct Params {
    chosen: u32, pairs: u32, starts: u32, tiles: u32, n_pairs: u32, experts: u32, per_tile: u32,
    n_tiles: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> chosen: array<u32>;
@group(0) @binding(1) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(2) var<storage, read_write> starts: array<u32>;
@group(0) @binding(3) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    if (wid.x != 0u || wid.z != 0u || tid != 0u) {
        return;
    }
    let c = p.chosen / 4u;
    let s = p.starts / 4u;
    for (var e = 0u; e <= p.experts; e++) {
        starts[s + e] = 0u;
    }
    for (var i = 0u; i < p.n_pairs; i++) {
        starts[s + chosen[c + i] + 1u] += 1u;
    }
    var tile = 0u;
    for (var e = 0u; e < p.experts; e++) {
        let first = starts[s + e];
        let count = starts[s + e + 1u];
        for (var k = 0u; k < count; k += p.per_tile) {
            let out = p.tiles / 4u + 4u * tile;
            tiles[out] = e;
            tiles[out + 1u] = first + k;
            tiles[out + 2u] = min(count - k, p.per_tile);
            tiles[out + 3u] = 0u;
            tile += 1u;
        }
        starts[s + e + 1u] = first + count;
    }
    for (; tile < p.n_tiles; tile++) {
        for (var i = 0u; i < 4u; i++) {
            tiles[p.tiles / 4u + 4u * tile + i] = 0u;
        }
    }
    // starts[e] is where expert e's next pair goes, until its run is full.
    for (var i = 0u; i < p.n_pairs; i++) {
        let e = chosen[c + i];
        pairs[p.pairs / 4u + starts[s + e]] = i;
        starts[s + e] += 1u;
    }
}
