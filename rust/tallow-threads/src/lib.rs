//! A persistent pool of worker threads for the engine's parallel loops.
//!
//! One forward pass runs a few hundred short parallel loops (one per matrix product, one per
//! attention layer). [`ThreadPool::run`] hands such a loop to workers that are already running
//! and spinning, so a loop costs a few atomic operations rather than a wake-up per task, and
//! it makes no heap allocation: the task closure is passed by reference and every worker
//! claims task indices from one shared counter.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use tallow_threads::ThreadPool;
//!
//! let pool = ThreadPool::new(2);
//! let sum = AtomicUsize::new(0);
//! pool.run(100, &|task, _worker| {
//!     sum.fetch_add(task, Ordering::Relaxed);
//! });
//! assert_eq!(sum.into_inner(), 4950);
//! ```

#![warn(missing_docs)]

mod disjoint;
mod pool;

pub use disjoint::DisjointSlice;
pub use pool::{Task, ThreadPool};

use std::sync::OnceLock;

/// Environment variable that sets the number of threads of the [`global`] pool.
pub const THREADS_ENV: &str = "TALLOW_NUM_THREADS";

/// The process-wide pool, created on first use with as many threads as `TALLOW_NUM_THREADS`
/// says, or else one per available core.
pub fn global() -> &'static ThreadPool {
    static POOL: OnceLock<ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| ThreadPool::new(default_threads()))
}

fn default_threads() -> usize {
    std::env::var(THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}
