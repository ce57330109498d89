//! Launches kept and run again as one: a device whose API records a run of launches as a
//! graph and replays it with one call (CUDA graphs). A decode step of a small model is
//! hundreds of short kernels, each costing the host a few microseconds to launch, more than
//! the GPU takes to run it; replayed, the step costs one call and the GPU runs the kernels
//! back to back.
//!
//! [`Replayed`] wraps such a device. It keeps each launch instead of issuing it, until the
//! host next touches device memory (a write, a read, a large copy, a free; a small copy is
//! kept as a launch of the `copy_bytes` kernel): the launches
//! kept by then are a run, and every step of a model is the same few runs (the step's
//! forward after its plan is uploaded, the draw before its ids are read back). A run whose
//! kernels come in the same order as a kept graph's is replayed by that graph, after its
//! launches whose grid or arguments differ (a buffer at another address, another count of
//! positions) are updated in it; a run seen once before with those kernels is recorded as a
//! graph; a run never seen is launched kernel by kernel, so a one-off step (a prompt of a
//! new shape) costs no recording.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tallow_backend::BackendError;
use tallow_quant::GgmlType;

use crate::gpu::{Args, DevicePtr, Gpu};
use crate::kernels::{AttentionTile, Product};

/// A kernel launch: its name, grid, block and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: Args,
}

/// What a device that replays runs of launches offers.
pub trait Replay: Gpu {
    /// A run of launches recorded for replay.
    type Graph: Send;

    /// `launches` recorded as a graph, each to run after the one before it.
    fn record(&self, launches: &[Launch]) -> Result<Self::Graph, BackendError>;

    /// Sets the `index`th launch of `graph` to `launch`, a launch of the same kernel.
    fn update(
        &self,
        graph: &mut Self::Graph,
        index: usize,
        launch: &Launch,
    ) -> Result<(), BackendError>;

    /// Runs `graph`, in order with the device's other work.
    fn replay(&self, graph: &Self::Graph) -> Result<(), BackendError>;
}

/// How many graphs are kept (the least recently replayed goes first): a model's steps take a
/// few (a forward, a draw; a batch of another size may take other kernels).
const KEPT_GRAPHS: usize = 8;

/// How many runs never replayed are remembered, to record one the second time it comes.
const REMEMBERED_RUNS: usize = 32;

/// A run of launches this long is issued without waiting for the host to touch memory: a
/// long prompt's step should not sit on the host while the GPU idles.
const MOST_KEPT_LAUNCHES: usize = 4096;

/// The largest copy kept in a run as a launch of the `copy_bytes` kernel (a byte a thread,
/// in blocks of [`COPY_BLOCK`]); a larger one issues the run and copies through the API.
const MOST_LAUNCHED_COPY_BYTES: usize = 1 << 20;
const COPY_BLOCK: u32 = 256;

/// What a [`Replayed`] device did with its runs of launches.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCounts {
    /// Runs launched kernel by kernel.
    pub launched: u64,
    /// Runs recorded as graphs.
    pub recorded: u64,
    /// Runs replayed by a graph kept from an earlier run (not counting the replay of a run
    /// just recorded).
    pub replayed: u64,
    /// Launches of kept graphs set to another grid or arguments before a replay.
    pub updated: u64,
}

/// A graph and the launches it runs now.
struct Kept<T> {
    launches: Vec<Launch>,
    graph: T,
}

/// The launches not issued yet, the graphs kept and the runs seen.
struct Recorder<T> {
    pending: Vec<Launch>,
    /// Least recently replayed first.
    kept: Vec<Kept<T>>,
    /// The kernels of runs launched kernel by kernel, most recent last.
    seen: VecDeque<Vec<String>>,
    /// Why the launches kept when memory was freed did not run: told at the next call that
    /// can fail.
    failed: Option<BackendError>,
    counts: ReplayCounts,
}

/// A device whose runs of launches are replayed as graphs (see the module's comment).
pub struct Replayed<G: Replay> {
    /// `None` where launches go straight to the device.
    recorder: Option<Mutex<Recorder<G::Graph>>>,
    gpu: G,
}

/// Whether two runs launch the same kernels in the same order.
fn same_kernels<'a>(a: impl ExactSizeIterator<Item = &'a str>, b: &[Launch]) -> bool {
    a.len() == b.len() && a.zip(b).all(|(a, b)| a == b.name)
}

impl<G: Replay> Replayed<G> {
    /// `gpu` with its runs of launches replayed as graphs.
    pub fn new(gpu: G) -> Self {
        Replayed {
            recorder: Some(Mutex::new(Recorder {
                pending: Vec::new(),
                kept: Vec::new(),
                seen: VecDeque::new(),
                failed: None,
                counts: ReplayCounts::default(),
            })),
            gpu,
        }
    }

    /// `gpu` with every launch issued as it comes.
    pub fn direct(gpu: G) -> Self {
        Replayed {
            recorder: None,
            gpu,
        }
    }

    /// The device.
    pub fn gpu(&self) -> &G {
        &self.gpu
    }

