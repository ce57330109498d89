//! One step on the CPU: each operation runs as it comes, on the thread pool, over buffers of
//! the step's arena.

use std::ops::Range;

use tallow_arena::GrowingArena;
use tallow_backend::{
    draw_rows, Activation, BackendError, Batch, Experts, Moe, Output, OutputRows, Rope, Scores,
    Step, StepInput, StepPlan,
};
use tallow_kv::{KvLayout, PagedKvCache};
use tallow_quant::QuantizedActs;

use crate::attention::{Attention, Plan};
use crate::matrix::Matrix;
use crate::ops::{
    add_in_place, add_rows, add_scaled, gated, hadamard, rms_norm, rms_norm_in_place, sigmoid,
};
use crate::pages::KvStorage;
use crate::scratch::{reset, take, take_as_is};
use crate::CpuBackend;

/// The state of one step: its input, the arenas, the rotary angles of every token for each
/// RoPE, and how attention is split between threads (with its scratch).
pub struct CpuStep<'s> {
    batch: &'s Batch,
    step_plan: &'s StepPlan,
    ropes: &'s [Rope],
    arena: &'s GrowingArena,
    /// Reset at every product: the quantized activations.
    layer: &'s mut GrowingArena,
    /// `ropes.len()` tables of `tokens * angles_len` floats.
    angles: &'s [f32],
    plan: Plan,
    attention: &'s mut [f32],
    partials: &'s mut [f32],
}

impl<'s> CpuStep<'s> {
    pub(crate) fn begin(
        arena: &'s GrowingArena,
        layer: &'s mut GrowingArena,
        input: &'s StepInput<'s, CpuBackend>,
    ) -> Result<Self, BackendError> {
        let (batch, step_plan, ropes) = (input.batch, input.plan, &input.ropes[..]);
        let n = batch.tokens.len();
        // The rotary angles of each token's position, per RoPE, shared by the layers.
        let angles_len = ropes.first().map_or(0, Rope::angles_len);
        let angles = take::<f32>(arena, ropes.len() * n * angles_len)?;
        for (r, rope) in ropes.iter().enumerate() {
            rope.angles_of(&step_plan.positions, &mut angles[r * n * angles_len..]);
        }
        let threads = tallow_threads::global().threads();
        let first_pos = &step_plan.first_pos;
        let plan = Plan::new(input.heads, input.page_size, batch, first_pos, threads);
        Ok(CpuStep {
            batch,
            step_plan,
            ropes,
            arena,
            layer,
            angles,
            plan,
            attention: take(arena, threads * plan.thread_scratch_len())?,
            partials: take(arena, plan.partials_len(batch.chunks.len()))?,
        })
    }

    fn n_tokens(&self) -> usize {
        self.batch.tokens.len()
    }

    /// `input` quantized for `m`'s products, from the layer arena.
    fn quantize<'a>(
        layer: &'a GrowingArena,
        m: &Matrix,
        input: &[f32],
        n: usize,
    ) -> Result<QuantizedActs<'a>, BackendError> {
        let ty = m.ty.vec_dot_type();
        let len = QuantizedActs::buffer_len(ty, n, m.cols)?;
        // Quantizing writes every byte and scale: zeroing them first took a quarter of the
        // time of quantizing a few tokens.
        let bytes = take_as_is::<u8>(layer, len.bytes)?;
        let scales = take_as_is::<f32>(layer, len.scales)?;
        Ok(QuantizedActs::quantize(
            ty, input, n, m.cols, bytes, scales,
        )?)
    }
}

impl<'s> Step<CpuBackend> for CpuStep<'s> {
    type Rows = &'s mut [f32];

    fn rows(&mut self, n: usize, width: usize) -> Result<Self::Rows, BackendError> {
        take(self.arena, n * width)
    }

    fn upload(&mut self, values: &[f32], _width: usize) -> Result<Self::Rows, BackendError> {
        let rows = take(self.arena, values.len())?;
        rows.copy_from_slice(values);
        Ok(rows)
    }

    fn read(&mut self, x: &Self::Rows, out: &mut [f32]) -> Result<(), BackendError> {
        out.copy_from_slice(&x[..out.len()]);
        Ok(())
    }

