// out = x · Wᵀ: W (rows x cols) in a GGUF block format, read as it lies (the format's
// `dequant32`), x and out f32. Each invocation takes one row of W for up to 8 tokens; a
// workgroup takes 64 rows.

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
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const TOKENS: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row = (wg.x + wg.y * p.groups_x) * 64u + tid;
    if (row >= p.rows) {
        return;
    }
    let t0 = wg.z * TOKENS;
    let n_tok = min(TOKENS, p.tokens - t0);
    let base = row * p.row_bytes;
    for (var t = 0u; t < n_tok; t++) {
        var s = 0.0;
        for (var c = 0u; c < p.cols / 32u; c++) {
            let w = dequant32(base, c);
            let xs = (t0 + t) * p.cols + c * 32u;
            for (var i = 0u; i < 32u; i++) {
                s += w[i] * x[xs + i];
            }
        }
        out[(t0 + t) * p.out_stride + p.first_row + row] = s;
    }
}
