//! One step on the CPU: each operation runs as it comes, on the thread pool, over buffers of
//! the step's arena.

use tallow_arena::Arena;
use tallow_backend::{
    argmax, Activation, Batch, KvCopy, Logits, Output, Rope, Scores, Step, StepError, StepInput,
};
use tallow_kv::{KvStorage, PagedKvCache};
use tallow_quant::QuantizedActs;

use crate::attention::{Attention, Plan};
use crate::matrix::Matrix;
use crate::ops::{add_in_place, add_rows, gated, hadamard, rms_norm, rms_norm_in_place};
use crate::scratch::{take, LAYER, STEP};
use crate::CpuBackend;

/// The state of one step: its input, the arenas, the rotary angles of every token for each
/// RoPE, and how attention is split between threads (with its scratch).
pub struct CpuStep<'s> {
    batch: &'s Batch,
    first_pos: &'s [usize],
    ropes: &'s [Rope],
    arena: &'s Arena,
    /// Reset at every product: the quantized activations.
    layer: &'s mut Arena,
    /// `ropes.len()` tables of `tokens * angles_len` floats.
    angles: &'s [f32],
    plan: Plan,
    attention: &'s mut [f32],
    partials: &'s mut [f32],
}

impl<'s> CpuStep<'s> {
    pub(crate) fn begin(
        arena: &'s Arena,
        layer: &'s mut Arena,
        input: &'s StepInput<'s, CpuBackend>,
    ) -> Result<Self, StepError> {
        let (batch, first_pos, ropes) = (input.batch, input.first_pos, &input.ropes[..]);
        let n = batch.tokens.len();
        // The rotary angles of each token's position, per RoPE, shared by the layers.
        let angles_len = ropes.first().map_or(0, Rope::angles_len);
        let angles = take::<f32>(arena, STEP, ropes.len() * n * angles_len)?;
        for (r, rope) in ropes.iter().enumerate() {
            rope.batch_angles(batch, first_pos, &mut angles[r * n * angles_len..]);
        }
        let threads = tallow_threads::global().threads();
        let plan = Plan::new(input.heads, input.page_size, batch, first_pos, threads);
        Ok(CpuStep {
            batch,
            first_pos,
            ropes,
            arena,
            layer,
            angles,
            plan,
            attention: take(arena, STEP, threads * plan.thread_scratch_len())?,
            partials: take(arena, STEP, plan.partials_len(batch.chunks.len()))?,
        })
    }

    fn n_tokens(&self) -> usize {
        self.batch.tokens.len()
    }

    /// `input` quantized for `m`'s products, from the layer arena.
    fn quantize<'a>(
        layer: &'a Arena,
        m: &Matrix,
        input: &[f32],
        n: usize,
    ) -> Result<QuantizedActs<'a>, StepError> {
        let ty = m.ty.vec_dot_type();
        let len = QuantizedActs::buffer_len(ty, n, m.cols)?;
        let bytes = take::<u8>(layer, LAYER, len.bytes)?;
        let scales = take::<f32>(layer, LAYER, len.scales)?;
        Ok(QuantizedActs::quantize(
            ty, input, n, m.cols, bytes, scales,
        )?)
    }
}

impl<'s> Step<CpuBackend> for CpuStep<'s> {
    type Rows = &'s mut [f32];

    fn rows(&mut self, n: usize, width: usize) -> Result<Self::Rows, StepError> {
        take(self.arena, STEP, n * width)
    }

    fn upload(&mut self, values: &[f32], _width: usize) -> Result<Self::Rows, StepError> {
        let rows = take(self.arena, STEP, values.len())?;
        rows.copy_from_slice(values);
        Ok(rows)
    }

    fn read(&mut self, x: &Self::Rows, out: &mut [f32]) -> Result<(), StepError> {
        out.copy_from_slice(&x[..out.len()]);
        Ok(())
    }

    fn embed(&mut self, table: &Matrix, scale: f32, out: &mut Self::Rows) -> Result<(), StepError> {
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
    ) -> Result<(), StepError> {
        rms_norm(x, gain, eps, out);
        Ok(())
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut Self::Rows,
        gain: &Vec<f32>,
        eps: f32,
    ) -> Result<(), StepError> {
        rms_norm_in_place(x, gain, eps);
        Ok(())
    }