    fn embed(
        &mut self,
        table: &Matrix,
        scale: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        for (&id, row) in self
            .batch
            .tokens
            .iter()
            .zip(out.chunks_exact_mut(table.cols))
        {
            table.dequantize_row(id as usize, row)?;
        }
        if scale != 1.0 {
            out.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &Self::Rows,
        gain: &Vec<f32>,
        eps: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        rms_norm(x, gain, eps, out);
        Ok(())
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut Self::Rows,
        gain: &Vec<f32>,
        eps: f32,
    ) -> Result<(), BackendError> {
        rms_norm_in_place(x, gain, eps);
        Ok(())
    }

    fn matmul<const N: usize>(
        &mut self,
        input: &Self::Rows,
        matrices: [&Matrix; N],
        outs: [&mut Self::Rows; N],
    ) -> Result<(), BackendError> {
        // Rows of the input: the step's tokens, or fewer (the last layer's rows that produce
        // logits).
        let n = input.len() / matrices[0].cols.max(1);
        reset(self.layer)?;
        let layer: &GrowingArena = self.layer;
        let outs = outs.map(|out| &mut out[..]);
        let ty = matrices[0].ty.vec_dot_type();
        if matrices.iter().all(|m| m.ty.vec_dot_type() == ty) {
            let acts = Self::quantize(layer, matrices[0], input, n)?;
            Matrix::matmul_many(matrices, &acts, outs)?;
            return Ok(());
        }
        for (m, out) in matrices.into_iter().zip(outs) {
            let acts = Self::quantize(layer, m, input, n)?;
            m.matmul(&acts, out)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, x: &mut Self::Rows, bias: &Vec<f32>) -> Result<(), BackendError> {
        add_rows(x, bias);
        Ok(())
    }

    fn rope(&mut self, rope: usize, x: &mut Self::Rows) -> Result<(), BackendError> {
        let n = self.n_tokens();
        let r = &self.ropes[rope];
        let angles_len = r.angles_len();
        let table = &self.angles[rope * n * angles_len..][..n * angles_len];
        for (row, angles) in x
            .chunks_exact_mut(x.len() / n)
            .zip(table.chunks_exact(angles_len))
        {
            r.apply(row, angles);
        }
        Ok(())
    }

    fn write_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        k: &mut Self::Rows,
        v: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let layout = *cache.layout();
        if rotates(&layout) {
            hadamard(k, layout.head_dim);
            hadamard(v, layout.head_dim);
        }
        let storage = cache.store_mut::<KvStorage>()?;
        let group = self.step_plan.group(layer)?;
        let kv_dim = k.len() / self.n_tokens();
        for ((slot, k), v) in group
            .slots
            .iter()
            .zip(k.chunks_exact(kv_dim))
            .zip(v.chunks_exact(kv_dim))
        {
            let slot = tallow_kv::Slot {
                page: tallow_kv::PageId(slot.page),
                offset: slot.offset as usize,
            };
            storage.write_token(slot, layer, k, v)?;
        }
        for c in &group.copies {
            storage.copy_positions(c.src, c.dst, layer, c.len)?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        cache: &PagedKvCache,
        layer: usize,
        scores: Scores,
        sinks: Option<&Vec<f32>>,
        q: &mut Self::Rows,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let storage = cache.store::<KvStorage>()?;
        let layout = storage.layout();
        let rotated = rotates(layout);
        if rotated {
            hadamard(q, layout.head_dim);
        }
        let attention = Attention {
            plan: &self.plan,
            step: self.step_plan,
            storage,
            layer,
            batch: self.batch,
            q,
            scores,
            sinks: sinks.map(Vec::as_slice),
        };
        attention.run(self.attention, self.partials, out)?;
        if rotated {
            // The output is a mix of rotated values: rotated back (H is its own inverse).
            hadamard(out, layout.head_dim);
        }
        Ok(())
    }

    fn gated(
        &mut self,
        activation: Activation,
        gate: &mut Self::Rows,
        up: &Self::Rows,
    ) -> Result<(), BackendError> {
        gated(activation, gate, up);
        Ok(())
    }

    fn experts(
        &mut self,
        x: &Self::Rows,
        router: &Self::Rows,
        experts: &Experts<CpuBackend>,
        moe: Moe,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let (n, k, n_expert) = (self.n_tokens(), moe.top_k, experts.len());
        let d = x.len() / n;
        reset(self.layer)?;
        let layer: &GrowingArena = self.layer;
        // Each token's experts and weights; then the pairs (token, expert) by expert, as
        // indices into them (a counting sort).
        let chosen = take::<u32>(layer, n * k)?;
        let weights = take::<f32>(layer, n * k)?;
        for ((logits, chosen), weights) in router
            .chunks_exact(n_expert)
            .zip(chosen.chunks_exact_mut(k))
            .zip(weights.chunks_exact_mut(k))
        {
            moe.routing.route(logits, chosen, weights);
        }
        let starts = take::<u32>(layer, n_expert + 1)?;
        for &e in chosen.iter() {
            starts[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            starts[e + 1] += starts[e];
        }
        let by_expert = take::<u32>(layer, n * k)?;
        let next = take::<u32>(layer, n_expert)?;
        next.copy_from_slice(&starts[..n_expert]);
        for (pair, &e) in chosen.iter().enumerate() {
            by_expert[next[e as usize] as usize] = pair as u32;
            next[e as usize] += 1;
        }

        let ff = experts.gate[0].rows;
        let rows = take::<f32>(layer, n * k * d)?;
        let gate = take::<f32>(layer, n * k * ff)?;
        let up = take::<f32>(layer, n * k * ff)?;
        let down = take::<f32>(layer, n * k * d)?;
        // Every pair's row of `x`, expert after expert: each expert's tokens are a run.
        for (row, &pair) in rows.chunks_exact_mut(d).zip(by_expert.iter()) {
            row.copy_from_slice(&x[pair as usize / k * d..][..d]);
        }
        let span = |e: usize| starts[e] as usize..starts[e + 1] as usize;
        let mut used = (0..n_expert)
            .filter(|&e| starts[e] < starts[e + 1])
            .peekable();
        while used.peek().is_some() {
            let batch: [Option<usize>; EXPERT_BATCH] = std::array::from_fn(|_| used.next());
            let spans = batch.map(|e| e.map(span));
            let first = spans[0].as_ref().map_or(0, |r| r.start);
            let end = spans.iter().flatten().last().map_or(first, |r| r.end);
            let acts = |m: &[Matrix], input: &[f32], width: usize| {
                let mut acts = [None; EXPERT_BATCH];
                for (slot, (e, r)) in acts.iter_mut().zip(batch.iter().zip(&spans)) {
                    if let (Some(e), Some(r)) = (e, r) {
                        let rows = &input[r.start * width..r.end * width];
                        *slot = Some(Self::quantize(layer, &m[*e], rows, r.len())?);
                    }
                }
                Ok::<_, BackendError>(acts)
            };
            let gate_acts = acts(&experts.gate, rows, d)?;
            let same_acts = (batch.iter().flatten())
                .all(|&e| experts.up[e].ty.vec_dot_type() == experts.gate[e].ty.vec_dot_type());
            let up_acts = if same_acts {
                gate_acts
            } else {
                acts(&experts.up, rows, d)?
            };
            let mut gates = by_span(gate, ff, &spans);
            let mut ups = by_span(up, ff, &spans);
            let mut jobs: [Option<ExpertJob<'_, '_>>; 2 * EXPERT_BATCH] = Default::default();
            for (i, e) in batch.iter().enumerate() {
                if let Some(e) = *e {
                    let (g, u) = (gates[i].take(), ups[i].take());
                    jobs[2 * i] = gate_acts[i].zip(g).map(|(a, g)| (&experts.gate[e], a, g));
                    jobs[2 * i + 1] = up_acts[i].zip(u).map(|(a, u)| (&experts.up[e], a, u));
                }
            }
            Matrix::matmul_each(jobs)?;
            if let Some([gate_bias, up_bias, _]) = &experts.biases {
                for (e, r) in batch.iter().flatten().zip(spans.iter().flatten()) {
                    add_rows(
                        &mut gate[r.start * ff..r.end * ff],
                        &gate_bias[e * ff..][..ff],
                    );
                    add_rows(&mut up[r.start * ff..r.end * ff], &up_bias[e * ff..][..ff]);
                }
            }
            let run = first * ff..end * ff;
            gated(moe.activation, &mut gate[run.clone()], &up[run]);

            let down_acts = acts(&experts.down, gate, ff)?;
            let mut downs = by_span(down, d, &spans);
            let mut jobs: [Option<ExpertJob<'_, '_>>; EXPERT_BATCH] = Default::default();
            for (i, e) in batch.iter().enumerate() {
                if let Some(e) = *e {
                    let out = downs[i].take();
                    jobs[i] = down_acts[i].zip(out).map(|(a, o)| (&experts.down[e], a, o));
                }
            }
            Matrix::matmul_each(jobs)?;
            if let Some([_, _, down_bias]) = &experts.biases {
                for (e, r) in batch.iter().flatten().zip(spans.iter().flatten()) {
                    add_rows(&mut down[r.start * d..r.end * d], &down_bias[e * d..][..d]);
                }
            }
        }
        out.fill(0.0);
        for (y, &pair) in down.chunks_exact(d).zip(by_expert.iter()) {
            let pair = pair as usize;
            add_scaled(&mut out[pair / k * d..][..d], y, weights[pair]);
        }
        Ok(())
    }

    fn scale_by_sigmoid(
        &mut self,
        x: &mut Self::Rows,
        gates: &Self::Rows,
    ) -> Result<(), BackendError> {
        let d = x.len() / gates.len();
        for (row, &g) in x.chunks_exact_mut(d).zip(gates.iter()) {
            let s = sigmoid(g);
            row.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    fn add(&mut self, x: &mut Self::Rows, y: &Self::Rows) -> Result<(), BackendError> {
        add_in_place(x, y);
        Ok(())
    }

    fn output_rows(
        &mut self,
        x: &Self::Rows,
        which: OutputRows,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError> {
        let d = x.len() / self.n_tokens();
        for (&row, out) in which.of(self.step_plan).iter().zip(out.chunks_exact_mut(d)) {
            out.copy_from_slice(&x[row as usize * d..][..d]);
        }
        Ok(())
    }

    fn logits(
        &mut self,
        x: &Self::Rows,
        m: &Matrix,
        softcap: Option<f32>,
        out: Output<'_>,
    ) -> Result<(), BackendError> {
        reset(self.layer)?;
        let n = x.len() / m.cols;
        let acts = Self::quantize(self.layer, m, x, n)?;
        let capped = |logits: &mut [f32]| {
            if let Some(cap) = softcap {
                logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
        };
        let product = |logits: &mut [f32]| -> Result<(), BackendError> {
            m.matmul(&acts, logits)?;
            capped(logits);
            Ok(())
        };
        match out {
            Output::Logits(logits) => product(logits),
            Output::Draw { draws, tokens } => {
                let logits = take::<f32>(self.layer, n * m.rows)?;
                product(logits)?;
                draw_rows(logits, m.rows, draws, tokens)
            }
            Output::Selected { tokens, logits } => {
                m.matmul_rows(tokens, &acts, logits)?;
                capped(logits);
                Ok(())
            }
        }
    }
}

/// Experts whose products run in one parallel loop.
const EXPERT_BATCH: usize = 8;

/// One expert's product: its matrix, the activations of its tokens and their outputs.
type ExpertJob<'m, 'a> = (&'m Matrix, QuantizedActs<'a>, &'a mut [f32]);

/// The runs of `rows` of `width` values that `spans` (row ranges, increasing and disjoint)
/// name, each as its own slice.
fn by_span<'a, const N: usize>(
    mut rows: &'a mut [f32],
    width: usize,
    spans: &[Option<Range<usize>>; N],
) -> [Option<&'a mut [f32]>; N] {
    let mut at = 0;
    spans.clone().map(|span| {
        let span = span?;
        let rest = std::mem::take(&mut rows);
        let (_, rest) = rest.split_at_mut((span.start - at) * width);
        let (run, rest) = rest.split_at_mut(span.len() * width);
        (rows, at) = (rest, span.end);
        Some(run)
    })
}

/// Whether pages of `layout` hold keys and values rotated by a Hadamard matrix (as llama.cpp's
/// quantized ones do): a head's few large values spread over all of it before it is cut into
/// blocks. Queries are rotated alike, which leaves their dot products with the keys as they
/// were, and the attention's output is rotated back.
fn rotates(layout: &KvLayout) -> bool {
    layout.dtype.block_format().is_some() && layout.head_dim.is_power_of_two()
}
