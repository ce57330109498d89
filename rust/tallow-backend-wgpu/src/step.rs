//! One step on the GPU: the operations are recorded into one command encoder and submitted
//! when a result is read back (the logits) or the step ends.

use std::sync::Arc;

use tallow_backend::{
    Activation, BackendError, Draw, Experts, Moe, Output, OutputRows, Routing, Scores, Step,
    StepInput,
};
use tallow_kv::{PageStore, PagedKvCache};

use crate::gpu::{device_error, Buffer, Gpu, Word};
use crate::kernels::{Kernel, Kernels};
use crate::matrix::{Matrix, Part};
use crate::pages::Pages;
use crate::profile::StepProfile;
use crate::WgpuBackend;

/// Activations on the GPU: `len` floats.
pub struct Rows {
    buffer: Buffer,
    len: usize,
}

/// The buffers of the last step, for the next to reuse.
#[derive(Default)]
pub struct Scratch {
    free: Vec<Buffer>,
}

/// The plan of one layer group on the GPU (see [`tallow_backend::GroupPlan`]).
struct GroupBuffers {
    /// (page, position in the page) of each token.
    slots: Buffer,
    /// Per token, where its sequence's page table starts in `tables`, and its position.
    tokens: Buffer,
    tables: Buffer,
}

pub struct WgpuStep<'s> {
    gpu: &'s Arc<Gpu>,
    /// The most bytes of one block of logits.
    max_part: u64,
    kernels: &'s Kernels,
    input: &'s StepInput<'s, WgpuBackend>,
    scratch: &'s mut Scratch,
    /// Buffers handed out by this step, which go back to the scratch at its end.
    used: Vec<Buffer>,
    encoder: wgpu::CommandEncoder,
    ids: Buffer,
    /// The cosines and sines of every token's position, per RoPE.
    angles: Vec<Buffer>,
    groups: Vec<GroupBuffers>,
    profile: Option<StepProfile>,
}

/// The most workgroups along one dimension of a dispatch.
const MAX_GRID: usize = 65_535;

/// The most experts a token may choose (experts.wgsl's MAX_TOP_K).
const MAX_TOP_K: usize = 32;

/// Workgroups for `units` units of work: along x up to the limit of a dimension, the rest
/// along y. Returns (x, y).
fn grid(units: usize) -> (u32, u32) {
    let x = units.clamp(1, MAX_GRID);
    (x as u32, units.div_ceil(x).max(1) as u32)
}

