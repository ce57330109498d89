// RMSNorm over runs of `width` values (a row, or a head): out = x / rms(x) * gain. One
// workgroup per run.

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

var<workgroup> sums: array<f32, 64>;

// 1 / rms of the run starting at `start` of `values`, reduced over the workgroup.
fn inv_rms(start: u32, tid: u32, square_sum: f32) -> f32 {
    sums[tid] = square_sum;
    workgroupBarrier();
    for (var half = 32u; half > 0u; half /= 2u) {
        if (tid < half) {
            sums[tid] += sums[tid + half];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(sums[0] / f32(p.width) + p.eps);
}

@compute @workgroup_size(64)
fn norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var s = 0.0;
    for (var i = tid; i < p.width; i += 64u) {
        s += x[start + i] * x[start + i];
    }
    let scale = inv_rms(start, tid, s);
    if (run < p.runs) {
        for (var i = tid; i < p.width; i += 64u) {
            out[start + i] = x[start + i] * scale * gain[i];
        }
    }
}

@compute @workgroup_size(64)
fn norm_in_place(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let run = wg.x + wg.y * p.groups_x;
    let start = min(run, p.runs - 1u) * p.width;
    var s = 0.0;
    for (var i = tid; i < p.width; i += 64u) {
        s += out[start + i] * out[start + i];
    }
    let scale = inv_rms(start, tid, s);
    workgroupBarrier();
    if (run < p.runs) {
        for (var i = tid; i < p.width; i += 64u) {
            out[start + i] *= scale * gain[i];
        }
    }
}
