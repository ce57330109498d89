// Products of weights in a format (its `dequant32` comes before) and f32 activations in tiles
// of 64 rows by 32 tokens, for matmul_tiles.wgsl and matmul_tiles_experts.wgsl (which bind
// `weights`, `x` and `y`), laid out for software adapters, whose invocations are a CPU's SIMD
// lanes: invocation i takes row i % 64 whole, for 16 of the tokens (the first or the second
// half), so that neighbouring invocations decode neighbouring rows and read the same
// activations, and no invocation waits for another.

const TILE_ROWS: u32 = 64u;
const TILE_TOKENS: u32 = 32u;
const HALF_TOKENS: u32 = 16u;

// Rows row0.. of the matrix at byte `w` by the `count` tokens whose rows of x are `ins` and
// of y `outs`.
fn multiply_tile(
    w: u32,
    row0: u32,
    tid: u32,
    count: u32,
    ins: array<u32, 32>,
    outs: array<u32, 32>,
) {
    let r = row0 + tid % TILE_ROWS;
    let first = (tid / TILE_ROWS) * HALF_TOKENS;
    if (r >= p.rows || first >= count) {
        return;
    }
    let row = w + r * p.row_bytes;
    // x's rows are whole runs of 32 values from a 16-byte boundary: read 4 at a time.
    let x0 = p.x / 16u;
    let n = min(count - first, HALF_TOKENS);
    var acc: array<f32, 16>;
    for (var run = 0u; run < p.cols / 32u; run++) {
        let w32 = dequant32(row, run);
        var ws: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            ws[j] = vec4<f32>(w32[4u * j], w32[4u * j + 1u], w32[4u * j + 2u], w32[4u * j + 3u]);
        }
        for (var t = 0u; t < n; t++) {
            let at = x0 + (ins[first + t] * p.cols + 32u * run) / 4u;
            var sum = 0.0;
            for (var j = 0u; j < 8u; j++) {
                sum += dot(ws[j], x[at + j]);
            }
            acc[t] += sum;
        }
    }
    for (var t = 0u; t < HALF_TOKENS; t++) {
        if (first + t < count) {
            y[p.y / 4u + outs[first + t] * p.rows + r] = acc[t];
        }
    }
}