/// Rows holding `values`.
pub(crate) fn upload(gpu: &Gpu, values: &[f32]) -> Result<Rows, BackendError> {
    Ok(Rows {
        buffer: gpu.buffer_with(&bytes_of(values))?,
        len: values.len(),
    })
}

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn words_of(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl<'s> WgpuStep<'s> {
    pub(crate) fn begin(
        backend: &'s WgpuBackend,
        scratch: &'s mut Scratch,
        input: &'s StepInput<'s, WgpuBackend>,
    ) -> Result<Self, BackendError> {
        let gpu = &backend.gpu;
        let batch = input.batch;
        let n = batch.tokens.len();
        let ids = gpu.buffer_with(&words_of(batch.tokens.iter().copied()))?;
        let plan = input.plan;
        let angles = input
            .ropes
            .iter()
            .map(|rope| {
                let mut table = vec![0.0; n * rope.angles_len()];
                rope.angles_of(&plan.positions, &mut table);
                gpu.buffer_with(&bytes_of(&table))
            })
            .collect::<Result<_, _>>()?;
        // The plan goes up once: every layer of a group reads its group's.
        let groups = plan
            .groups
            .iter()
            .map(|group| {
                let slots = group.slots.iter().flat_map(|s| [s.page, s.offset]);
                let tokens = plan.token_chunks.iter().zip(&plan.positions);
                let tokens = tokens.flat_map(|(&c, &pos)| [group.table_starts[c as usize], pos]);
                Ok(GroupBuffers {
                    slots: gpu.buffer_with(&words_of(slots))?,
                    tokens: gpu.buffer_with(&words_of(tokens))?,
                    tables: gpu.buffer_with(&words_of(group.tables.iter().copied()))?,
                })
            })
            .collect::<Result<_, BackendError>>()?;
        Ok(WgpuStep {
            gpu,
            max_part: backend.max_part,
            kernels: &backend.kernels,
            input,
            scratch,
            used: Vec::new(),
            encoder: gpu.device.create_command_encoder(&Default::default()),
            ids,
            angles,
            groups,
            profile: backend.profile.then(|| StepProfile::new(gpu)),
        })
    }

    /// Submits what is recorded and gives this step's buffers to the next.
    pub(crate) fn finish(self) -> Result<(), BackendError> {
        let WgpuStep {
            gpu,
            scratch,
            used,
            encoder,
            profile,
            input,
            ..
        } = self;
        match profile {
            Some(profile) => profile.report(gpu, encoder, input.batch.tokens.len())?,
            None => {
                gpu.checked(|_| gpu.queue.submit([encoder.finish()]))?;
            }
        }
        scratch.free = used;
        Ok(())
    }

    fn n_tokens(&self) -> usize {
        self.input.batch.tokens.len()
    }

    /// Records one dispatch of `kernel` over `groups` workgroups, with `buffers` at their
    /// binding numbers and `params` (words) in the kernel's uniform.
    fn dispatch(
        &mut self,
        kernel: Kernel,
        buffers: &[(u32, &Buffer)],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        let pipeline = self.kernels.get(self.gpu, kernel)?;
        let device = &self.gpu.device;
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (params.len() * 4).next_multiple_of(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: true,
        });
        uniform
            .get_mapped_range_mut(..)
            .map_err(device_error)?
            .slice(..params.len() * 4)
            .copy_from_slice(&words_of(params.iter().copied()));
        uniform.unmap();
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .map(|&(binding, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: kernel.params_binding(),
            resource: uniform.as_entire_binding(),
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let timestamp_writes = self.profile.as_mut().and_then(|p| p.time(kernel));
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes,
            });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        Ok(())
    }

    /// A dispatch of one invocation per value of `n`, 64 to a workgroup, whose parameters
    /// start with `n` and the invocations per row of the grid, then `params`.
    fn dispatch_each(
        &mut self,
        kernel: Kernel,
        buffers: &[(u32, &Buffer)],
        n: usize,
        params: &[u32],
    ) -> Result<(), BackendError> {
        let (x, y) = grid(n.div_ceil(64));
        let mut words = vec![n as u32, x * 64];
        words.extend_from_slice(params);
        self.dispatch(kernel, buffers, &words, (x, y, 1))
    }

    /// A norm kernel over `runs` runs of `width` values, one workgroup each.
    fn norm(
        &mut self,
        kernel: Kernel,
        buffers: &[(u32, &Buffer)],
        runs: usize,
        width: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let (gx, gy) = grid(runs);
        let params = [width as u32, runs as u32, eps.to_bits(), gx];
        self.dispatch(kernel, buffers, &params, (gx, gy, 1))
    }

    /// Submits what is recorded, and reads the first `out.len()` values of `buffer`.
    fn read_back<T: Word>(&mut self, buffer: &Buffer, out: &mut [T]) -> Result<(), BackendError> {
        let fresh = self.gpu.device.create_command_encoder(&Default::default());
        let encoder = std::mem::replace(&mut self.encoder, fresh);
        self.gpu.read(encoder, buffer, out)?;
        Ok(())
    }

    /// The plan of `layer`'s group.
    fn group(&self, layer: usize) -> Result<&GroupBuffers, BackendError> {
        Ok(&self.groups[self.input.plan.group_of(layer)?])
    }

    fn products(&mut self, input: &Rows, m: &Matrix, out: &Rows) -> Result<(), BackendError> {
        let n = input.len / m.cols;
        let per_workgroup = self.kernels.product_shape().rows_per_workgroup();
        for part in &m.parts {
            let (x, y) = grid(part.rows.div_ceil(per_workgroup));
            let params = [
                part.rows as u32,
                m.cols as u32,
                n as u32,
                m.row_bytes as u32,
                part.first_row as u32,
                m.rows as u32,
                x,
                part.buffer_row as u32,
                // The experts' parameters, which `main` does not read.
                0,
                0,
                0,
            ];
            let buffers = [(0, &part.buffer), (1, &input.buffer), (2, &out.buffer)];
            // Blocks of 4 tokens, unless there are only a few (decoding).
            let tokens = if n < 4 { 1 } else { 4 };
            let kernel = Kernel::Matmul(m.ty, tokens);
            let blocks = n.div_ceil(tokens as usize) as u32;
            self.dispatch(kernel, &buffers, &params, (x, y, blocks))?;
        }
        Ok(())
    }
}

