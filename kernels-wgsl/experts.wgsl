// Mixture-of-experts layers on the device, around the products of matmul.wgsl's `experts`:
// `route` chooses each token's experts and weights from its router logits, `group` sorts the
// (token, expert) pairs by expert and cuts each expert's run into tiles of products, and after
// the products `add_biases` adds each pair's expert's bias and `combine` sums each token's
// pairs by their weights. Pair `t * top_k + j` is token t's j-th expert.

struct Params {
    tokens: u32,
    experts: u32,
    top_k: u32,
    // route: 0 for the top-k logits' softmax among themselves, 1 for a softmax over all
    // experts then the top k. group: pairs a tile takes. add_biases, combine: floats a row.
    arg: u32,
    // add_biases, combine: invocations per row of the grid.
    stride_x: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
// Each pair's expert and weight.
@group(0) @binding(1) var<storage, read_write> chosen: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
// The pairs by expert, and each expert's first index in them (then the number of pairs).
@group(0) @binding(3) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(4) var<storage, read_write> starts: array<u32>;
@group(0) @binding(5) var<storage, read_write> tiles: array<vec4<u32>>;
// add_biases: rows of pairs and every expert's biases; combine: the layer's output rows and
// the pairs' rows.
@group(0) @binding(6) var<storage, read_write> rows: array<f32>;
@group(0) @binding(7) var<storage, read> values: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

const MAX_TOP_K: u32 = 32u;

// One invocation per token: its top_k experts, largest logit first (ties to the lower
// index), as tallow_backend::Routing::route chooses them, and their weights.
@compute @workgroup_size(64)
fn route(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * p.stride_x;
    if (t >= p.tokens) {
        return;
    }
    let at = t * p.experts;
    var best: array<u32, MAX_TOP_K>;
    var n = 0u;
    for (var e = 0u; e < p.experts; e++) {
        let l = logits[at + e];
        var i = n;
        while (i > 0u && logits[at + best[i - 1u]] < l) {
            i--;
        }
        if (i == p.top_k) {
            continue;
        }
        let end = min(n + 1u, p.top_k);
        for (var j = end - 1u; j > i; j--) {
            best[j] = best[j - 1u];
        }
        best[i] = e;
        n = end;
    }
    let largest = logits[at + best[0]];
    var total = 0.0;
    if (p.arg == 0u) {
        for (var j = 0u; j < p.top_k; j++) {
            total += exp(logits[at + best[j]] - largest);
        }
    } else {
        for (var e = 0u; e < p.experts; e++) {
            total += exp(logits[at + e] - largest);
        }
    }
    for (var j = 0u; j < p.top_k; j++) {
        chosen[t * p.top_k + j] = best[j];
        weights[t * p.top_k + j] = exp(logits[at + best[j]] - largest) / total;
    }
}

// One invocation: a counting sort of the pairs by expert (in token order within an expert),
// then each expert's run cut into tiles of `arg` pairs; the tiles past the last, up to as
// many as the host dispatches (arrayLength), are empty.
@compute @workgroup_size(1)
fn group() {
    let n = p.tokens * p.top_k;
    for (var e = 0u; e <= p.experts; e++) {
        starts[e] = 0u;
    }
    for (var i = 0u; i < n; i++) {
        starts[chosen[i] + 1u] += 1u;
    }
    var tile = 0u;
    for (var e = 0u; e < p.experts; e++) {
        let first = starts[e];
        let count = starts[e + 1u];
        for (var s = 0u; s < count; s += p.arg) {
            tiles[tile] = vec4<u32>(e, first + s, min(p.arg, count - s), 0u);
            tile++;
        }
        starts[e + 1u] = first + count;
    }
    for (; tile < arrayLength(&tiles); tile++) {
        tiles[tile] = vec4<u32>(0u);
    }
    // starts[e] is where expert e's next pair goes, until its run is full.
    for (var i = 0u; i < n; i++) {
        let e = chosen[i];
        pairs[starts[e]] = i;
        starts[e] += 1u;
    }
}

// One invocation per value of the pairs' rows: adds the bias of the pair's expert.
@compute @workgroup_size(64)
fn add_biases(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.stride_x;
    if (i >= p.tokens * p.top_k * p.arg) {
        return;
    }
    let pair = i / p.arg;
    rows[i] += values[chosen[pair] * p.arg + i % p.arg];
}

// One invocation per value of the output: the weighted sum of its token's pairs' values.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.stride_x;
    if (i >= p.tokens * p.arg) {
        return;
    }
    let t = i / p.arg;
    let c = i % p.arg;
    var sum = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        let pair = t * p.top_k + j;
        sum += weights[pair] * values[pair * p.arg + c];
    }
    rows[i] = sum;
}
