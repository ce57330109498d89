//! A child made by `fork` after the global pool started runs parallel loops on a pool of its
//! own (the parent's workers are not in the child).
#![cfg(unix)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn sum_on_global_pool() -> usize {
    let sum = AtomicUsize::new(0);
    tallow_threads::global().run(1000, &|task, _| {
        sum.fetch_add(task, Ordering::Relaxed);
    });
    sum.into_inner()
}

/// Waits up to `limit` for `child` to exit; its exit status, or `None` (and the child killed)
/// where it did not.
fn wait_for(child: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    let mut status = 0;
    while start.elapsed() < limit {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let done = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if done == child {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, &mut status, 0);
    }
    None
}

#[test]
fn a_forked_child_runs_loops_on_its_own_pool() {
    // A pool with workers whatever the machine has (with one thread, loops run inline and a
    // fork loses nothing). The only test of this binary: nothing read the variable before.
    std::env::set_var(tallow_threads::THREADS_ENV, "2");
    assert_eq!(tallow_threads::global().threads(), 2);
    assert_eq!(sum_on_global_pool(), 499_500);
    // SAFETY: the child calls only the pool (whose state after fork is what is tested),
    // then `_exit`.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // Twice: the second loop uses the pool the first one made.
        let ok = sum_on_global_pool() == 499_500 && sum_on_global_pool() == 499_500;
        // SAFETY: ends the child without running the parent's test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert_eq!(
        wait_for(child, Duration::from_secs(30)),
        Some(0),
        "the child hung or failed"
    );
    // The parent's pool is untouched.
    assert_eq!(sum_on_global_pool(), 499_500);
}