/// Experts whose rows of one kind lie in one binding, each `expert_rows` after the last: one
/// dispatch multiplies all their tiles.
struct ExpertRun<'m> {
    part: &'m Part,
    first_expert: usize,
    end_expert: usize,
}

/// The runs of `matrices` (one per expert): usually one, where the stack fits a buffer.
fn expert_runs(matrices: &[Matrix]) -> Vec<ExpertRun<'_>> {
    let mut runs: Vec<ExpertRun<'_>> = Vec::new();
    for (e, m) in matrices.iter().enumerate() {
        for part in &m.parts {
            if let Some(run) = runs.last_mut() {
                let follows = run.end_expert == e
                    && m.parts.len() == 1
                    && run.part.rows == m.rows
                    && run.part.buffer.same(&part.buffer)
                    && run.part.buffer_row + (e - run.first_expert) * m.rows == part.buffer_row;
                if follows {
                    run.end_expert += 1;
                    continue;
                }
            }
            runs.push(ExpertRun {
                part,
                first_expert: e,
                end_expert: e + 1,
            });
        }
    }
    runs
}

/// A mixture-of-experts block's pairs, grouped by expert on the device.
struct Grouped {
    /// Each pair's expert and weight.
    chosen: Rows,
    weights: Rows,
    pairs: Rows,
    tiles: Rows,
    /// Pairs a tile takes (matmul.wgsl's TOKENS).
    per_tile: u32,
}

impl<'s> WgpuStep<'s> {
    /// Routes each token and groups the pairs by expert (experts.wgsl's `route` and `group`).
    fn group_pairs(
        &mut self,
        router: &Rows,
        n_expert: usize,
        moe: Moe,
    ) -> Result<Grouped, BackendError> {
        let (n, k) = (self.n_tokens(), moe.top_k);
        if k > MAX_TOP_K {
            return Err(BackendError::Unsupported(format!(
                "{k} experts a token on wgpu (at most {MAX_TOP_K})"
            )));
        }
        let per_tile: u32 = if n < 4 { 1 } else { 4 };
        // Every expert's run ends in a tile that may not be full.
        let tiles = (n * k).div_ceil(per_tile as usize) + n_expert.min(n * k);
        if tiles > MAX_GRID {
            return Err(BackendError::Unsupported(format!(
                "{n} tokens in one step of a mixture of experts on wgpu"
            )));
        }
        let grouped = Grouped {
            chosen: self.rows(n, k)?,
            weights: self.rows(n, k)?,
            pairs: self.rows(n, k)?,
            tiles: self.rows(tiles, 4)?,
            per_tile,
        };
        let starts = self.rows(n_expert + 1, 1)?;
        let routing = match moe.routing {
            Routing::TopKSoftmax => 0,
            Routing::SoftmaxTopK => 1,
        };
        let (gx, gy) = grid(n.div_ceil(64));
        let params = [n as u32, n_expert as u32, k as u32, routing, gx * 64];
        let buffers = [
            (0, &router.buffer),
            (1, &grouped.chosen.buffer),
            (2, &grouped.weights.buffer),
        ];
        self.dispatch(Kernel::Route, &buffers, &params, (gx, gy, 1))?;
        let params = [n as u32, n_expert as u32, k as u32, per_tile, 0];
        let buffers = [
            (1, &grouped.chosen.buffer),
            (3, &grouped.pairs.buffer),
            (4, &starts.buffer),
            (5, &grouped.tiles.buffer),
        ];
        self.dispatch(Kernel::Group, &buffers, &params, (1, 1, 1))?;
        Ok(grouped)
    }

    /// Each pair's row of `out` (`width` floats) is its expert's matrix of `matrices` times its
    /// row of `input` (row `pair / divisor`).
    fn expert_products(
        &mut self,
        input: &Rows,
        divisor: usize,
        matrices: &[Matrix],
        grouped: &Grouped,
        out: &Rows,
    ) -> Result<(), BackendError> {
        let m = &matrices[0];
        let per_workgroup = self.kernels.product_shape().rows_per_workgroup();
        let kernel = Kernel::MatmulExperts(m.ty, grouped.per_tile);
        let tiles = grouped.tiles.len / 4;
        for run in expert_runs(matrices) {
            let part = run.part;
            let (x, y) = grid(part.rows.div_ceil(per_workgroup));
            let params = [
                part.rows as u32,
                m.cols as u32,
                divisor as u32,
                m.row_bytes as u32,
                part.first_row as u32,
                m.rows as u32,
                x,
                part.buffer_row as u32,
                run.first_expert as u32,
                run.end_expert as u32,
                m.rows as u32,
            ];
            let buffers = [
                (0, &part.buffer),
                (1, &input.buffer),
                (2, &out.buffer),
                (4, &grouped.pairs.buffer),
                (5, &grouped.tiles.buffer),
            ];
            self.dispatch(kernel, &buffers, &params, (x, y, tiles as u32))?;
        }
        Ok(())
    }

