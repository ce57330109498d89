// The greedy token of each row of logits, as the host's argmax picks it: the index of the
// largest value, the first on ties, NaN never the largest (the last index when every value is
// NaN). One workgroup per row; row r's token goes to tokens[offset + r]. Needs a
// reduce/*.wgsl before it.

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

// A key that orders values as floats (-0 as +0), from 1 up; NaN never gets one (callers
// skip it), so 0 means no value.
fn key(v: f32) -> u32 {
    var bits = bitcast<u32>(v);
    if (bits == 0x80000000u) {
        bits = 0u;
    }
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

// By its bits: the GPU need not keep NaN's comparison rules.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var best = 0u;
    var index = NONE;
    // Each invocation's indices rise, so only a larger value replaces its best.
    for (var i = lanes.tid; i < p.width; i += 64u) {
        let v = logits[start + i];
        if (!is_nan(v) && key(v) > best) {
            best = key(v);
            index = i;
        }
    }
    let top = workgroup_u32(lanes, best, MAX);
    var token = workgroup_u32(lanes, select(NONE, index, best == top), MIN);
    if (token == NONE) {
        token = p.width - 1u;
    }
    if (lanes.tid == 0u && run < p.runs) {
        tokens[p.offset + run] = token;
    }
}
