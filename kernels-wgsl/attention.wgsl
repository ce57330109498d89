// Causal attention over KV pages, in the page format whose kv/*_read.wgsl comes before (see
// kv_write.wgsl for their layout). Out row t (head h) = softmax(scores) · V over the
// positions token t sees: its sequence's (chunk token_chunks[t], page table
// tables[table_starts[c]..]) from the first its window lets it see up to positions[t].
// Scores are q · k * scale, soft-capped where softcap > 0. Where has_sinks, head h's logit
// sinks[h] joins the softmax's denominator and adds no value (gpt-oss).
// Block (x, h, z) of TILE invocations takes token t = tokens[x]: positions a tile at a time,
// each invocation one position's score, a running maximum and sum rescaling the outputs (each
// invocation holds two dimensions). Where n_splits > 1 (a step of few tokens over long
// contexts), block z takes the `span` positions from the first's z * span on and writes its
// maximum, its sum and its unscaled outputs to `partials` (head_dim + 2 values per
// (x, h, z)), which attention_merge.wgsl combines.

struct Params {
    q: u32, out: u32, pages: u32, tables: u32, table_starts: u32, token_chunks: u32,
    positions: u32, n_head: u32, n_head_kv: u32, head_dim: u32, n_pages: u32, page_size: u32,
    scale: f32, softcap: f32, window: u32, sinks: u32, has_sinks: u32, span: u32,
    n_splits: u32, partials: u32, tokens: u32, grid_x: u32, grid_y: u32, grid_z: u32,
}

@group(0) @binding(0) var<storage, read_write> q: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> pages: array<u32>;
@group(0) @binding(3) var<storage, read_write> tables: array<u32>;
@group(0) @binding(4) var<storage, read_write> table_starts: array<u32>;
@group(0) @binding(5) var<storage, read_write> token_chunks: array<u32>;
@group(0) @binding(6) var<storage, read_write> positions: array<u32>;
@group(0) @binding(7) var<storage, read_write> sinks: array<f32>;
@group(0) @binding(8) var<storage, read_write> partials: array<f32>;
@group(0) @binding(9) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(10) var<uniform> p: Params;

// Positions of one tile: one per invocation.
const TILE: u32 = 128u;
// Below every score: WGSL has no infinities in constants.
const NEG_INF: f32 = -3.0e38;

fn page_word(i: u32) -> u32 {
    return pages[i];
}

var<workgroup> query: array<f32, 256>;
var<workgroup> tile_weights: array<f32, TILE>;
var<workgroup> tile_pages: array<u32, TILE>;
// The block's token, its position and its page table, read once.
var<workgroup> token: vec3<u32>;

@compute @workgroup_size(TILE)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let b = block_id(wid, n);
    if (b.x >= p.grid_x) {
        return;
    }
    if (tid == 0u) {
        let t = tokens[p.tokens / 4u + b.x];
        let chunk = token_chunks[p.token_chunks / 4u + t];
        let table = p.tables / 4u + table_starts[p.table_starts / 4u + chunk];
        token = vec3<u32>(t, positions[p.positions / 4u + t], table);
    }
    let own = workgroupUniformLoad(&token);
    let t = own.x;
    let pos = own.y;
    let table = own.z;
    let h = b.y;
    let kvh = h / (p.n_head / p.n_head_kv);
    var first = select(0u, pos + 1u - p.window, p.window > 0u && pos + 1u > p.window);
    // This block's positions: first..=last (none where the token sees fewer).
    first += b.z * p.span;
    let last = select(pos, first + p.span - 1u, p.n_splits > 1u && first + p.span - 1u < pos);
    let row_bytes = kv_row_bytes(p.head_dim);
    let block = p.page_size * row_bytes;
    let keys = p.pages + kvh * p.n_pages * block;
    let values = keys + p.n_head_kv * p.n_pages * block;
    let q0 = p.q / 4u + (t * p.n_head + h) * p.head_dim;
    for (var d = tid; d < p.head_dim; d += TILE) {
        query[d] = q[q0 + d];
    }
    var running_max = NEG_INF;
    var running_sum = 0.0;
    var acc = array<f32, 2>(0.0, 0.0);
    for (var start = first; start <= last; start += TILE) {
        let at = start + tid;
        workgroupBarrier();  // the last tile's query, weights and pages have been read
        var score = NEG_INF;
        if (at <= last) {
            let page = tables[table + at / p.page_size];
            tile_pages[tid] = page;
            let key = keys + page * block + (at % p.page_size) * row_bytes;
            var dot = 0.0;
            for (var d = 0u; d < p.head_dim; d++) {
                dot += query[d] * kv_at(key, d);
            }
            score = dot * p.scale;
            if (p.softcap > 0.0) {
                score = p.softcap * tanh(score / p.softcap);
            }
        }
        let new_max = max(running_max, block_max(tid, score));
        let correction = exp(running_max - new_max);
        let w = select(0.0, exp(score - new_max), at <= last);
        tile_weights[tid] = w;
        running_sum = running_sum * correction + block_sum(tid, w);
        running_max = new_max;
        let count = min(last - start + 1u, TILE);
        for (var i = 0u; i < 2u; i++) {
            let d = tid + i * TILE;
            if (d >= p.head_dim) {
                break;
            }
            var sum = 0.0;
            for (var j = 0u; j < count; j++) {
                let value = values + tile_pages[j] * block + ((start + j) % p.page_size) * row_bytes;
                sum += tile_weights[j] * kv_at(value, d);
            }
            acc[i] = acc[i] * correction + sum;
        }
    }
    if (p.n_splits > 1u) {
        let part = p.partials / 4u + ((b.x * p.n_head + h) * p.n_splits + b.z) * (p.head_dim + 2u);
        if (tid == 0u) {
            partials[part] = running_max;
            partials[part + 1u] = running_sum;
        }
        for (var i = 0u; i < 2u; i++) {
            let d = tid + i * TILE;
            if (d < p.head_dim) {
                partials[part + 2u + d] = acc[i];
            }
        }
        return;
    }
    // With a sink: acc / (sum + exp(sink - max)), rescaled to the larger of the two maxima.
    var rescale = 1.0;
    if (p.has_sinks != 0u) {
        let sink = sinks[p.sinks / 4u + h];
        let m = max(running_max, sink);
        rescale = exp(running_max - m);
        running_sum = running_sum * rescale + exp(sink - m);
    }
    let o = p.out / 4u + (t * p.n_head + h) * p.head_dim;
    for (var i = 0u; i < 2u; i++) {
        let d = tid + i * TILE;
        if (d < p.head_dim) {
            out[o + d] = acc[i] * rescale / running_sum;
        }
    }
}
