// Reductions over a workgroup with subgroup operations (reduce/shared.wgsl is the version for
// adapters without them): each subgroup reduces its values at once, its first invocation
// leaves the result in workgroup memory, and every invocation combines those. Every
// invocation calls them, in uniform control flow, and gets the result. (wgpu takes subgroup
// operations from the device's SUBGROUP feature, without an `enable` directive.)

struct Lanes {
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) subgroups: u32,
}

const SUM: u32 = 0u;
const MAX: u32 = 1u;
const MIN: u32 = 2u;

// One value per subgroup: at most one subgroup per invocation of a 64-wide workgroup.
var<workgroup> reduce_f32: array<f32, 64>;
var<workgroup> reduce_u32: array<u32, 64>;

// The sum (SUM) or maximum (MAX) of every invocation's v.
fn workgroup_f32(l: Lanes, v: f32, op: u32) -> f32 {
    var s: f32;
    if (op == SUM) {
        s = subgroupAdd(v);
    } else {
        s = subgroupMax(v);
    }
    if (l.lane == 0u) {
        reduce_f32[l.subgroup] = s;
    }
    workgroupBarrier();
    var r = reduce_f32[0];
    for (var i = 1u; i < l.subgroups; i++) {
        let b = reduce_f32[i];
        r = select(max(r, b), r + b, op == SUM);
    }
    workgroupBarrier();
    return r;
}

// The maximum (MAX) or minimum (MIN) of every invocation's v.
fn workgroup_u32(l: Lanes, v: u32, op: u32) -> u32 {
    var s: u32;
    if (op == MAX) {
        s = subgroupMax(v);
    } else {
        s = subgroupMin(v);
    }
    if (l.lane == 0u) {
        reduce_u32[l.subgroup] = s;
    }
    workgroupBarrier();
    var r = reduce_u32[0];
    for (var i = 1u; i < l.subgroups; i++) {
        let b = reduce_u32[i];
        r = select(min(r, b), max(r, b), op == MAX);
    }
    workgroupBarrier();
    return r;
}
