//! A cache whose pages are in host memory: values written through the page tables read back
//! the same after copy-on-write and truncation, writes that would touch a shared page are
//! refused, and the pool's size follows the budget.

use tallow_backend_cpu::{host_cache, HostPages};
use tallow_kv::{
    KvBudget, KvDtype, KvError, KvKind, KvLayout, LayerGroups, PageId, PagedKvCache, SeqId, Slot,
};

/// Both layers of [`layout`] in each page.
fn global() -> LayerGroups {
    LayerGroups::global(2).unwrap()
}

fn layout(dtype: KvDtype) -> KvLayout {
    KvLayout::new(2, 2, 8).with_page_size(4).with_dtype(dtype)
}

/// Deterministic, distinct K/V values for (seq tag, position, layer).
fn kv_row(tag: u32, pos: usize, layer: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let base = tag as f32 * 1000.0 + pos as f32 * 10.0 + layer as f32;
    let k = (0..n).map(|i| base + i as f32 * 0.125).collect();
    let v = (0..n).map(|i| -base - i as f32 * 0.25).collect();
    (k, v)
}

fn write_all(c: &mut PagedKvCache, slots: &[Vec<Slot>], tag: u32, first_pos: usize) {
    let row = c.layout().row_len();
    for layer in 0..c.layout().n_layer {
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for i in 0..slots[0].len() {
            let (k, v) = kv_row(tag, first_pos + i, layer, row);
            ks.extend(k);
            vs.extend(v);
        }
        c.write(slots, layer, &ks, &vs).unwrap();
    }
}

/// Checks positions `0..len` of `seq` read back as written with `tags[pos]`.
fn check(c: &PagedKvCache, seq: SeqId, tags: &[u32], tol: f32) {
    let l = *c.layout();
    let n = tags.len() * l.head_dim;
    let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
    for layer in 0..l.n_layer {
        for head in 0..l.n_head_kv {
            c.read_head_f32(seq, layer, head, tags.len(), &mut k, &mut v)
                .unwrap();
            for (pos, &tag) in tags.iter().enumerate() {
                let (wk, wv) = kv_row(tag, pos, layer, l.row_len());
                for d in 0..l.head_dim {
                    let (gk, gv) = (k[pos * l.head_dim + d], v[pos * l.head_dim + d]);
                    let (ek, ev) = (wk[head * l.head_dim + d], wv[head * l.head_dim + d]);
                    assert!((gk - ek).abs() <= ek.abs() * tol, "K {gk} vs {ek} at {pos}");
                    assert!((gv - ev).abs() <= ev.abs() * tol, "V {gv} vs {ev} at {pos}");
                }
            }
        }
    }
}

#[test]
fn round_trip_through_the_page_table_and_copy_on_write() {
    for (dtype, tol) in [(KvDtype::F32, 0.0), (KvDtype::F16, 1.0 / 1024.0)] {
        let mut c = host_cache(layout(dtype), global(), KvBudget::Pages(6)).unwrap();
        let a = c.create();
        let slots = c.append_slots(a, 6).unwrap();
        write_all(&mut c, &slots, 1, 0);
        check(&c, a, &[1; 6], tol);

        let b = c.fork(a).unwrap();
        let slots = c.append_slots(b, 3).unwrap();
        // Copy-on-write moved b's second page to page 2, with a's first two tokens in it.
        assert_eq!(
            c.page_table(b, 0).unwrap(),
            &[PageId(0), PageId(2), PageId(3)]
        );
        assert_eq!(
            slots[0][0],
            Slot {
                page: PageId(2),
                offset: 2
            }
        );
        write_all(&mut c, &slots, 2, 6);
        let slots = c.append_slots(a, 2).unwrap();
        assert_eq!(
            slots[0][0],
            Slot {
                page: PageId(1),
                offset: 2
            }
        );
        write_all(&mut c, &slots, 3, 6);
        check(&c, a, &[1, 1, 1, 1, 1, 1, 3, 3], tol);
        check(&c, b, &[1, 1, 1, 1, 1, 1, 2, 2, 2], tol);

        // Speculative rollback, then a different continuation.
        c.truncate(b, 7).unwrap();
        let slots = c.append_slots(b, 1).unwrap();
        write_all(&mut c, &slots, 4, 7);
        check(&c, b, &[1, 1, 1, 1, 1, 1, 2, 4], tol);
        check(&c, a, &[1, 1, 1, 1, 1, 1, 3, 3], tol);
    }
}

#[test]
fn f32_round_trip_is_exact_and_f16_blocks_hold_rounded_values() {
    let mut c = host_cache(layout(KvDtype::F16), global(), KvBudget::Pages(2)).unwrap();
    let a = c.create();
    c.append_slots(a, 1).unwrap();
    let k: Vec<f32> = (0..16).map(|i| 0.1 * i as f32 + 1e-4).collect();
    c.write_pos(a, 0, 1, &k, &k).unwrap();
    let block = c
        .storage()
        .unwrap()
        .block_f16(PageId(0), 1, 1, KvKind::Key)
        .unwrap();
    for d in 0..8 {
        assert_eq!(block[d], half::f16::from_f32(k[8 + d]));
    }
}

#[test]
fn write_pos_refuses_shared_pages_and_bad_positions() {
    let mut c = host_cache(layout(KvDtype::F32), global(), KvBudget::Pages(4)).unwrap();
    let a = c.create();
    c.append_slots(a, 2).unwrap();
    let _b = c.fork(a).unwrap();
    let row = vec![0.5; 16];
    assert_eq!(
        c.write_pos(a, 1, 0, &row, &row).unwrap_err(),
        KvError::SharedPage {
            page: PageId(0),
            refcount: 2
        }
    );
    assert!(matches!(
        c.write_pos(a, 2, 0, &row, &row),
        Err(KvError::OutOfRange { .. })
    ));
    let (mut k, mut v) = (vec![0.0; 3 * 8], vec![0.0; 3 * 8]);
    assert!(c.read_head_f32(a, 0, 0, 3, &mut k, &mut v).is_err());
    let (k2, v2) = (&mut k[..16], &mut v[..16]);
    assert!(c.read_head_f32(a, 0, 2, 2, k2, v2).is_err());
}

#[test]
fn pool_size_follows_the_budget() {
    let l = layout(KvDtype::F16); // 2*2*2*8*4*2 = 512 bytes a page
    let c = host_cache(l, global(), KvBudget::Bytes(512 * 10 + 511)).unwrap();
    assert_eq!(c.stats().pages_total, 10);
    assert_eq!(c.storage().unwrap().n_bytes(), 5120);
    let err = host_cache(l, global(), KvBudget::Bytes(511)).unwrap_err();
    assert!(
        matches!(
            err,
            KvError::BudgetTooSmall {
                page_bytes: 512,
                ..
            }
        ),
        "{err}"
    );
}
