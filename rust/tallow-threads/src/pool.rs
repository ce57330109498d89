//! The pool and its dispatch protocol.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::subnormals;

/// The body of a parallel loop: called once per task index with the index of the worker
/// running it (0 is the calling thread, `1..threads()` the pool's own threads).
pub type Task<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// How long an idle worker spins, watching for the next loop, before it sleeps. Loops inside one
/// forward pass follow each other within microseconds; between passes the workers sleep.
const SPIN: Duration = Duration::from_micros(200);

thread_local! {
    /// The worker index of the current thread while it runs tasks of some pool: a loop started
    /// from inside a task runs inline on that thread instead of waiting for busy workers.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A fixed set of threads that run parallel loops handed to them by [`ThreadPool::run`].
///
/// One loop runs at a time; a second thread calling `run` meanwhile waits for it. A loop started
/// from inside a task of a running loop runs serially on that task's thread. A panic in a task
/// is resumed on the calling thread once every worker has left the loop.
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// Held for the duration of one loop.
    dispatch: Mutex<()>,
}

/// State shared between the dispatching thread and the workers.
///
/// Protocol: the dispatcher (holding `dispatch`) writes `task`, `n_tasks`, `next` and `busy`,
/// then increments `epoch`. A worker that sees a new epoch claims task indices from `next`
/// until they run out, then decrements `busy`. The dispatcher returns (and so the task's borrow
/// ends) only once `busy` is back to zero, so no worker reads `task` after that, and nobody
/// writes it while a worker may read it.
struct Shared {
    task: UnsafeCell<Option<*const Task<'static>>>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    /// Workers that have not yet finished the current loop.
    busy: AtomicUsize,
    epoch: AtomicU64,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// How the current loop's tasks handle subnormals: as its dispatcher does
    /// (`subnormals::mode`).
    subnormals: AtomicU32,
    /// The first panic a worker caught during the current loop.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `task` is only written by the dispatcher while no worker reads it (see the protocol
// above); the closure it points to is `Sync`. Everything else is atomics and mutexes.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under the protocol.
unsafe impl Send for Shared {}

impl ThreadPool {
    /// A pool that runs loops on `threads` threads in all: the calling thread plus
    /// `threads - 1` workers started now (`threads` 0 is taken as 1).
    ///
    /// # Panics
    /// If the operating system cannot start a thread.
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            task: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            subnormals: AtomicU32::new(0),
            panic: Mutex::new(None),
        });
        let handles = (1..threads.max(1))
            .map(|id| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("tallow-worker-{id}"))
                    .spawn(move || shared.worker_main(id))
                    .expect("failed to start a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            handles,
            dispatch: Mutex::new(()),
        }
    }

    /// Threads that run a loop, the caller included.
    pub fn threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Calls `task(i, worker)` once for every `i` in `0..n_tasks`, spread over the pool's
    /// threads, and returns when all calls have returned. Tasks are claimed in increasing order
    /// from a shared counter, so threads that finish early take more. No two calls running at
    /// the same time get the same `worker`, which makes it an index into per-thread scratch.
    /// Every thread runs its tasks in the calling thread's handling of subnormal floats
    /// ([`crate::FlushSubnormals`]).
    ///
    /// # Panics
    /// Resumes the panic of a task, after every task has finished or been skipped.
    pub fn run(&self, n_tasks: usize, task: &Task<'_>) {
        if n_tasks == 0 {
            return;
        }
        if let Some(worker) = WORKER.get() {
            return (0..n_tasks).for_each(|i| task(i, worker));
        }
        if self.handles.is_empty() || n_tasks == 1 {
            return (0..n_tasks).for_each(|i| task(i, 0));
        }
        let _dispatch = self.dispatch.lock().unwrap_or_else(PoisonError::into_inner);
        let shared = &*self.shared;
        // SAFETY: lifetime erasure only; the pointer is cleared before this call returns and
        // no worker reads it after `busy` reaches zero (see `Shared`).
        let erased: *const Task<'static> = unsafe { std::mem::transmute(task) };
        // SAFETY: every worker finished the previous loop (`busy` was zero when it returned)
        // and none reads `task` before the epoch below changes.
        unsafe { *shared.task.get() = Some(erased) };
        shared.n_tasks.store(n_tasks, Ordering::Relaxed);
        shared.next.store(0, Ordering::Relaxed);
        shared.busy.store(self.handles.len(), Ordering::Relaxed);
        shared
            .subnormals
            .store(subnormals::mode(), Ordering::Relaxed);
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _sleep = shared.lock_sleep();
            shared.wake.notify_all();
        }

        WORKER.set(Some(0));
        let own = panic::catch_unwind(AssertUnwindSafe(|| shared.claim_tasks(0)));
        WORKER.set(None);
        if own.is_err() {
            // As a worker does: hand out no more tasks.
            shared.next.store(n_tasks, Ordering::Relaxed);
        }
        shared.wait_idle();
        // SAFETY: `busy` is zero: no worker reads `task` until the next epoch.
        unsafe { *shared.task.get() = None };

        if let Err(payload) = own {
            panic::resume_unwind(payload);
        }
        let worker_panic = shared
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(payload) = worker_panic {
            panic::resume_unwind(payload);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let shared = &*self.shared;
        shared.shutdown.store(true, Ordering::SeqCst);
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _sleep = shared.lock_sleep();
            shared.wake.notify_all();
        }
        for handle in self.handles.drain(..) {
            // A worker never panics outside `catch_unwind`; nothing to report if it did.
            let _ = handle.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Shared {
    fn worker_main(&self, id: usize) {
        WORKER.set(Some(id));
        let mut seen = 0;
        // A new thread's mode: IEEE subnormals.
        let mut mode = 0;
        loop {
            seen = self.wait_for_loop(seen);
            if self.shutdown.load(Ordering::SeqCst) {
                return;
            }
            let wanted = self.subnormals.load(Ordering::Relaxed);
            if wanted != mode {
                subnormals::set_mode(wanted);
                mode = wanted;
            }
            if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| self.claim_tasks(id))) {
                // Stop handing out tasks (past the last one, so that later claims, which add
                // one each, never wrap around to run a task again); the dispatcher resumes
                // the panic.
                self.next
                    .store(self.n_tasks.load(Ordering::Relaxed), Ordering::Relaxed);
                let mut slot = self.panic.lock().unwrap_or_else(PoisonError::into_inner);
                slot.get_or_insert(payload);
            }
            self.busy.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs tasks of the current loop until none is left.
    fn claim_tasks(&self, worker: usize) {
        // SAFETY: called between the epoch change and this thread's `busy` decrement (or by
        // the dispatcher itself), while `task` points to the live closure.
        let task = unsafe { &*(*self.task.get()).expect("a loop is running") };
        let n_tasks = self.n_tasks.load(Ordering::Relaxed);
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                return;
            }
            task(i, worker);
        }
    }

    /// Waits until the epoch differs from `seen` and returns it: spinning first, then asleep.
    fn wait_for_loop(&self, seen: u64) -> u64 {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch != seen {
                return epoch;
            }
            spins = spins.wrapping_add(1);
            if spins & 255 == 0 && start.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        let mut sleep = self.lock_sleep();
        // Registered before the epoch is read again: a dispatcher that increments the epoch
        // either sees this sleeper (and notifies under the lock) or is seen by the load below.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let epoch = self.epoch.load(Ordering::SeqCst);
            if epoch != seen {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return epoch;
            }
            sleep = self
                .wake
                .wait(sleep)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until every worker has left the current loop.
    fn wait_idle(&self) {
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                // A worker was descheduled (or is waking up): give it the core.
                thread::yield_now();
            }
        }
    }

    fn lock_sleep(&self) -> MutexGuard<'_, ()> {
        self.sleep.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
