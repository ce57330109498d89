//! The batched forward over the paged KV cache, on the default model: a ragged batch gives
//! every sequence the logits it gets alone, bit for bit (branches forked in the batch too), and
//! malformed batches are refused.
//!
//! Needs the default model in the cache (`tallow pull`, which the test script runs first).

mod common;

use common::model;
use tallow_backend_cpu::CpuBackend;
use tallow_model::{Batch, KvBudget, Logits, Model, ModelError, PagedKvCache, SingleSequence};

fn encode(model: &Model<CpuBackend>, text: &str) -> Vec<u32> {
    model.tokenizer().encode(text, false, false)
}

/// Reserves every chunk's positions (the scheduler's job), then runs the batch.
fn reserve_and_run(model: &Model<CpuBackend>, cache: &mut PagedKvCache, batch: &Batch) -> Vec<f32> {
    for chunk in &batch.chunks {
        cache.append_slots(chunk.seq, chunk.len).unwrap();
    }
    model.forward(cache, batch).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn ragged_batch_matches_sequences_alone() {
    let model = model();
    let n_vocab = model.config().n_vocab;
    let prompts = [
        encode(&model, "The capital of France is"),
        encode(&model, "def add(a, b):\n    return"),
        encode(&model, "1, 2, 3, 4,"),
    ];
    // Pages of 4 positions, so that the short prompts span several pages.
    let new_cache = || {
        model
            .new_kv_cache(model.kv_layout().with_page_size(4), KvBudget::Pages(64))
            .unwrap()
    };
    // Alone: each prompt, then one more token, in a cache of its own.
    let mut alone = Vec::new();
    for p in &prompts {
        let mut cache = new_cache();
        let seq = cache.create();
        let mut batch = Batch::new();
        batch.push(seq, p, Logits::All);
        let prompt_logits = reserve_and_run(&model, &mut cache, &batch);
        let mut batch = Batch::new();
        batch.push(seq, &[42], Logits::Last);
        let next = reserve_and_run(&model, &mut cache, &batch);
        alone.push((prompt_logits, next));
    }

    let mut cache = new_cache();
    let seqs: Vec<_> = prompts.iter().map(|_| cache.create()).collect();
    // Step 1: the first prompt whole, the second in two chunks (its first chunk now), the
    // third not yet.
    let split = prompts[1].len() / 2;
    let mut batch = Batch::new();
    batch.push(seqs[0], &prompts[0], Logits::All);
    batch.push(seqs[1], &prompts[1][..split], Logits::None);
    let out = reserve_and_run(&model, &mut cache, &batch);
    assert_eq!(out.len(), prompts[0].len() * n_vocab);
    assert_eq!(bits(&out), bits(&alone[0].0));

    // Step 2: a decode token for the first, the rest of the second prompt, the whole third.
    let mut batch = Batch::new();
    batch.push(seqs[0], &[42], Logits::Last);
    batch.push(seqs[1], &prompts[1][split..], Logits::All);
    batch.push(seqs[2], &prompts[2], Logits::Last);
    let out = reserve_and_run(&model, &mut cache, &batch);
    let rows: Vec<&[f32]> = out.chunks_exact(n_vocab).collect();
    assert_eq!(rows.len(), 1 + (prompts[1].len() - split) + 1);
    assert_eq!(bits(rows[0]), bits(&alone[0].1));
    let second = &alone[1].0[split * n_vocab..];
    assert_eq!(bits(&out[n_vocab..n_vocab + second.len()]), bits(second));
    let third_last = &alone[2].0[(prompts[2].len() - 1) * n_vocab..];
    assert_eq!(bits(rows[rows.len() - 1]), bits(third_last));
    assert_eq!(cache.seq_len(seqs[1]).unwrap(), prompts[1].len());
}

/// Continuations of one text computed as branches in the forward that computes the text
/// (the text's last chunk, after one chunk computed before) give each continuation's logits
/// as a sequence holding text and continuation computes them.
#[test]
fn branches_match_their_continuations_alone() {
    let model = model();
    let n_vocab = model.config().n_vocab;
    let new_cache = || {
        model
            .new_kv_cache(model.kv_layout().with_page_size(4), KvBudget::Pages(64))
            .unwrap()
    };
    let continuations = [
        encode(&model, " Paris, the city"),
        encode(&model, " a"),
        encode(&model, " London and"),
    ];
    let full = encode(
        &model,
        "The capital of France is a city with a long history",
    );
    // Texts ending inside a page and at a page's end.
    for text in [&full[..7], &full[..8]] {
        let alone: Vec<Vec<f32>> = continuations
            .iter()
            .map(|c| {
                let mut cache = new_cache();
                let seq = cache.create();
                let mut batch = Batch::new();
                batch.push(seq, &[text, c].concat(), Logits::All);
                let out = reserve_and_run(&model, &mut cache, &batch);
                out[(text.len() - 1) * n_vocab..].to_vec()
            })
            .collect();

        let mut cache = new_cache();
        let parent = cache.create();
        let split = 3;
        let mut batch = Batch::new();
        batch.push(parent, &text[..split], Logits::None);
        reserve_and_run(&model, &mut cache, &batch);
        cache.append_slots(parent, text.len() - split).unwrap();
        let mut batch = Batch::new();
        batch.push(parent, &text[split..], Logits::Last);
        for c in &continuations {
            let branch = cache.fork(parent).unwrap();
            cache.append_slots(branch, c.len()).unwrap();
            batch.push_branch(branch, parent, c, Logits::All);
        }
        let out = model.forward(&mut cache, &batch).unwrap();
        let mut rows = out.chunks_exact(n_vocab);
        let last = rows.next().unwrap();
        for (c, expected) in continuations.iter().zip(&alone) {
            assert_eq!(bits(last), bits(&expected[..n_vocab]));
            let got: Vec<f32> = rows.by_ref().take(c.len()).flatten().copied().collect();
            assert_eq!(
                bits(&got),
                bits(&expected[n_vocab..]),
                "{} tokens",
                text.len()
            );
        }
    }
}

#[test]
fn malformed_batches_are_refused() {
    let model = model();
    let mut cache = model
        .new_kv_cache(model.kv_layout(), KvBudget::Pages(2))
        .unwrap();
    let a = cache.create();
    let mut batch = Batch::new();
    batch.push(a, &[1, 2, 3], Logits::Last);
    reserve_and_run(&model, &mut cache, &batch);

    // Tokens without reserved positions.
    let mut batch = Batch::new();
    batch.push(a, &[1; 4], Logits::Last);
    let err = model.forward(&mut cache, &batch).unwrap_err();
    assert!(matches!(err, ModelError::InvalidArgument(_)), "{err}");
    // A bad token id, a sequence twice, an empty batch, an unknown sequence.
    let mut batch = Batch::new();
    batch.push(a, &[u32::MAX], Logits::Last);
    let err = model.forward(&mut cache, &batch).unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    let mut batch = Batch::new();
    batch
        .push(a, &[1], Logits::Last)
        .push(a, &[2], Logits::Last);
    assert!(matches!(
        model.forward(&mut cache, &batch),
        Err(ModelError::InvalidArgument(_))
    ));
    let empty = Batch::new();
    assert!(matches!(
        model.forward(&mut cache, &empty),
        Err(ModelError::InvalidArgument(_))
    ));
    let mut batch = Batch::new();
    batch.push(tallow_model::SeqId(99), &[1], Logits::Last);
    assert!(matches!(
        model.forward(&mut cache, &batch),
        Err(ModelError::Kv(_))
    ));
    assert_eq!(cache.seq_len(a).unwrap(), 3);
}

#[test]
fn single_sequence_respects_its_context() {
    let model = model();
    let mut s = SingleSequence::new(&model, 8).unwrap();
    s.eval(&model, &[1; 6], Logits::Last).unwrap();
    let err = s.eval(&model, &[1; 3], Logits::Last).unwrap_err();
    assert!(matches!(
        err,
        ModelError::ContextOverflow {
            needed: 3,
            used: 6,
            n_ctx: 8
        }
    ));
    s.truncate(2);
    assert_eq!(s.len(), 2);
    s.eval(&model, &[1; 6], Logits::Last).unwrap();
    s.reset();
    assert!(s.is_empty());
}
