//! A decode step makes no heap allocation: every buffer of the forward pass comes from the
//! engine's scratch arenas, and the thread pool dispatches without allocating. Counted by a
//! global allocator over every thread of the process.
//!
//! Needs the default model in the cache (`tallow pull`, which the test script runs first).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use common::model;
use tallow_backend_cpu::CpuBackend;
use tallow_model::{Batch, KvBudget, Logits, Output, Scratch};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, counting calls that take memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The count covers every thread, so the tests of this file run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn decode_steps_allocate_nothing_once_warm() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = model();
    let n_vocab = model.config().n_vocab;
    let mut cache = model
        .new_kv_cache(model.kv_layout(), KvBudget::Pages(64))
        .unwrap();
    let prompts = [
        "The capital of France is",
        "def add(a, b):",
        "1, 2, 3, 4,",
        "Once",
    ];
    let seqs: Vec<_> = prompts.iter().map(|_| cache.create()).collect();
    let mut scratch = Scratch::<CpuBackend>::new();
    let mut batch = Batch::new();

    // Prefill every prompt in one batch.
    for (&seq, prompt) in seqs.iter().zip(prompts) {
        let ids = model.tokenizer().encode(prompt, false, false);
        cache.append_slots(seq, ids.len()).unwrap();
        batch.push(seq, &ids, Logits::Last);
    }
    let mut logits = vec![0.0; seqs.len() * n_vocab];
    model
        .forward_into(
            &mut cache,
            &batch,
            &mut scratch,
            Output::Logits(&mut logits).into(),
        )
        .unwrap();

    let mut next: Vec<u32> = logits
        .chunks_exact(n_vocab)
        .map(tallow_model::argmax)
        .collect();
    let mut counts = Vec::new();
    for step in 0..12 {
        // Reserving positions is the scheduler's part of a step, outside the forward pass.
        for &seq in &seqs {
            cache.append_slots(seq, 1).unwrap();
        }
        batch.clear();
        for (&seq, &token) in seqs.iter().zip(&next) {
            batch.push(seq, &[token], Logits::Last);
        }
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        model
            .forward_into(
                &mut cache,
                &batch,
                &mut scratch,
                Output::Logits(&mut logits).into(),
            )
            .unwrap();
        let made = ALLOCATIONS.load(Ordering::SeqCst) - before;
        for (token, row) in next.iter_mut().zip(logits.chunks_exact(n_vocab)) {
            *token = tallow_model::argmax(row);
        }
        // The first decode step may size the arenas for decoding; none after it allocates.
        if step > 0 {
            counts.push(made);
        }
    }
    assert_eq!(counts, vec![0; 11], "heap allocations per decode step");
    assert!(next.iter().all(|&t| (t as usize) < n_vocab));
}

#[test]
fn scratch_grows_for_larger_batches_and_results_do_not_depend_on_it() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = model();
    let n_vocab = model.config().n_vocab;
    let ids = model.tokenizer().encode(
        "A paged KV cache stores keys and values in fixed-size pages.",
        false,
        false,
    );
    let run = |scratch: &mut Scratch<CpuBackend>| {
        let mut cache = model
            .new_kv_cache(model.kv_layout(), KvBudget::Pages(8))
            .unwrap();
        let seq = cache.create();
        cache.append_slots(seq, ids.len()).unwrap();
        let mut batch = Batch::new();
        batch.push(seq, &ids, Logits::All);
        let mut logits = vec![0.0; ids.len() * n_vocab];
        model
            .forward_into(
                &mut cache,
                &batch,
                scratch,
                Output::Logits(&mut logits).into(),
            )
            .unwrap();
        logits
    };
    let mut warm = Scratch::<CpuBackend>::new();
    let first = run(&mut warm);
    let capacity = warm.backend().capacity();
    assert!(capacity > 0);
    let again = run(&mut warm);
    assert_eq!(
        warm.backend().capacity(),
        capacity,
        "the same batch needs no more scratch"
    );
    assert_eq!(first, again);
    assert_eq!(first, run(&mut Scratch::<CpuBackend>::new()));
}
