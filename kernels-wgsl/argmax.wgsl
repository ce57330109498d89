// The greedy token of each row of logits, as the host's argmax picks it: the index of the
// largest value, the first on ties, NaN never the largest (the last index when every value is
// NaN). One workgroup per row; row r's token goes to tokens[offset + r].

struct Params {
    width: u32,
    runs: u32,
    offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

const NONE: u32 = 0xffffffffu;

var<workgroup> best_values: array<f32, 64>;
var<workgroup> best_indices: array<u32, 64>;

// By its bits: the GPU need not keep NaN's comparison rules.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether value v at index i goes before value b at index j (NONE: no value yet).
fn before(v: f32, i: u32, b: f32, j: u32) -> bool {
    return i != NONE && (j == NONE || v > b || (v == b && i < j));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var best = 0.0;
    var index = NONE;
    // Each invocation's indices rise, so only a larger value replaces its best.
    for (var i = tid; i < p.width; i += 64u) {
        let v = logits[start + i];
        if (!is_nan(v) && (index == NONE || v > best)) {
            best = v;
            index = i;
        }
    }
    best_values[tid] = best;
    best_indices[tid] = index;
    workgroupBarrier();
    for (var half = 32u; half > 0u; half /= 2u) {
        if (tid < half) {
            let v = best_values[tid + half];
            let i = best_indices[tid + half];
            if (before(v, i, best_values[tid], best_indices[tid])) {
                best_values[tid] = v;
                best_indices[tid] = i;
            }
        }
        workgroupBarrier();
    }
    if (tid == 0u && run < p.runs) {
        var token = best_indices[0];
        if (token == NONE) {
            token = p.width - 1u;
        }
        tokens[p.offset + run] = token;
    }
}
