// Reductions over a workgroup of 64 invocations through workgroup memory, for adapters without
// subgroup operations (reduce/subgroup.wgsl is the other version). Every invocation calls
// them, in uniform control flow, and gets the result.

struct Lanes {
    @builtin(local_invocation_index) tid: u32,
}

const SUM: u32 = 0u;
const MAX: u32 = 1u;
const MIN: u32 = 2u;

var<workgroup> reduce_f32: array<f32, 64>;
var<workgroup> reduce_u32: array<u32, 64>;

// The sum (SUM) or maximum (MAX) of every invocation's v.
fn workgroup_f32(l: Lanes, v: f32, op: u32) -> f32 {
    reduce_f32[l.tid] = v;
    workgroupBarrier();
    for (var half = 32u; half > 0u; half /= 2u) {
        if (l.tid < half) {
            let a = reduce_f32[l.tid];
            let b = reduce_f32[l.tid + half];
            reduce_f32[l.tid] = select(max(a, b), a + b, op == SUM);
        }
        workgroupBarrier();
    }
    let r = reduce_f32[0];
    workgroupBarrier();
    return r;
}

// The maximum (MAX) or minimum (MIN) of every invocation's v.
fn workgroup_u32(l: Lanes, v: u32, op: u32) -> u32 {
    reduce_u32[l.tid] = v;
    workgroupBarrier();
    for (var half = 32u; half > 0u; half /= 2u) {
        if (l.tid < half) {
            let a = reduce_u32[l.tid];
            let b = reduce_u32[l.tid + half];
            reduce_u32[l.tid] = select(min(a, b), max(a, b), op == MAX);
        }
        workgroupBarrier();
    }
    let r = reduce_u32[0];
    workgroupBarrier();
    return r;
}
