//! Property test: random create / append / truncate / fork / free on a pool whose layers form
//! a global and a sliding-window group. After every operation: reference counts equal the page
//! tables' references, the free list holds every other page once, a windowed table has given
//! back exactly the pages before what its next query sees, and every position a query can
//! still see reads back what was written there, in every layer.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use tallow_backend_cpu::{host_cache, HostPages};
use tallow_kv::{
    KvBudget, KvDtype, KvError, KvKind, KvLayout, LayerGroups, PageId, PagedKvCache, SeqId,
};

const PAGE_SIZE: usize = 3;
const N_PAGES: usize = 24;
const WINDOW: usize = 4;
/// Layers 0 and 2 global, 1 and 3 windowed: two groups of two.
const WINDOWS: [Option<usize>; 4] = [None, Some(WINDOW), None, Some(WINDOW)];

#[derive(Debug, Clone)]
enum Op {
    Create,
    Append(usize, usize),
    Truncate(usize, u8),
    Fork(usize),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Create),
        8 => (any::<usize>(), 0usize..6).prop_map(|(s, n)| Op::Append(s, n)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(s, f)| Op::Truncate(s, f)),
        2 => any::<usize>().prop_map(Op::Fork),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

fn cache() -> PagedKvCache {
    let groups = LayerGroups::from_windows(&WINDOWS).unwrap();
    let layout = KvLayout::new(4, 1, 1)
        .with_page_layers(groups.page_layers())
        .with_page_size(PAGE_SIZE)
        .with_dtype(KvDtype::F32);
    host_cache(layout, groups, KvBudget::Pages(N_PAGES)).unwrap()
}

/// The value written at a position of a layer: the sequence's value there, offset per layer.
fn value(v: f32, layer: usize) -> f32 {
    v + layer as f32 * 1000.0
}

fn check(c: &PagedKvCache, seqs: &BTreeMap<SeqId, Vec<f32>>) -> Result<(), TestCaseError> {
    let alloc = c.sequences().allocator();
    let mut refs = [0u32; N_PAGES];
    for (&seq, vals) in seqs {
        let len = vals.len();
        prop_assert_eq!(c.seq_len(seq)?, len);
        for (group, window) in [(0, None), (1, Some(WINDOW))] {
            let table = c.sequences().page_table(seq, group)?;
            prop_assert_eq!(table.len(), len.div_ceil(PAGE_SIZE));
            // What the next query (at `len`) sees starts at `len + 1 - window`.
            let keep = window.map_or(0, |w| (len + 1).saturating_sub(w) / PAGE_SIZE);
            for (i, &page) in table.iter().enumerate() {
                if page.index() >= N_PAGES {
                    prop_assert!(
                        i < keep,
                        "page {} of group {} given back too early",
                        i,
                        group
                    );
                } else {
                    refs[page.index()] += 1;
                }
            }
        }
        for (layer, window) in WINDOWS.iter().enumerate() {
            let from = window.map_or(0, |w| (len + 1).saturating_sub(w));
            let table = c.page_table(seq, layer)?;
            for (pos, &v) in vals.iter().enumerate().skip(from) {
                let page = table[pos / PAGE_SIZE];
                let block = c.storage()?.block_f32(page, layer, 0, KvKind::Key)?;
                prop_assert_eq!(block[pos % PAGE_SIZE], value(v, layer));
                let block = c.storage()?.block_f32(page, layer, 0, KvKind::Value)?;
                prop_assert_eq!(block[pos % PAGE_SIZE], -value(v, layer));
            }
        }
    }
    let free: HashSet<PageId> = alloc.free_pages().collect();
    prop_assert_eq!(free.len(), alloc.n_free());
    for (p, &r) in refs.iter().enumerate() {
        let page = PageId(p as u32);
        prop_assert_eq!(alloc.refcount(page)?, r, "page {}", p);
        prop_assert_eq!(r == 0, free.contains(&page));
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut c = cache();
    let mut seqs: BTreeMap<SeqId, Vec<f32>> = BTreeMap::new();
    let mut next = 0.0f32;
    let pick = |seqs: &BTreeMap<SeqId, Vec<f32>>, sel: usize| {
        (!seqs.is_empty()).then(|| *seqs.keys().nth(sel % seqs.len()).unwrap())
    };
    for op in ops {
        match op {
            Op::Create => {
                seqs.insert(c.create(), Vec::new());
            }
            Op::Append(sel, n) => {
                let Some(s) = pick(&seqs, sel) else { continue };
                let needed = c.pages_needed(s, n)?;
                let free = c.sequences().allocator().n_free();
                prop_assert_eq!(c.max_append(s, n, free)? == n, needed <= free);
                match c.append_slots(s, n) {
                    Err(KvError::OutOfPages { .. }) => prop_assert!(needed > free),
                    Err(e) => return Err(e.into()),
                    Ok(slots) => {
                        prop_assert!(needed <= free);
                        let vals: Vec<f32> = (0..n).map(|i| next + i as f32).collect();
                        next += n as f32;
                        for layer in 0..WINDOWS.len() {
                            let k: Vec<f32> = vals.iter().map(|&v| value(v, layer)).collect();
                            let v: Vec<f32> = k.iter().map(|x| -x).collect();
                            c.write(&slots, layer, &k, &v)?;
                        }
                        seqs.get_mut(&s).unwrap().extend(vals);
                    }
                }
            }
            Op::Truncate(sel, f) => {
                let Some(s) = pick(&seqs, sel) else { continue };
                let len = seqs[&s].len();
                let keep = len * f as usize / 255;
                match c.truncate(s, keep) {
                    Ok(_) => seqs.get_mut(&s).unwrap().truncate(keep),
                    Err(KvError::WindowReleased { released, .. }) => {
                        // Refused only where the window gave back what a query at `keep` sees.
                        prop_assert!(released > (keep + 1).saturating_sub(WINDOW));
                        prop_assert_eq!(c.seq_len(s)?, len);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Op::Fork(sel) => {
                let Some(s) = pick(&seqs, sel) else { continue };
                let vals = seqs[&s].clone();
                seqs.insert(c.fork(s)?, vals);
            }
            Op::Free(sel) => {
                let Some(s) = pick(&seqs, sel) else { continue };
                c.free(s)?;
                seqs.remove(&s);
            }
        }
        check(&c, &seqs)?;
    }
    for s in seqs.keys() {
        c.free(*s)?;
    }
    prop_assert_eq!(c.sequences().allocator().n_free(), N_PAGES);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn windowed_groups_keep_what_queries_see_and_count_every_reference(
        ops in prop::collection::vec(op(), 1..80)
    ) {
        run(ops)?;
    }
}
