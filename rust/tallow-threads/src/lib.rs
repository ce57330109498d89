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
mod subnormals;

pub use disjoint::DisjointSlice;
pub use pool::{Task, ThreadPool};
pub use subnormals::FlushSubnormals;

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Environment variable that sets the number of threads of the [`global`] pool.
pub const THREADS_ENV: &str = "TALLOW_NUM_THREADS";

/// The process-wide pool, created on first use with as many threads as `TALLOW_NUM_THREADS`
/// says, or else one per available core.
///
/// A child made by `fork` has only the thread that forked: the parent's pool, whose workers
/// stayed behind, would wait for them forever. The first call in the child makes the child a
/// pool of its own.
pub fn global() -> &'static ThreadPool {
    let forks = FORKS.load(Ordering::Acquire);
    let current = GLOBAL.load(Ordering::Acquire);
    // SAFETY: a pool published in GLOBAL is never freed.
    match unsafe { current.as_ref() } {
        Some(global) if global.forks == forks => &global.pool,
        _ => replace_global(current, forks),
    }
}

/// The global pool of the process that has seen `forks` forks.
struct Global {
    pool: ThreadPool,
    forks: u64,
}

static GLOBAL: AtomicPtr<Global> = AtomicPtr::new(ptr::null_mut());

/// Forks this process descends through since the first pool was made (counted in each child).
static FORKS: AtomicU64 = AtomicU64::new(0);

#[cold]
fn replace_global(mut seen: *mut Global, forks: u64) -> &'static ThreadPool {
    count_forks();
    let fresh = Box::into_raw(Box::new(Global {
        pool: ThreadPool::new(default_threads()),
        forks,
    }));
    loop {
        match GLOBAL.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The pool replaced (a parent's, none of whose workers run in this process) is
            // left as it is: dropping it would wait for them.
            // SAFETY: `fresh` is published and never freed.
            Ok(_) => return unsafe { &(*fresh).pool },
            Err(other) => {
                // SAFETY: as in `global`.
                if let Some(global) = unsafe { other.as_ref() } {
                    if global.forks == forks {
                        // Another thread made this process's pool first.
                        // SAFETY: `fresh` was never published.
                        drop(unsafe { Box::from_raw(fresh) });
                        return &global.pool;
                    }
                }
                seen = other;
            }
        }
    }
}

/// Has every child made by `fork` count itself in [`FORKS`] (once per process).
fn count_forks() {
    #[cfg(unix)]
    {
        static WATCH: std::sync::Once = std::sync::Once::new();
        extern "C" fn in_child() {
            FORKS.fetch_add(1, Ordering::AcqRel);
        }
        // SAFETY: the handler only touches an atomic, as a handler run after fork must.
        WATCH.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
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