    /// What was done with the runs of launches so far (nothing, where launches go straight
    /// to the device).
    pub fn counts(&self) -> ReplayCounts {
        (self.recorder.as_ref())
            .map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).counts)
            .unwrap_or_default()
    }

    /// Issues the launches kept so far, before the host touches device memory.
    fn flush(&self) -> Result<(), BackendError> {
        let Some(recorder) = &self.recorder else {
            return Ok(());
        };
        let mut recorder = recorder.lock().unwrap_or_else(|e| e.into_inner());
        self.issue(&mut recorder)
    }

    fn issue(&self, recorder: &mut Recorder<G::Graph>) -> Result<(), BackendError> {
        if let Some(error) = recorder.failed.take() {
            // The launches kept since were to run after the ones that failed: dropped too.
            recorder.pending.clear();
            return Err(error);
        }
        let run = std::mem::take(&mut recorder.pending);
        if run.is_empty() {
            return Ok(());
        }
        // The most recently replayed first: a model's next step is most often its last one's.
        let kept = (recorder.kept.iter())
            .rposition(|k| same_kernels(k.launches.iter().map(|l| l.name.as_str()), &run));
        if let Some(i) = kept {
            let mut kept = recorder.kept.remove(i);
            // A graph the device can neither update nor record anew is dropped, and the run
            // launched kernel by kernel.
            if let Ok(updated) = self.update(&mut kept, &run, &mut recorder.counts) {
                kept.launches = run;
                recorder.counts.updated += updated;
                self.gpu.replay(&kept.graph)?;
                recorder.counts.replayed += 1;
                recorder.kept.push(kept);
                return Ok(());
            }
            return self.launch_each(&run, &mut recorder.counts);
        }
        let seen =
            (recorder.seen.iter()).position(|s| same_kernels(s.iter().map(String::as_str), &run));
        match seen {
            Some(i) => {
                recorder.seen.remove(i);
                // A graph the device cannot record (out of memory, say): launched one by one.
                let Ok(graph) = self.gpu.record(&run) else {
                    return self.launch_each(&run, &mut recorder.counts);
                };
                recorder.counts.recorded += 1;
                self.gpu.replay(&graph)?;
                if recorder.kept.len() == KEPT_GRAPHS {
                    recorder.kept.remove(0);
                }
                recorder.kept.push(Kept {
                    launches: run,
                    graph,
                });
                Ok(())
            }
            None => {
                if recorder.seen.len() == REMEMBERED_RUNS {
                    recorder.seen.pop_front();
                }
                (recorder.seen).push_back(run.iter().map(|l| l.name.clone()).collect());
                self.launch_each(&run, &mut recorder.counts)
            }
        }
    }

    /// Launches `run` kernel by kernel.
    fn launch_each(&self, run: &[Launch], counts: &mut ReplayCounts) -> Result<(), BackendError> {
        for Launch {
            name,
            grid,
            block,
            args,
        } in run
        {
            self.gpu.launch(name, *grid, *block, args)?;
        }
        counts.launched += 1;
        Ok(())
    }

    /// Sets `kept`'s launches that differ from `run`'s (the same kernels) to them, and
    /// gives how many did. Where the device refuses an update, the graph is recorded anew.
    fn update(
        &self,
        kept: &mut Kept<G::Graph>,
        run: &[Launch],
        counts: &mut ReplayCounts,
    ) -> Result<u64, BackendError> {
        let mut updated = 0;
        for (index, (now, launch)) in kept.launches.iter().zip(run).enumerate() {
            if now != launch {
                if self.gpu.update(&mut kept.graph, index, launch).is_err() {
                    kept.graph = self.gpu.record(run)?;
                    counts.recorded += 1;
                    return Ok(0);
                }
                updated += 1;
            }
        }
        Ok(updated)
    }
}

impl<G: Replay> Gpu for Replayed<G> {
    fn api(&self) -> &'static str {
        self.gpu.api()
    }

    fn name(&self) -> String {
        self.gpu.name()
    }

    fn product(&self, ty: GgmlType, n_tokens: usize) -> Product {
        self.gpu.product(ty, n_tokens)
    }

    fn attention_tile(&self, head_dims: usize) -> Option<AttentionTile> {
        self.gpu.attention_tile(head_dims)
    }

    fn max_part(&self) -> Option<usize> {
        self.gpu.max_part()
    }

    fn draws_at_temperature(&self) -> bool {
        self.gpu.draws_at_temperature()
    }

    fn total_memory(&self) -> Option<u64> {
        self.gpu.total_memory()
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        // Fresh memory: no kept launch reaches it.
        self.gpu.alloc(bytes)
    }

    fn borrow(
        &self,
        region: &[u8],
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Option<DevicePtr>, BackendError> {
        self.gpu.borrow(region, owner)
    }

    fn free(&self, ptr: DevicePtr) {
        // A launch kept may read what is freed: it goes first.
        if let Some(recorder) = &self.recorder {
            let mut recorder = recorder.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(error) = self.issue(&mut recorder) {
                recorder.failed = Some(error);
            }
        }
        self.gpu.free(ptr);
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
        self.flush()?;
        self.gpu.write(dst, bytes)
    }

    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        self.flush()?;
        self.gpu.read(src, out)
    }

    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        if self.recorder.is_some() && (1..=MOST_LAUNCHED_COPY_BYTES).contains(&bytes) {
            // Kept in the run as a kernel: a step whose branches copy their parents' positions
            // layer by layer stays one run instead of one per layer.
            let mut args = Args::new();
            args.ptr(src).ptr(dst).int(bytes)?;
            let grid = [bytes.div_ceil(COPY_BLOCK as usize) as u32, 1, 1];
            return self.launch("copy_bytes", grid, [COPY_BLOCK, 1, 1], &args);
        }
        self.flush()?;
        self.gpu.copy(src, dst, bytes)
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError> {
        let Some(recorder) = &self.recorder else {
            return self.gpu.launch(name, grid, block, args);
        };
        let mut recorder = recorder.lock().unwrap_or_else(|e| e.into_inner());
        recorder.pending.push(Launch {
            name: name.into(),
            grid,
            block,
            args: args.clone(),
        });
        if recorder.pending.len() == MOST_KEPT_LAUNCHES {
            self.issue(&mut recorder)?;
        }
        Ok(())
    }
}