    /// Adds each pair's expert's bias (`biases`: every expert's, `width` floats each).
    fn expert_biases(
        &mut self,
        rows: &Rows,
        biases: &Rows,
        grouped: &Grouped,
        width: usize,
    ) -> Result<(), BackendError> {
        let k = grouped.chosen.len / self.n_tokens();
        let (gx, gy) = grid(rows.len.div_ceil(64));
        let params = [self.n_tokens() as u32, 0, k as u32, width as u32, gx * 64];
        let buffers = [
            (1, &grouped.chosen.buffer),
            (6, &rows.buffer),
            (7, &biases.buffer),
        ];
        self.dispatch(Kernel::AddBiases, &buffers, &params, (gx, gy, 1))
    }
}

impl<'s> Step<WgpuBackend> for WgpuStep<'s> {
    type Rows = Rows;

    fn rows(&mut self, n: usize, width: usize) -> Result<Rows, BackendError> {
        let size = ((n * width * 4).max(4)) as u64;
        let buffer = match self.scratch.free.iter().position(|b| b.size() == size) {
            Some(i) => self.scratch.free.swap_remove(i),
            None => self.gpu.zeroed(size)?,
        };
        self.used.push(buffer.clone());
        Ok(Rows {
            buffer,
            len: n * width,
        })
    }

    fn upload(&mut self, values: &[f32], _width: usize) -> Result<Rows, BackendError> {
        upload(self.gpu, values)
    }

    fn read(&mut self, x: &Rows, out: &mut [f32]) -> Result<(), BackendError> {
        let n = out.len().min(x.len);
        self.read_back(&x.buffer.clone(), &mut out[..n])
    }

