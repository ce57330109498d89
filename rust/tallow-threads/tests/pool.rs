//! Every task runs exactly once, on distinct worker indices, under nesting, concurrent callers
//! and panics.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tallow_threads::ThreadPool;

fn counts(pool: &ThreadPool, n_tasks: usize) -> Vec<usize> {
    let hits: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
    pool.run(n_tasks, &|i, _| {
        hits[i].fetch_add(1, Ordering::Relaxed);
    });
    hits.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn every_task_runs_once() {
    for threads in [1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.threads(), threads);
        for n in [0, 1, 2, 7, 64, 1000] {
            for _ in 0..20 {
                assert_eq!(counts(&pool, n), vec![1; n], "threads {threads} tasks {n}");
            }
        }
    }
}

#[test]
fn workers_in_one_loop_have_distinct_indices() {
    let pool = ThreadPool::new(4);
    let inside: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
    let clashes = AtomicUsize::new(0);
    for _ in 0..50 {
        pool.run(256, &|_, worker| {
            assert!(worker < 4);
            if inside[worker].fetch_add(1, Ordering::SeqCst) != 0 {
                clashes.fetch_add(1, Ordering::SeqCst);
            }
            std::hint::black_box((0..200).sum::<u64>());
            inside[worker].fetch_sub(1, Ordering::SeqCst);
        });
    }
    assert_eq!(clashes.into_inner(), 0);
}

#[test]
fn nested_loops_run_inline() {
    let pool = ThreadPool::new(3);
    let total = AtomicUsize::new(0);
    pool.run(10, &|_, outer_worker| {
        pool.run(10, &|j, inner_worker| {
            assert_eq!(inner_worker, outer_worker);
            total.fetch_add(j, Ordering::Relaxed);
        });
    });
    assert_eq!(total.into_inner(), 10 * 45);
}

#[test]
fn concurrent_callers_each_get_their_loop() {
    let pool = ThreadPool::new(3);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for caller in 0..4usize {
            let (pool, results) = (&pool, &results);
            s.spawn(move || {
                for round in 0..100 {
                    let sum = AtomicUsize::new(0);
                    let n = 10 + caller * 7 + round % 5;
                    pool.run(n, &|i, _| {
                        sum.fetch_add(i, Ordering::Relaxed);
                    });
                    assert_eq!(sum.into_inner(), n * (n - 1) / 2);
                }
                results.lock().unwrap().push(caller);
            });
        }
    });
    assert_eq!(results.into_inner().unwrap().len(), 4);
}

#[test]
fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
    let pool = ThreadPool::new(3);
    for bad in [0, 5, 99].repeat(30) {
        let ran = AtomicUsize::new(0);
        let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(100, &|i, _| {
                ran.fetch_add(1, Ordering::Relaxed);
                // No task runs twice, not even after a panic stopped the loop.
                assert_eq!(
                    runs[i].fetch_add(1, Ordering::Relaxed),
                    0,
                    "task {i} ran twice"
                );
                if i == bad {
                    panic!("task {i} failed");
                }
            })
        }));
        let payload = result.expect_err("the panic must reach the caller");
        let message = payload
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert_eq!(message, &format!("task {bad} failed"));
        assert!(ran.into_inner() >= 1);
        assert_eq!(counts(&pool, 100), vec![1; 100]);
    }
}

#[test]
fn loops_after_the_workers_slept_still_run() {
    let pool = ThreadPool::new(2);
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(counts(&pool, 16), vec![1; 16]);
    }
}

#[test]
fn tasks_fill_disjoint_parts_of_one_slice() {
    use tallow_threads::DisjointSlice;
    let pool = ThreadPool::new(3);
    let mut out = vec![0u32; 1000];
    let shared = DisjointSlice::new(&mut out);
    pool.run(100, &|i, _| {
        // SAFETY: task i alone writes elements 10i..10i+10.
        let part = unsafe { shared.range_mut(i * 10..i * 10 + 10) };
        for (j, v) in part.iter_mut().enumerate() {
            *v = (i * 10 + j) as u32;
        }
    });
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32));
}
