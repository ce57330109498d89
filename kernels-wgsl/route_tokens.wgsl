// One invocation per token of `n`: its `top_k` experts, largest logit first (ties to the
// lower index), as tallow_backend::Routing::route chooses them, and their weights: the softmax
// of the chosen logits among themselves, or (softmax_all) their share of a softmax over all
// experts.

struct Params {
    logits: u32, chosen: u32, weights: u32, n: u32, experts: u32, top_k: u32, softmax_all: u32,
    grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> chosen: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// The most experts a token may choose.
const MAX_TOP_K: u32 = 32u;

@compute @workgroup_size(BLOCK)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let t = block_id(wid, n).x * BLOCK + tid;
    if (t >= p.n) {
        return;
    }
    let l = p.logits / 4u + t * p.experts;
    var best: array<u32, MAX_TOP_K>;
    var kept = 0u;
    for (var e = 0u; e < p.experts; e++) {
        var at = kept;
        while (at > 0u && logits[l + best[at - 1u]] < logits[l + e]) {
            at -= 1u;
        }
        if (at == p.top_k) {
            continue;
        }
        let end = min(kept + 1u, p.top_k);
        for (var j = end - 1u; j > at; j--) {
            best[j] = best[j - 1u];
        }
        best[at] = e;
        kept = end;
    }
    let largest = logits[l + best[0]];
    var total = 0.0;
    if (p.softmax_all != 0u) {
        for (var e = 0u; e < p.experts; e++) {
            total += exp(logits[l + e] - largest);
        }
    } else {
        for (var j = 0u; j < p.top_k; j++) {
            total += exp(logits[l + best[j]] - largest);
        }
    }
    for (var j = 0u; j < p.top_k; j++) {
        chosen[p.chosen / 4u + t * p.top_k + j] = best[j];
        weights[p.weights / 4u + t * p.top_k + j] = exp(logits[l + best[j]] - largest) / total;
    }
}
