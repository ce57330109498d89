//! Where a step's time goes on the GPU (`WgpuOptions::profile`, `TALLOW_WGPU_PROFILE=1` in
//! tallow): each dispatch's compute pass writes a timestamp at its beginning and its end, and at
//! the step's end they are read back and one line goes to stderr: the step's tokens, its host
//! time, the GPU time of all its dispatches and of each kernel, the slowest first. For finding
//! what to speed up on a real GPU; it costs a read back per step.

use std::collections::HashMap;
use std::time::Instant;

use tallow_backend::BackendError;

use crate::gpu::Gpu;
use crate::kernels::Kernel;

/// Dispatches a step times at most (the rest go untimed): wgpu's most queries in a set, 4096,
/// are two per dispatch.
const CAPACITY: u32 = 2048;

/// The timestamps of one step's dispatches.
pub(crate) struct StepProfile {
    queries: wgpu::QuerySet,
    kernels: Vec<Kernel>,
    started: Instant,
}

impl StepProfile {
    pub(crate) fn new(gpu: &Gpu) -> StepProfile {
        StepProfile {
            queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * CAPACITY,
            }),
            kernels: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Where the pass of a dispatch of `kernel` writes its timestamps (none past the capacity).
    pub(crate) fn time(&mut self, kernel: Kernel) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.kernels.len() as u32;
        if i >= CAPACITY {
            return None;
        }
        self.kernels.push(kernel);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Reads the timestamps back after `encoder` (the step's last) and prints the step's line.
    pub(crate) fn report(
        self,
        gpu: &Gpu,
        mut encoder: wgpu::CommandEncoder,
        tokens: usize,
    ) -> Result<(), BackendError> {
        let n = self.kernels.len() as u32;
        let resolved = gpu.create(&wgpu::BufferDescriptor {
            label: Some("profile"),
            size: u64::from(2 * n.max(1)) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })?;
        encoder.resolve_query_set(&self.queries, 0..2 * n, &resolved, 0);
        let mut words = vec![0u32; 4 * n as usize];
        gpu.read(encoder, &resolved, &mut words)?;
        let host = self.started.elapsed().as_secs_f64() * 1e3;
        let tick_ms = f64::from(gpu.queue.get_timestamp_period()) * 1e-6;
        let mut per_kernel: HashMap<Kernel, (f64, usize)> = HashMap::new();
        for (kernel, w) in self.kernels.iter().zip(words.chunks_exact(4)) {
            let begin = u64::from(w[0]) | (u64::from(w[1]) << 32);
            let end = u64::from(w[2]) | (u64::from(w[3]) << 32);
            let entry = per_kernel.entry(*kernel).or_default();
            entry.0 += end.saturating_sub(begin) as f64 * tick_ms;
            entry.1 += 1;
        }
        let mut kernels: Vec<_> = per_kernel.into_iter().collect();
        kernels.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let total: f64 = kernels.iter().map(|(_, (ms, _))| ms).sum();
        let each: Vec<String> = kernels
            .iter()
            .map(|(k, (ms, count))| format!("{k:?} {ms:.3} ms ({count})"))
            .collect();
        eprintln!(
            "wgpu step: {tokens} tokens, {n} dispatches, host {host:.3} ms, gpu {total:.3} ms: {}",
            each.join(", ")
        );
        Ok(())
    }
}
