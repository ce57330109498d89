// RMSNorm over runs of `width` values (a row, or a head): out = x / rms(x) * gain. One
// workgroup per run. Needs a reduce/*.wgsl before it.

struct Params {
    width: u32,
    runs: u32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> gain: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// 1 / rms of a run whose squares this invocation summed to `square_sum`.
fn inv_rms(l: Lanes, square_sum: f32) -> f32 {
    return 1.0 / sqrt(workgroup_f32(l, square_sum, SUM) / f32(p.width) + p.eps);
}

@compute @workgroup_size(64)
fn norm(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let tid = lanes.tid;
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var s = 0.0;
    for (var i = tid; i < p.width; i += 64u) {
        s += x[start + i] * x[start + i];
    }
    let scale = inv_rms(lanes, s);
    if (run < p.runs) {
        for (var i = tid; i < p.width; i += 64u) {
            out[start + i] = x[start + i] * scale * gain[i];
        }
    }
}

@compute @workgroup_size(64)
fn norm_in_place(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let tid = lanes.tid;
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var s = 0.0;
    for (var i = tid; i < p.width; i += 64u) {
        s += out[start + i] * out[start + i];
    }
    let scale = inv_rms(lanes, s);
    workgroupBarrier();
    if (run < p.runs) {
        for (var i = tid; i < p.width; i += 64u) {
            out[start + i] *= scale * gain[i];
        }
    }
}