    fn embed(&mut self, table: &Matrix, scale: f32, out: &mut Rows) -> Result<(), BackendError> {
        let n = self.n_tokens();
        let ids = self.ids.clone();
        for part in &table.parts {
            let (x, y) = grid((n * table.cols / 32).div_ceil(64));
            let params = [
                part.rows as u32,
                table.cols as u32,
                n as u32,
                table.row_bytes as u32,
                part.first_row as u32,
                scale.to_bits(),
                x * 64,
                part.buffer_row as u32,
            ];
            let buffers = [(0, &part.buffer), (1, &ids), (2, &out.buffer)];
            self.dispatch(Kernel::Embed(table.ty), &buffers, &params, (x, y, 1))?;
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &Rows,
        gain: &Rows,
        eps: f32,
        out: &mut Rows,
    ) -> Result<(), BackendError> {
        let buffers = [(0, &x.buffer), (1, &gain.buffer), (2, &out.buffer)];
        self.norm(Kernel::Norm, &buffers, x.len / gain.len, gain.len, eps)
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut Rows,
        gain: &Rows,
        eps: f32,
    ) -> Result<(), BackendError> {
        let buffers = [(1, &gain.buffer), (2, &x.buffer)];
        self.norm(
            Kernel::NormInPlace,
            &buffers,
            x.len / gain.len,
            gain.len,
            eps,
        )
    }

    fn matmul<const N: usize>(
        &mut self,
        input: &Rows,
        matrices: [&Matrix; N],
        outs: [&mut Rows; N],
    ) -> Result<(), BackendError> {
        for (m, out) in matrices.into_iter().zip(outs) {
            self.products(input, m, out)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, x: &mut Rows, bias: &Rows) -> Result<(), BackendError> {
        let buffers = [(0, &x.buffer), (1, &bias.buffer)];
        self.dispatch_each(Kernel::AddBias, &buffers, x.len, &[bias.len as u32])
    }

    fn rope(&mut self, rope: usize, x: &mut Rows) -> Result<(), BackendError> {
        let n = self.n_tokens();
        let r = &self.input.ropes[rope];
        let pairs = r.inv_freq().len();
        let heads = x.len / n / r.head_dim();
        let (gx, gy) = grid((n * heads * pairs).div_ceil(64));
        let params = [
            n as u32,
            heads as u32,
            r.head_dim() as u32,
            pairs as u32,
            u32::from(r.style() == tallow_backend::RopeStyle::Halves),
            gx * 64,
        ];
        let angles = self.angles[rope].clone();
        let buffers = [(0, &x.buffer), (1, &angles)];
        self.dispatch(Kernel::Rope, &buffers, &params, (gx, gy, 1))
    }

    fn write_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        k: &mut Rows,
        v: &mut Rows,
    ) -> Result<(), BackendError> {
        let slots = self.group(layer)?.slots.clone();
        let store = cache.store::<Pages>()?;
        let l = *cache.layout();
        let n = self.n_tokens();
        let (gx, gy) = grid((n * l.n_head_kv * l.head_dim / 2).div_ceil(64));
        let params = [
            n as u32,
            l.n_head_kv as u32,
            l.head_dim as u32,
            l.page_size as u32,
            store.n_pages() as u32,
            gx * 64,
        ];
        let pages = store.of_layer(layer).clone();
        let buffers = [(0, &k.buffer), (1, &v.buffer), (2, &slots), (3, &pages)];
        self.dispatch(Kernel::WriteKv, &buffers, &params, (gx, gy, 1))?;
        let group = self.input.plan.group(layer)?;
        for copy in &group.copies {
            store.record_copy(&mut self.encoder, copy, layer)?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        cache: &PagedKvCache,
        layer: usize,
        scores: Scores,
        sinks: Option<&Rows>,
        q: &mut Rows,
        out: &mut Rows,
    ) -> Result<(), BackendError> {
        let group = self.group(layer)?;
        let (tokens, tables) = (group.tokens.clone(), group.tables.clone());
        let store = cache.store::<Pages>()?;
        let l = *cache.layout();
        let n = self.n_tokens();
        let n_head = q.len / n / l.head_dim;
        let (gx, gy) = grid(n * n_head);
        let params = [
            n_head as u32,
            l.n_head_kv as u32,
            l.head_dim as u32,
            l.page_size as u32,
            store.n_pages() as u32,
            scores.scale.to_bits(),
            scores.softcap.unwrap_or(0.0).to_bits(),
            scores.window.unwrap_or(0) as u32,
            gx,
            u32::from(sinks.is_some()),
        ];
        let pages = store.of_layer(layer).clone();
        // Without sinks the kernel reads none: any buffer will do.
        let sinks = sinks.map_or(&q.buffer, |s| &s.buffer);
        let buffers = [
            (0, &q.buffer),
            (1, &tokens),
            (2, &tables),
            (3, &pages),
            (4, &out.buffer),
            (6, sinks),
        ];
        self.dispatch(Kernel::Attention, &buffers, &params, (gx, gy, 1))
    }

    fn gated(
        &mut self,
        activation: Activation,
        gate: &mut Rows,
        up: &Rows,
    ) -> Result<(), BackendError> {
        let activation = match activation {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
            Activation::ClampedSwiglu => 2,
        };
        let buffers = [(0, &gate.buffer), (1, &up.buffer)];
        self.dispatch_each(Kernel::Gated, &buffers, gate.len, &[activation])
    }

    fn experts(
        &mut self,
        x: &Rows,
        router: &Rows,
        experts: &Experts<WgpuBackend>,
        moe: Moe,
        out: &mut Rows,
    ) -> Result<(), BackendError> {
        let (n, k) = (self.n_tokens(), moe.top_k);
        let d = x.len / n;
        let ff = experts.gate[0].rows;
        let grouped = self.group_pairs(router, experts.len(), moe)?;
        let mut gate = self.rows(n * k, ff)?;
        let up = self.rows(n * k, ff)?;
        self.expert_products(x, k, &experts.gate, &grouped, &gate)?;
        self.expert_products(x, k, &experts.up, &grouped, &up)?;
        if let Some([gate_bias, up_bias, _]) = &experts.biases {
            self.expert_biases(&gate, gate_bias, &grouped, ff)?;
            self.expert_biases(&up, up_bias, &grouped, ff)?;
        }
        self.gated(moe.activation, &mut gate, &up)?;
        let down = self.rows(n * k, d)?;
        self.expert_products(&gate, 1, &experts.down, &grouped, &down)?;
        if let Some([_, _, down_bias]) = &experts.biases {
            self.expert_biases(&down, down_bias, &grouped, d)?;
        }
        let (gx, gy) = grid(out.len.div_ceil(64));
        let params = [n as u32, 0, k as u32, d as u32, gx * 64];
        let buffers = [
            (2, &grouped.weights.buffer),
            (6, &out.buffer),
            (7, &down.buffer),
        ];
        self.dispatch(Kernel::Combine, &buffers, &params, (gx, gy, 1))
    }

    fn scale_by_sigmoid(&mut self, x: &mut Rows, gates: &Rows) -> Result<(), BackendError> {
        let buffers = [(0, &x.buffer), (1, &gates.buffer)];
        let width = (x.len / gates.len) as u32;
        self.dispatch_each(Kernel::ScaleBySigmoid, &buffers, x.len, &[width])
    }

    fn add(&mut self, x: &mut Rows, y: &Rows) -> Result<(), BackendError> {
        let buffers = [(0, &x.buffer), (1, &y.buffer)];
        self.dispatch_each(Kernel::Add, &buffers, x.len, &[0])
    }

    fn output_rows(
        &mut self,
        x: &Rows,
        which: OutputRows,
        out: &mut Rows,
    ) -> Result<(), BackendError> {
        let d = (x.len / self.n_tokens()) as u64 * 4;
        // Runs of consecutive rows go in one copy.
        let rows = which.of(self.input.plan);
        let mut i = 0;
        while i < rows.len() {
            let first = rows[i];
            let len = rows[i..]
                .iter()
                .zip(first..)
                .take_while(|(&row, want)| row == *want)
                .count();
            self.encoder.copy_buffer_to_buffer(
                &x.buffer,
                u64::from(first) * d,
                &out.buffer,
                i as u64 * d,
                len as u64 * d,
            );
            i += len;
        }
        Ok(())
    }

    fn logits(
        &mut self,
        x: &Rows,
        m: &Matrix,
        softcap: Option<f32>,
        mut out: Output<'_>,
    ) -> Result<(), BackendError> {
        let n = x.len / m.cols;
        let on_host = match &out {
            Output::Selected { .. } => true,
            Output::Draw { draws, .. } => !draws.iter().all(Draw::is_greedy),
            Output::Logits(_) => false,
        };
        if on_host {
            // A few tokens' logits, or tokens drawn at a temperature: every logit comes back
            // and they are chosen on the host.
            let mut all = vec![0f32; n * m.rows];
            self.logits(x, m, softcap, Output::Logits(&mut all))?;
            return out.take_from(&all, m.rows);
        }
        // Blocks of rows whose logits fit one buffer (a large vocabulary's rows of a long
        // chunk do not): each block's logits are read back as it is done, or its greedy
        // tokens gathered on the device and read back once at the end.
        let tokens = match out {
            Output::Draw { .. } => Some(self.rows(n, 1)?),
            Output::Logits(_) | Output::Selected { .. } => None,
        };
        let per_block = (self.max_part as usize / (m.rows * 4)).clamp(1, n.max(1));
        for first in (0..n).step_by(per_block) {
            let rows = per_block.min(n - first);
            let input = if rows == n {
                Rows {
                    buffer: x.buffer.clone(),
                    len: x.len,
                }
            } else {
                let block = self.rows(rows, m.cols)?;
                let row_bytes = (m.cols * 4) as u64;
                self.encoder.copy_buffer_to_buffer(
                    &x.buffer,
                    first as u64 * row_bytes,
                    &block.buffer,
                    0,
                    rows as u64 * row_bytes,
                );
                block
            };
            let logits = self.rows(rows, m.rows)?;
            self.products(&input, m, &logits)?;
            if let Some(cap) = softcap {
                let buffers = [(0, &logits.buffer)];
                self.dispatch_each(Kernel::Softcap, &buffers, logits.len, &[cap.to_bits()])?;
            }
            if let Some(tokens) = &tokens {
                let (gx, gy) = grid(rows);
                let buffers = [(0, &logits.buffer), (1, &tokens.buffer)];
                let params = [m.rows as u32, rows as u32, first as u32, gx];
                self.dispatch(Kernel::Argmax, &buffers, &params, (gx, gy, 1))?;
            } else if let Output::Logits(out) = &mut out {
                let out = &mut out[first * m.rows..(first + rows) * m.rows];
                self.read_back(&logits.buffer, out)?;
            }
        }
        if let (Output::Draw { tokens: out, .. }, Some(tokens)) = (out, tokens) {
            self.read_back(&tokens.buffer, out)?;
        }
        Ok(())
    }
}
