// What every kernel of tallow's wgpu backend shares. The kernels take their arguments as
// tallow-backend-gpu launches them, the CUDA and Metal kernels' parameters in order:
// - each pointer argument is a buffer bound whole at the next binding of group 0, in order,
//   read_write (a buffer may be bound twice: an operation in place);
// - the uniform `p: Params` bound after them holds every argument in order (a pointer's byte
//   offset in its buffer, an int's or a float's value), then the launch's grid (grid_x,
//   grid_y, grid_z), which every Params ends with;
// - a block is a workgroup of BLOCK invocations (the launch's block size, at most 256).
// A grid wider than the adapter's dispatches takes the rest of x along z: `block_id` gives
// the block a workgroup is, and a workgroup past the grid does nothing.

override BLOCK: u32 = 256u;

// The block (CUDA's blockIdx) of the workgroup `wid` of a dispatch `n` wide.
fn block_id(wid: vec3<u32>, n: vec3<u32>) -> vec3<u32> {
    return vec3<u32>(wid.x + (wid.z / p.grid_z) * n.x, wid.y, wid.z % p.grid_z);
}

var<workgroup> reduce_f32: array<f32, 256>;

// The sum (`maximum` false) or largest (true) of every invocation's `v`, in every invocation.
// Every invocation of the workgroup calls it, in uniform control flow.
fn block_reduce(tid: u32, v: f32, maximum: bool) -> f32 {
    workgroupBarrier();  // the last call's result has been read
    reduce_f32[tid] = v;
    workgroupBarrier();
    for (var half = 128u; half > 0u; half /= 2u) {
        if (tid < half && tid + half < BLOCK) {
            let a = reduce_f32[tid];
            let b = reduce_f32[tid + half];
            reduce_f32[tid] = select(a + b, max(a, b), maximum);
        }
        workgroupBarrier();
    }
    return reduce_f32[0];
}

fn block_sum(tid: u32, v: f32) -> f32 {
    return block_reduce(tid, v, false);
}

fn block_max(tid: u32, v: f32) -> f32 {
    return block_reduce(tid, v, true);
}

// By its bits: the GPU need not keep NaN's comparison rules.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// The f16 nearest `f` (ties to even), as bits: pack2x16float's rounding is the adapter's.
fn f32_to_f16(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let exponent = (x >> 23u) & 0xffu;
    let mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) {
        return sign | 0x7c00u | select(0u, 0x200u, mantissa != 0u);
    }
    let e = i32(exponent) - 127 + 15;
    if (e >= 31) {
        return sign | 0x7c00u;
    }
    if (e <= 0) {
        // Subnormal (or zero): the mantissa with its implicit bit, shifted into place.
        if (e < -10) {
            return sign;
        }
        let m = mantissa | 0x800000u;
        let shift = u32(14 - e);
        var bits = m >> shift;
        let rest = m & ((1u << shift) - 1u);
        let mid = 1u << (shift - 1u);
        if (rest > mid || (rest == mid && (bits & 1u) != 0u)) {
            bits += 1u;
        }
        return sign | bits;
    }
    var bits = sign | (u32(e) << 10u) | (mantissa >> 13u);
    let rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (bits & 1u) != 0u)) {
        bits += 1u;  // may carry into the exponent
    }
    return bits;
}

// `x` rounded to the nearest integer, halves away from zero (C's roundf; WGSL's round takes
// halves to even).
fn round_away(x: f32) -> f32 {
    let t = trunc(x);
    return select(t, t + sign(x), abs(x - t) >= 0.5);
}
