// out = x · Wᵀ for up to 8 tokens a workgroup: W (rows x cols) in a GGUF block format, read as
// it lies (the format's `dequant32`), x and out f32. A workgroup takes one row and a block of
// tokens; its threads take the row's runs of 32 values in turn and sum with a tree.

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
    // Workgroups along x (rows beyond 65535 go along y).
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const THREADS: u32 = 64u;
const TOKENS: u32 = 8u;

var<workgroup> sums: array<array<f32, THREADS>, TOKENS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row = wg.x + wg.y * p.groups_x;
    let t0 = wg.z * TOKENS;
    let n_tok = min(TOKENS, p.tokens - t0);
    var acc: array<f32, TOKENS>;
    if (row < p.rows) {
        let base = row * p.row_bytes;
        for (var c = tid; c < p.cols / 32u; c += THREADS) {
            let w = dequant32(base, c);
            for (var t = 0u; t < n_tok; t++) {
                let xs = (t0 + t) * p.cols + c * 32u;
                var s = 0.0;
                for (var i = 0u; i < 32u; i++) {
                    s += w[i] * x[xs + i];
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        sums[t][tid] = acc[t];
    }
    workgroupBarrier();
    for (var half = THREADS / 2u; half > 0u; half /= 2u) {
        if (tid < half) {
            for (var t = 0u; t < TOKENS; t++) {
                sums[t][tid] += sums[t][tid + half];
            }
        }
        workgroupBarrier();
    }
    if (tid < n_tok && row < p.rows) {
        out[(t0 + tid) * p.out_stride + p.first_row + row] = sums[tid][0];
    }
}
