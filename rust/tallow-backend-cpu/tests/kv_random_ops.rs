//! Property test: random sequences of create / append / truncate / fork / free against a
//! simple model of page sharing, checking the allocator's bookkeeping and the K/V data after
//! every operation.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use tallow_backend_cpu::{host_cache, HostPages};
use tallow_kv::{
    KvBudget, KvDtype, KvError, KvKind, KvLayout, LayerGroups, PageId, PagedKvCache, SeqId, Slot,
};

const PAGE_SIZE: usize = 3;
const N_PAGES: usize = 10;

#[derive(Debug, Clone)]
enum Op {
    Create,
    Append(usize, usize),
    Truncate(usize, u8),
    Fork(usize),
    Free(usize),
    Unknown,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Create),
        6 => (any::<usize>(), 0usize..10).prop_map(|(s, n)| Op::Append(s, n)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(s, f)| Op::Truncate(s, f)),
        2 => any::<usize>().prop_map(Op::Fork),
        2 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Unknown),
    ]
}

/// The model: each sequence is a list of abstract page ids (a new id for every page the
/// model expects to be allocated, shared only by fork) and the value written at each position.
#[derive(Default)]
struct Model {
    seqs: BTreeMap<SeqId, (Vec<u64>, Vec<f32>)>,
    refs: HashMap<u64, usize>,
    next_page: u64,
    next_value: f32,
}

impl Model {
    fn new_page(&mut self) -> u64 {
        self.next_page += 1;
        self.refs.insert(self.next_page, 1);
        self.next_page
    }

    /// Drops one reference; returns whether the page became free.
    fn release(&mut self, p: u64) -> bool {
        let r = self.refs.get_mut(&p).unwrap();
        *r -= 1;
        if *r == 0 {
            self.refs.remove(&p);
            true
        } else {
            false
        }
    }

    fn n_free(&self) -> usize {
        N_PAGES - self.refs.len()
    }

    fn pick(&self, sel: usize) -> Option<SeqId> {
        let n = self.seqs.len();
        (n > 0).then(|| *self.seqs.keys().nth(sel % n).unwrap())
    }
}

fn layout() -> KvLayout {
    KvLayout::new(1, 1, 2)
        .with_page_size(PAGE_SIZE)
        .with_dtype(KvDtype::F32)
}