    fn matmul<const N: usize>(
        &mut self,
        input: &Self::Rows,
        matrices: [&Matrix; N],
        outs: [&mut Self::Rows; N],
    ) -> Result<(), StepError> {
        let n = self.n_tokens();
        self.layer.reset();
        let layer: &Arena = self.layer;
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

    fn add_bias(&mut self, x: &mut Self::Rows, bias: &Vec<f32>) -> Result<(), StepError> {
        add_rows(x, bias);
        Ok(())
    }

    fn rope(&mut self, rope: usize, x: &mut Self::Rows) -> Result<(), StepError> {
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

    fn rotate_heads(&mut self, x: &mut Self::Rows, head_dim: usize) -> Result<(), StepError> {
        hadamard(x, head_dim);
        Ok(())
    }

    fn write_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        k: &Self::Rows,
        v: &Self::Rows,
    ) -> Result<(), StepError> {
        let kv_dim = k.len() / self.n_tokens();
        for (chunk, &first) in self.batch.chunks.iter().zip(self.first_pos) {
            let parent = self.batch.is_parent(chunk.seq);
            for i in 0..chunk.len {
                let slot = Batch::write_slot(cache, chunk.seq, parent, first + i, layer)?;
                let row = (chunk.start + i) * kv_dim..(chunk.start + i + 1) * kv_dim;
                cache.store_mut::<KvStorage>()?.write_token(
                    slot,
                    layer,
                    &k[row.clone()],
                    &v[row],
                )?;
            }
        }
        Ok(())
    }

    fn copy_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        copies: &[KvCopy],
    ) -> Result<(), StepError> {
        let storage = cache.store_mut::<KvStorage>()?;
        for c in copies {
            storage.copy_positions(c.src, c.dst, layer, c.len)?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        cache: &PagedKvCache,
        layer: usize,
        scores: Scores,
        q: &Self::Rows,
        out: &mut Self::Rows,
    ) -> Result<(), StepError> {
        let attention = Attention {
            plan: &self.plan,
            cache,
            storage: cache.store::<KvStorage>()?,
            layer,
            batch: self.batch,
            first_pos: self.first_pos,
            q,
            scores,
        };
        attention.run(self.attention, self.partials, out)?;
        Ok(())
    }

    fn gated(
        &mut self,
        activation: Activation,
        gate: &mut Self::Rows,
        up: &Self::Rows,
    ) -> Result<(), StepError> {
        gated(activation, gate, up);
        Ok(())
    }

    fn add(&mut self, x: &mut Self::Rows, y: &Self::Rows) -> Result<(), StepError> {
        add_in_place(x, y);
        Ok(())
    }

    fn logit_rows(&mut self, x: &Self::Rows, out: &mut Self::Rows) -> Result<(), StepError> {
        let d = x.len() / self.n_tokens();
        let mut row = 0;
        for chunk in &self.batch.chunks {
            let wanted = match chunk.logits {
                Logits::None => 0..0,
                Logits::Last => chunk.start + chunk.len - 1..chunk.start + chunk.len,
                Logits::All => chunk.start..chunk.start + chunk.len,
            };
            out[row * d..(row + wanted.len()) * d]
                .copy_from_slice(&x[wanted.start * d..wanted.end * d]);
            row += wanted.len();
        }
        Ok(())
    }

    fn logits(
        &mut self,
        x: &Self::Rows,
        m: &Matrix,
        softcap: Option<f32>,
        out: Output<'_>,
    ) -> Result<(), StepError> {
        self.layer.reset();
        let n = x.len() / m.cols;
        let acts = Self::quantize(self.layer, m, x, n)?;
        let product = |logits: &mut [f32]| -> Result<(), StepError> {
            m.matmul(&acts, logits)?;
            if let Some(cap) = softcap {
                logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
            Ok(())
        };
        match out {
            Output::Logits(logits) => product(logits),
            Output::Argmax(tokens) => {
                let logits = take::<f32>(self.layer, LAYER, n * m.rows)?;
                product(logits)?;
                for (token, row) in tokens.iter_mut().zip(logits.chunks_exact(m.rows)) {
                    *token = argmax(row);
                }
                Ok(())
            }
        }
    }
}
