// Products of weights in a format (its `dequant32` comes before) and f32 activations laid out
// for GPUs (products_tiles.wgsl is the software adapters' layout), for matmul.wgsl and
// matmul_experts.wgsl (which bind `weights`, `x` and `y`): y[out_t * rows + r]
// = x[in_t] · w[r]. A block of 256 takes 8 rows of w (32 invocations each) by up to 8 tokens:
// lane i of a row decodes its runs i, i + 32, ... of 32 weights once for all the tokens, and
// the 32 lanes' sums meet in workgroup memory.

const ROWS: u32 = 8u;
const TOKENS: u32 = 8u;

var<workgroup> partial: array<f32, 2048>;

// Rows 8 * block.. of the matrix at byte `w` by the `count` tokens whose rows of x are `ins`
// and of y `outs`. Every invocation calls it, in uniform control flow.
fn multiply(
    w: u32,
    block: u32,
    tid: u32,
    count: u32,
    ins: array<u32, 8>,
    outs: array<u32, 8>,
) {
    let lane = tid % 32u;
    let k = tid / 32u;
    let r = block * ROWS + k;
    let row = w + min(r, p.rows - 1u) * p.row_bytes;
    let x0 = p.x / 4u;
    var acc: array<f32, 8>;
    for (var run = lane; run < p.cols / 32u; run += 32u) {
        let values = dequant32(row, run);
        // Whole loops of constant length, which the compiler unrolls, keeping `acc` and
        // `values` in registers.
        for (var t = 0u; t < TOKENS; t++) {
            if (t < count) {
                let at = x0 + ins[t] * p.cols + 32u * run;
                var sum = 0.0;
                for (var i = 0u; i < 32u; i++) {
                    sum += values[i] * x[at + i];
                }
                acc[t] += sum;
            }
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        partial[(t * ROWS + k) * 32u + lane] = acc[t];
    }
    workgroupBarrier();
    // Invocation t * 8 + k sums row k's lanes for token t.
    if (tid < ROWS * TOKENS) {
        let k = tid % ROWS;
        let t = tid / ROWS;
        let rk = block * ROWS + k;
        if (t < count && rk < p.rows) {
            var total = 0.0;
            for (var l = 0u; l < 32u; l++) {
                total += partial[(t * ROWS + k) * 32u + l];
            }
            y[p.y / 4u + outs[t] * p.rows + rk] = total;
        }
    }
}