fn check_invariants(c: &PagedKvCache, m: &Model) -> Result<(), TestCaseError> {
    let alloc = c.sequences().allocator();
    prop_assert_eq!(c.sequences().n_sequences(), m.seqs.len());
    // Same sharing structure: abstract ids and real page ids correspond one to one.
    let mut to_real: HashMap<u64, PageId> = HashMap::new();
    let mut to_model: HashMap<PageId, u64> = HashMap::new();
    let mut table_refs: HashMap<PageId, u32> = HashMap::new();
    let mut filled: HashMap<PageId, usize> = HashMap::new();
    for (&seq, (pages, vals)) in &m.seqs {
        prop_assert_eq!(c.seq_len(seq)?, vals.len());
        let table = c.page_table(seq, 0)?;
        prop_assert_eq!(table.len(), pages.len());
        prop_assert_eq!(table.len(), vals.len().div_ceil(PAGE_SIZE));
        for (i, (&real, &abs)) in table.iter().zip(pages).enumerate() {
            prop_assert_eq!(*to_real.entry(abs).or_insert(real), real);
            prop_assert_eq!(*to_model.entry(real).or_insert(abs), abs);
            *table_refs.entry(real).or_default() += 1;
            let f = filled.entry(real).or_default();
            *f = (*f).max((vals.len() - i * PAGE_SIZE).min(PAGE_SIZE));
        }
        // The data each sequence wrote is what it reads back through its page table.
        let (mut k, mut v) = (vec![0.0; vals.len() * 2], vec![0.0; vals.len() * 2]);
        c.read_head_f32(seq, 0, 0, vals.len(), &mut k, &mut v)?;
        for (pos, &want) in vals.iter().enumerate() {
            prop_assert_eq!(&k[pos * 2..pos * 2 + 2], &[want, want + 0.5][..]);
            prop_assert_eq!(&v[pos * 2..pos * 2 + 2], &[-want, -want - 0.5][..]);
        }
    }
    // Reference counts equal page-table references (and the model's count); everything else
    // is free, exactly once, on the free list.
    let free: Vec<PageId> = alloc.free_pages().collect();
    let free_set: HashSet<PageId> = free.iter().copied().collect();
    prop_assert_eq!(free.len(), free_set.len(), "page twice on the free list");
    prop_assert_eq!(free.len(), alloc.n_free());
    prop_assert_eq!(alloc.n_free() + alloc.n_used(), N_PAGES);
    prop_assert_eq!(alloc.n_free(), m.n_free());
    let mut rc_sum = 0;
    for p in 0..N_PAGES as u32 {
        let page = PageId(p);
        let rc = alloc.refcount(page)?;
        rc_sum += rc;
        let refs = table_refs.get(&page).copied().unwrap_or(0);
        prop_assert_eq!(rc, refs, "page {}", p);
        prop_assert_eq!(rc == 0, free_set.contains(&page));
        if let Some(abs) = to_model.get(&page) {
            prop_assert_eq!(rc as usize, m.refs[abs]);
        }
    }
    prop_assert_eq!(
        rc_sum as usize,
        table_refs.values().map(|&r| r as usize).sum::<usize>()
    );
    let st = c.stats();
    prop_assert_eq!(st.pages_used, m.refs.len());
    prop_assert_eq!(st.tokens_stored, filled.values().sum::<usize>());
    prop_assert_eq!(
        st.seq_tokens,
        m.seqs.values().map(|s| s.1.len()).sum::<usize>()
    );
    prop_assert!(st.utilization() <= 1.0);
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut c = host_cache(
        layout(),
        LayerGroups::global(1).unwrap(),
        KvBudget::Pages(N_PAGES),
    )?;
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Create => {
                let s = c.create();
                m.seqs.insert(s, Default::default());
            }
            Op::Unknown => {
                let ghost = SeqId(u64::MAX);
                prop_assert_eq!(
                    c.append_slots(ghost, 1),
                    Err(KvError::UnknownSequence(ghost))
                );
                prop_assert_eq!(c.fork(ghost), Err(KvError::UnknownSequence(ghost)));
                prop_assert_eq!(c.free(ghost), Err(KvError::UnknownSequence(ghost)));
            }
            Op::Append(sel, n) => {
                let Some(s) = m.pick(sel) else { continue };
                let (pages, vals) = &m.seqs[&s];
                let len = vals.len();
                let last_shared = pages.last().is_some_and(|p| m.refs[p] > 1);
                let in_last_page = len % PAGE_SIZE;
                let cow = n > 0 && in_last_page != 0 && last_shared;
                let new_pages = if n == 0 {
                    0
                } else {
                    (len + n).div_ceil(PAGE_SIZE) - pages.len()
                };
                let needed = new_pages + usize::from(cow);
                prop_assert_eq!(c.pages_needed(s, n)?, needed);
                if needed > m.n_free() {
                    let before = (c.stats(), c.page_table(s, 0)?.to_vec());
                    let free_before: Vec<PageId> = c.sequences().allocator().free_pages().collect();
                    prop_assert_eq!(
                        c.append_slots(s, n),
                        Err(KvError::OutOfPages {
                            needed,
                            free: m.n_free()
                        })
                    );
                    prop_assert_eq!((c.stats(), c.page_table(s, 0)?.to_vec()), before);
                    let free_after: Vec<PageId> = c.sequences().allocator().free_pages().collect();
                    prop_assert_eq!(free_after, free_before);
                } else {
                    let slots = c.append_slots(s, n)?;
                    prop_assert_eq!(slots.len(), 1);
                    prop_assert_eq!(slots[0].len(), n);
                    let mut pages = m.seqs[&s].0.clone();
                    if cow {
                        let old = pages.pop().unwrap();
                        prop_assert!(!m.release(old));
                        pages.push(m.new_page());
                    }
                    for _ in 0..new_pages {
                        pages.push(m.new_page());
                    }
                    let table = c.page_table(s, 0)?;
                    let mut ks = Vec::new();
                    for (i, slot) in slots[0].iter().enumerate() {
                        let pos = len + i;
                        let want = Slot {
                            page: table[pos / PAGE_SIZE],
                            offset: pos % PAGE_SIZE,
                        };
                        prop_assert_eq!(*slot, want);
                        prop_assert_eq!(c.sequences().allocator().refcount(slot.page)?, 1);
                        m.next_value += 1.0;
                        ks.push(m.next_value);
                    }
                    let k: Vec<f32> = ks.iter().flat_map(|&x| [x, x + 0.5]).collect();
                    let v: Vec<f32> = k.iter().map(|x| -x).collect();
                    c.write(&slots, 0, &k, &v)?;
                    let e = m.seqs.get_mut(&s).unwrap();
                    e.0 = pages;
                    e.1.extend(ks);
                }
            }
            Op::Truncate(sel, frac) => {
                let Some(s) = m.pick(sel) else { continue };
                let len = m.seqs[&s].1.len();
                let keep = len * frac as usize / 255;
                let freed = c.truncate(s, keep)?;
                let (mut pages, mut vals) = m.seqs.remove(&s).unwrap();
                vals.truncate(keep);
                let dropped = pages.split_off(keep.div_ceil(PAGE_SIZE));
                let n_freed = dropped.iter().rev().filter(|&&p| m.release(p)).count();
                prop_assert_eq!(freed.len(), n_freed);
                for p in freed {
                    prop_assert_eq!(c.sequences().allocator().refcount(p)?, 0);
                }
                m.seqs.insert(s, (pages, vals));
                prop_assert_eq!(
                    c.truncate(s, keep + 1),
                    Err(KvError::TruncateBeyondLength {
                        seq: s,
                        keep: keep + 1,
                        len: keep
                    })
                );
            }
            Op::Fork(sel) => {
                let Some(s) = m.pick(sel) else { continue };
                let f = c.fork(s)?;
                let e = m.seqs[&s].clone();
                for p in &e.0 {
                    *m.refs.get_mut(p).unwrap() += 1;
                }
                m.seqs.insert(f, e);
            }
            Op::Free(sel) => {
                let Some(s) = m.pick(sel) else { continue };
                let freed = c.free(s)?;
                let (pages, _) = m.seqs.remove(&s).unwrap();
                let n_freed = pages.iter().rev().filter(|&&p| m.release(p)).count();
                prop_assert_eq!(freed.len(), n_freed);
                prop_assert_eq!(c.free(s), Err(KvError::UnknownSequence(s)));
            }
        }
        check_invariants(&c, &m)?;
    }
    // Freeing everything gives every page back.
    let live: Vec<SeqId> = m.seqs.keys().copied().collect();
    for s in live {
        c.free(s)?;
        m.seqs.remove(&s);
    }
    let alloc = c.sequences().allocator();
    prop_assert_eq!(alloc.n_free(), N_PAGES);
    prop_assert_eq!(alloc.free_pages().count(), N_PAGES);
    for p in 0..N_PAGES as u32 {
        prop_assert_eq!(alloc.refcount(PageId(p))?, 0);
    }
    prop_assert_eq!(c.stats().tokens_stored, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_keep_the_books_straight(ops in prop::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}

#[test]
fn k_and_v_blocks_are_separate() {
    // A sanity check of the test's own data convention: K and V of one slot differ.
    let mut c = host_cache(
        layout(),
        LayerGroups::global(1).unwrap(),
        KvBudget::Pages(1),
    )
    .unwrap();
    let s = c.create();
    let slots = c.append_slots(s, 1).unwrap();
    c.write(&slots, 0, &[1.0, 1.5], &[-1.0, -1.5]).unwrap();
    let st = c.storage().unwrap();
    assert_eq!(
        &st.block_f32(PageId(0), 0, 0, KvKind::Key).unwrap()[..2],
        &[1.0, 1.5]
    );
    assert_eq!(
        &st.block_f32(PageId(0), 0, 0, KvKind::Value).unwrap()[..2],
        &[-1.0, -1.5]
    );
}
