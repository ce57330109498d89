// out = x · Wᵀ: W (rows x cols) in a GGUF block format, read as it lies (the format's
// `dequant32`), x and out f32. The 64 invocations of a workgroup form groups of LANES; each
// group takes ROWS rows of W and TOKENS tokens, and its lanes split the rows' runs of 32
// weights between them (lane i takes runs i, i + LANES, ...), their partial sums meeting in
// workgroup memory at the end. Each run of 32 weights is decoded once for the TOKENS tokens.
// The backend picks the shape: on a GPU, 64 lanes of 4 rows (neighbours read neighbouring
// bytes of a row, and a row of a few thousand weights keeps the workgroup busy); on a
// software adapter, where invocations are the SIMD lanes of a CPU core, 1 lane of 8 rows
// (each lane has work on short rows too, and a run of activations serves more rows).
//
// The products compute in H, f16 where the adapter has it (HALF; the backend prepends
// `alias H` and `const HALF`), f32 otherwise. In f16, each run of 32 activations is divided
// by its largest magnitude, so that a product of four terms stays far from f16's range
// (weights of quantized formats are small) and keeps 11 bits of each value; sums of four
// products are f16, every longer sum is f32. Each term so takes at most six f16 roundings
// (weight, activation, product, three sums): within 6 * 2^-12 of the magnitude of the exact
// sum (and an activation under 2^-14 of its run's largest may flush to zero), against 2^-8
// for the CPU's 8-bit activations.

struct Params {
    rows: u32,
    cols: u32,
    // main: the tokens of x. experts: what an input row's index is divided by to give its row
    // of x (top-k for the tokens' rows, 1 for rows of their experts' pairs).
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
    // The row of the binding where the part's rows start.
    weight_row: u32,
    // experts: the experts whose rows this binding holds, from the one at weight_row, each
    // `expert_rows` rows after the last.
    first_expert: u32,
    end_expert: u32,
    expert_rows: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
// experts: the step's (token, expert) pairs by expert, and its tiles: (expert, first index in
// `pairs`, count), count 0 past the last (see experts.wgsl's `group`).
@group(0) @binding(4) var<storage, read> pairs: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec4<u32>>;

// 1 for a token or a few, 4 for more.
override TOKENS: u32 = 4u;
const MAX_TOKENS: u32 = 4u;
// 1 or 64: see above.
override LANES: u32 = 64u;
override ROWS: u32 = 4u;
const MAX_ROWS: u32 = 8u;

// With LANES 64, each lane's sum for each (token, row), at [(t * ROWS + k) * 64 + lane].
var<workgroup> partial: array<f32, 64 * MAX_TOKENS * MAX_ROWS>;

// One block of TOKENS tokens, x's rows `inputs` and out's rows `outputs` (`count` of them,
// the others repeating the last), by the rows of W from `weight_row` on (the workgroup's
// share of them). Called in uniform control flow.
fn multiply(
    group: u32,
    tid: u32,
    inputs: array<u32, MAX_TOKENS>,
    outputs: array<u32, MAX_TOKENS>,
    count: u32,
    weight_row: u32,
) {
    let lane = tid % LANES;
    let first = (group + tid / LANES) * ROWS;
    // Rows and tokens past the end are computed from the last ones and not written.
    var acc: array<array<f32, MAX_ROWS>, MAX_TOKENS>;
    for (var c = lane; c < p.cols / 32u; c += LANES) {
        var xs: array<array<vec4<H>, 8>, MAX_TOKENS>;
        // What the run of activations was divided by (1 in f32).
        var scale: array<f32, MAX_TOKENS>;
        for (var t = 0u; t < TOKENS; t++) {
            let at = (inputs[t] * p.cols + c * 32u) / 4u;
            var run: array<vec4<f32>, 8>;
            for (var j = 0u; j < 8u; j++) {
                run[j] = x[at + j];
            }
            var m = 1.0;
            if (HALF) {
                var largest = vec4<f32>(0.0);
                for (var j = 0u; j < 8u; j++) {
                    largest = max(largest, abs(run[j]));
                }
                m = max(max(largest.x, largest.y), max(largest.z, largest.w));
                m = select(m, 1.0, m == 0.0);
            }
            scale[t] = m;
            for (var j = 0u; j < 8u; j++) {
                xs[t][j] = vec4<H>(run[j] / m);
            }
        }
        for (var k = 0u; k < ROWS; k++) {
            let w = dequant32((weight_row + min(first + k, p.rows - 1u)) * p.row_bytes, c);
            var ws: array<vec4<H>, 8>;
            for (var j = 0u; j < 8u; j++) {
                ws[j] = vec4<H>(vec4<f32>(w[4u * j], w[4u * j + 1u], w[4u * j + 2u], w[4u * j + 3u]));
            }
            for (var t = 0u; t < TOKENS; t++) {
                var s = 0.0;
                for (var j = 0u; j < 8u; j++) {
                    s += f32(dot(ws[j], xs[t][j]));
                }
                acc[t][k] += s * scale[t];
            }
        }
    }
    if (LANES == 1u) {
        for (var t = 0u; t < TOKENS; t++) {
            for (var k = 0u; k < ROWS; k++) {
                if (t < count && first + k < p.rows) {
                    out[outputs[t] * p.out_stride + p.first_row + first + k] = acc[t][k];
                }
            }
        }
        return;
    }
    for (var t = 0u; t < TOKENS; t++) {
        for (var k = 0u; k < ROWS; k++) {
            partial[(t * ROWS + k) * 64u + tid] = acc[t][k];
        }
    }
    workgroupBarrier();
    // Invocation t * ROWS + k adds up the sums of token t and row k.
    let t = tid / ROWS;
    let k = tid % ROWS;
    if (t < count && first + k < p.rows) {
        var s = 0.0;
        for (var i = 0u; i < 64u; i++) {
            s += partial[(t * ROWS + k) * 64u + i];
        }
        out[outputs[t] * p.out_stride + p.first_row + first + k] = s;
    }
}

// Tokens t0.. of x, from wg.z * TOKENS on.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let group = (wg.x + wg.y * p.groups_x) * (64u / LANES);
    // Uniform: every invocation of a workgroup with rows reaches the barrier in `multiply`.
    if (group * ROWS >= p.rows) {
        return;
    }
    let t0 = wg.z * TOKENS;
    var rows: array<u32, MAX_TOKENS>;
    for (var t = 0u; t < MAX_TOKENS; t++) {
        rows[t] = min(t0 + t, p.tokens - 1u);
    }
    multiply(group, tid, rows, rows, min(TOKENS, p.tokens - t0), p.weight_row);
}

// Tile wg.z of the pairs: its expert's rows of W by the rows of x its pairs name, into their
// rows of out. Tiles of experts outside this binding's, and empty ones, do nothing.
@compute @workgroup_size(64)
fn experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let group = (wg.x + wg.y * p.groups_x) * (64u / LANES);
    // Uniform: read-only storage at a workgroup's own index.
    let tile = tiles[wg.z];
    let e = tile.x;
    if (group * ROWS >= p.rows || tile.z == 0u || e < p.first_expert || e >= p.end_expert) {
        return;
    }
    var inputs: array<u32, MAX_TOKENS>;
    var outputs: array<u32, MAX_TOKENS>;
    for (var t = 0u; t < MAX_TOKENS; t++) {
        let pair = pairs[tile.y + min(t, tile.z - 1u)];
        inputs[t] = pair / p.tokens;
        outputs[t] = pair;
    }
    let weight_row = p.weight_row + (e - p.first_expert) * p.expert_rows;
    multiply(group, tid, inputs, outputs, tile.z, weight_row);
}
