// out = x · Wᵀ: W (rows x cols) in a GGUF block format, read as it lies (the format's
// `dequant32`), x and out f32. Each invocation takes 4 rows of W and TOKENS tokens, so that a
// run of 32 weights is decoded once for the tokens and a run of 32 activations read once for
// the rows (loads cost more than arithmetic, on software drivers most); a workgroup takes 256
// rows.

struct Params {
    rows: u32,
    cols: u32,
    tokens: u32,
    // Bytes of one row of W.
    row_bytes: u32,
    // Where this part's rows start in out's rows (a matrix too large for one binding is
    // split by rows).
    first_row: u32,
    // Floats of one token's row of out.
    out_stride: u32,
    // Workgroups along x (more go along y).
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const ROWS: u32 = 8u;
// 1 for a token or a few, 4 for more.
override TOKENS: u32 = 4u;
const MAX_TOKENS: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let first = ((wg.x + wg.y * p.groups_x) * 64u + tid) * ROWS;
    if (first >= p.rows) {
        return;
    }
    let t0 = wg.z * TOKENS;
    // Rows and tokens past the end are computed from the last ones and not written.
    var acc: array<array<f32, ROWS>, MAX_TOKENS>;
    for (var c = 0u; c < p.cols / 32u; c++) {
        var xs: array<array<vec4<f32>, 8>, MAX_TOKENS>;
        for (var t = 0u; t < TOKENS; t++) {
            let at = (min(t0 + t, p.tokens - 1u) * p.cols + c * 32u) / 4u;
            for (var j = 0u; j < 8u; j++) {
                xs[t][j] = x[at + j];
            }
        }
        for (var k = 0u; k < ROWS; k++) {
            let w = dequant32(min(first + k, p.rows - 1u) * p.row_bytes, c);
            for (var t = 0u; t < TOKENS; t++) {
                var s = 0.0;
                for (var j = 0u; j < 8u; j++) {
                    let w4 = vec4<f32>(w[4u * j], w[4u * j + 1u], w[4u * j + 2u], w[4u * j + 3u]);
                    s += dot(w4, xs[t][j]);
                }
                acc[t][k] += s;
            }
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        for (var k = 0u; k < ROWS; k++) {
            if (t0 + t < p.tokens && first + k < p.rows) {
                out[(t0 + t) * p.out_stride + p.first_row + first + k] = acc[t][k];
            }
        }
    }
}
