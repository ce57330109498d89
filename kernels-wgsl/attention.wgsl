// Causal attention over paged f16 keys and values, one workgroup per (token, query head): the
// token's visible positions go 64 at a time, each thread scoring one, with an online softmax
// (a running maximum, the sum of exponentials below it and their weighted sum of values,
// rescaled when the maximum grows), and a sink's logit where there is one. Needs a
// reduce/*.wgsl before it.

struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    page_size: u32,
    n_pages: u32,
    scale: f32,
    // 0 when scores are not soft-capped.
    softcap: f32,
    // 0 when the layer sees every position.
    window: u32,
    groups_x: u32,
    // 1 when each head's softmax has a sink (gpt-oss): a logit in `sinks` that joins the
    // denominator and adds no value.
    has_sinks: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
// Per token: where its sequence's page table starts in `tables`, and its position.
@group(0) @binding(1) var<storage, read> tokens: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> tables: array<u32>;
@group(0) @binding(3) var<storage, read> pages: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<storage, read> sinks: array<f32>;

const THREADS: u32 = 64u;
const MAX_HEAD_DIM: u32 = 512u;
// Values of the head each thread accumulates.
const PER_THREAD: u32 = MAX_HEAD_DIM / THREADS;

var<workgroup> qs: array<f32, MAX_HEAD_DIM>;
var<workgroup> weights: array<f32, THREADS>;
var<workgroup> token_info: vec2<u32>;

// Word `w` (two values) of position `pos`'s row of KV head `head`, kind 0 (K) or 1 (V).
fn kv_word(kind: u32, head: u32, table: u32, pos: u32, w: u32) -> vec2<f32> {
    let half_dim = p.head_dim / 2u;
    let page = tables[table + pos / p.page_size];
    let at = (((kind * p.n_head_kv + head) * p.n_pages + page) * p.page_size + pos % p.page_size)
        * half_dim + w;
    return unpack2x16float(pages[at]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let tid = lanes.tid;
    let unit = wg.x + wg.y * p.groups_x;
    let token = unit / p.n_head;
    let head = unit % p.n_head;
    let kv_head = head / (p.n_head / p.n_head_kv);
    // Through workgroup memory: the loop below holds barriers, so its bounds must be uniform.
    if (tid == 0u) {
        token_info = tokens[token];
    }
    let info = workgroupUniformLoad(&token_info);
    let pos = info.y;
    let q_at = (token * p.n_head + head) * p.head_dim;
    for (var d = tid; d < p.head_dim; d += THREADS) {
        qs[d] = q[q_at + d];
    }
    workgroupBarrier();
    var first = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        first = pos + 1u - p.window;
    }
    var running_max = -3.4e38;
    var sum = 0.0;
    var acc: array<f32, PER_THREAD>;
    for (var tile = first; tile <= pos; tile += THREADS) {
        let mine = tile + tid;
        var score = -3.4e38;
        if (mine <= pos) {
            var s = 0.0;
            for (var w = 0u; w < p.head_dim / 2u; w++) {
                let kv = kv_word(0u, kv_head, info.x, mine, w);
                s += qs[2u * w] * kv.x + qs[2u * w + 1u] * kv.y;
            }
            s *= p.scale;
            if (p.softcap > 0.0) {
                s = p.softcap * tanh(s / p.softcap);
            }
            score = s;
        }
        let new_max = max(running_max, workgroup_f32(lanes, score, MAX));
        var e = 0.0;
        if (mine <= pos) {
            e = exp(score - new_max);
        }
        weights[tid] = e;
        let rescale = exp(running_max - new_max);
        sum = sum * rescale + workgroup_f32(lanes, e, SUM);
        running_max = new_max;
        let n = min(THREADS, pos + 1u - tile);
        for (var j = 0u; j < PER_THREAD; j++) {
            let d = tid + j * THREADS;
            if (d < p.head_dim) {
                var a = acc[j] * rescale;
                for (var i = 0u; i < n; i++) {
                    let vv = kv_word(1u, kv_head, info.x, tile + i, d / 2u);
                    a += weights[i] * select(vv.x, vv.y, (d & 1u) == 1u);
                }
                acc[j] = a;
            }
        }
        workgroupBarrier();
    }
    // With a sink: acc / (sum + exp(sink - max)), rescaled to the larger of the two maxima.
    var rescale = 1.0;
    if (p.has_sinks == 1u) {
        let sink = sinks[head];
        let m = max(running_max, sink);
        rescale = exp(running_max - m);
        sum = sum * rescale + exp(sink - m);
    }
    for (var j = 0u; j < PER_THREAD; j++) {
        let d = tid + j * THREADS;
        if (d < p.head_dim) {
            out[q_at + d] = acc[j] * rescale / sum;
        }
    }
}
