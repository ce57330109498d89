//! KV pages in host memory: the K and V values themselves, addressed through the page
//! tables of a [`PagedKvCache`].

use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use half::{bf16, f16};

use tallow_kv::memory::zeroed;
use tallow_kv::{
    KvBudget, KvDtype, KvError, KvKind, KvLayout, LayerGroups, PageId, PageStore, PagedKvCache,
    Result, SeqId, Slot,
};
use tallow_quant::{GgmlType, KvBlock};

#[derive(Debug, Clone)]
enum Data {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    /// Rows of GGML blocks (Q8_0, Q4_0).
    Quantized(GgmlType, Vec<u8>),
}

impl Data {
    /// Copies units (values, or bytes of a quantized pool) `src..src + n` to `dst`.
    fn copy_within(&mut self, src: usize, n: usize, dst: usize) {
        match self {
            Data::F16(v) => v.copy_within(src..src + n, dst),
            Data::F32(v) => v.copy_within(src..src + n, dst),
            Data::Bf16(v) => v.copy_within(src..src + n, dst),
            Data::Quantized(_, v) => v.copy_within(src..src + n, dst),
        }
    }
}

/// Every page of the pool in one allocation, laid out as described on [`KvLayout`]: the
/// block of (layer, kind, head) of page `p` starts at
/// `(((slot * 2 + kind) * n_head_kv + head) * n_pages + p) * page_size * head_dim`, where
/// `slot` is the layer's place in its group's pages ([`LayerGroups::place`]).
///
/// The storage knows nothing about sequences or refcounts; it is addressed by page id and
/// model layer.
#[derive(Debug, Clone)]
pub struct KvStorage {
    layout: KvLayout,
    /// The page slot of each model layer.
    slot_of: Vec<usize>,
    n_pages: usize,
    page_elems: usize,
    data: Data,
}

impl KvStorage {
    /// A zeroed pool of `n_pages` pages holding every layer (zero pages allocate no memory
    /// from the OS until written).
    pub fn new(layout: KvLayout, n_pages: usize) -> Result<Self> {
        Self::grouped(layout, &LayerGroups::global(layout.n_layer)?, n_pages)
    }

    /// A zeroed pool of `n_pages` pages, each holding the layers of one of `groups`.
    pub fn grouped(layout: KvLayout, groups: &LayerGroups, n_pages: usize) -> Result<Self> {
        layout.validate()?;
        groups.check_layout(&layout)?;
        let page_elems = layout.elems_per_page()?;
        let max = isize::MAX as usize / layout.bytes_per_page()?;
        if n_pages > max {
            return Err(KvError::PoolTooLarge {
                pages: n_pages,
                max,
            });
        }
        let n = n_pages * page_elems;
        let data = match (layout.dtype, layout.dtype.block_format()) {
            (KvDtype::F16, _) => Data::F16(zeroed::<u16>(n)?.reinterpret_into()),
            (KvDtype::F32, _) => Data::F32(zeroed::<f32>(n)?),
            (KvDtype::Bf16, _) => Data::Bf16(zeroed::<u16>(n)?.reinterpret_into()),
            (dtype, Some(format)) => Data::Quantized(format, zeroed::<u8>(dtype.bytes_for(n))?),
            (dtype, None) => unreachable!("{dtype:?} is a float type"),
        };
        Ok(KvStorage {
            layout,
            slot_of: groups.slots(),
            n_pages,
            page_elems,
            data,
        })
    }

    /// The geometry.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Pages in the pool.
    pub fn n_pages(&self) -> usize {
        self.n_pages
    }

    /// Bytes the pool holds.
    pub fn n_bytes(&self) -> usize {
        self.layout.dtype.bytes_for(self.n_pages * self.page_elems)
    }

    /// Units (values, or bytes of a quantized pool) of one position of one head.
    fn row_units(&self) -> usize {
        match self.data {
            Data::Quantized(..) => self.layout.row_bytes(),
            _ => self.layout.head_dim,
        }
    }

    fn check_page(&self, page: PageId) -> Result<()> {
        if page.index() < self.n_pages {
            Ok(())
        } else {
            Err(KvError::PageOutOfRange {
                page,
                n_pages: self.n_pages,
            })
        }
    }

    fn check_index(what: &'static str, index: usize, len: usize) -> Result<()> {
        if index < len {
            Ok(())
        } else {
            Err(KvError::OutOfRange { what, index, len })
        }
    }

    /// Start of a block in units (values, or bytes of a quantized pool), after checking
    /// every index.
    fn block_start(&self, page: PageId, layer: usize, head: usize, kind: KvKind) -> Result<usize> {
        self.check_page(page)?;
        let l = &self.layout;
        Self::check_index("layer", layer, l.n_layer)?;
        Self::check_index("KV head", head, l.n_head_kv)?;
        let slot = self.slot_of[layer];
        Ok(
            (((slot * 2 + kind as usize) * l.n_head_kv + head) * self.n_pages + page.index())
                * l.page_size
                * self.row_units(),
        )
    }

    /// The K or V block of (page, layer, KV head), in the pool's dtype.
    pub fn block(
        &self,
        page: PageId,
        layer: usize,
        head: usize,
        kind: KvKind,
    ) -> Result<KvBlock<'_>> {
        let start = self.block_start(page, layer, head, kind)?;
        let r = start..start + self.layout.page_size * self.row_units();
        Ok(match &self.data {
            Data::F16(d) => KvBlock::F16(&d[r]),
            Data::F32(d) => KvBlock::F32(&d[r]),
            Data::Bf16(d) => KvBlock::Bf16(&d[r]),
            Data::Quantized(format, d) => KvBlock::Quantized(*format, &d[r]),
        })
    }

    /// [`KvStorage::block`] of an f16 pool; [`KvError::DtypeMismatch`] for an f32 one.
    pub fn block_f16(
        &self,
        page: PageId,
        layer: usize,
        head: usize,
        kind: KvKind,
    ) -> Result<&[f16]> {
        match self.block(page, layer, head, kind)? {
            KvBlock::F16(b) => Ok(b),
            _ => Err(self.mismatch(KvDtype::F16)),
        }
    }

    /// [`KvStorage::block`] of an f32 pool; [`KvError::DtypeMismatch`] for an f16 one.
    pub fn block_f32(
        &self,
        page: PageId,
        layer: usize,
        head: usize,
        kind: KvKind,
    ) -> Result<&[f32]> {
        match self.block(page, layer, head, kind)? {
            KvBlock::F32(b) => Ok(b),
            _ => Err(self.mismatch(KvDtype::F32)),
        }
    }

    fn mismatch(&self, requested: KvDtype) -> KvError {
        KvError::DtypeMismatch {
            requested,
            actual: self.layout.dtype,
        }
    }

    /// Writes the keys and values of one token of `layer` into `slot`: `keys` and `values`
    /// are rows of `n_head_kv * head_dim` values (head after head), converted to the pool's
    /// dtype. Checks everything before writing anything.
    pub fn write_token(
        &mut self,
        slot: Slot,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        self.write_tokens(&[slot], layer, keys, values)
    }

    /// Writes the keys and values of `slots.len()` tokens of `layer`: row `i` of `keys` and
    /// `values` (each `n_head_kv * head_dim` values) goes to `slots[i]`. All or nothing: every
    /// slot and length is checked before the first write.
    pub fn write_tokens(
        &mut self,
        slots: &[Slot],
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let l = self.layout;
        let row = l.row_len();
        for (what, got) in [("keys", keys.len()), ("values", values.len())] {
            let expected = slots.len().saturating_mul(row);
            if got != expected {
                return Err(KvError::ShapeMismatch {
                    what,
                    expected,
                    got,
                });
            }
        }
        Self::check_index("layer", layer, l.n_layer)?;
        for s in slots {
            self.check_page(s.page)?;
            Self::check_index("slot", s.offset, l.page_size)?;
        }
        let (hd, units) = (l.head_dim, self.row_units());
        for ((s, k_row), v_row) in slots
            .iter()
            .zip(keys.chunks_exact(row))
            .zip(values.chunks_exact(row))
        {
            for (kind, src_row) in [(KvKind::Key, k_row), (KvKind::Value, v_row)] {
                for (head, src) in src_row.chunks_exact(hd).enumerate() {
                    let start = self.block_start(s.page, layer, head, kind)? + s.offset * units;
                    let at = start..start + units;
                    match &mut self.data {
                        Data::F16(d) => d[at].convert_from_f32_slice(src),
                        Data::F32(d) => d[at].copy_from_slice(src),
                        // Rounded to the nearest, ties to even.
                        Data::Bf16(d) => d[at].convert_from_f32_slice(src),
                        Data::Quantized(format, d) => {
                            tallow_quant::quantize_row(*format, src, &mut d[at])
                                .expect("a row of whole blocks")
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads the first `n_slots` rows of a block as f32 into `out` (`n_slots * head_dim`
    /// values).
    pub fn read_block_f32(
        &self,
        page: PageId,
        layer: usize,
        head: usize,
        kind: KvKind,
        out: &mut [f32],
    ) -> Result<()> {
        let block = self.block(page, layer, head, kind)?;
        let hd = self.layout.head_dim;
        let partial_row = out.len() % hd;
        if partial_row != 0 || out.len() > self.layout.block_len() {
            return Err(KvError::ShapeMismatch {
                what: "block output",
                expected: self.layout.block_len(),
                got: out.len(),
            });
        }
        block.read_f32(hd, out);
        Ok(())
    }

    /// Gathers the K or V history of one (layer, KV head) through a page table: the first
    /// `n_tokens` positions, `pages[pos / page_size]` slot `pos % page_size`, as f32 into
    /// `out`, which holds exactly `n_tokens * head_dim` values.
    pub fn gather_f32(
        &self,
        pages: &[PageId],
        n_tokens: usize,
        layer: usize,
        head: usize,
        kind: KvKind,
        out: &mut [f32],
    ) -> Result<()> {
        let l = &self.layout;
        let need = l.pages_for_tokens(n_tokens);
        if need > pages.len() {
            return Err(KvError::OutOfRange {
                what: "token count",
                index: n_tokens,
                len: pages.len() * l.page_size + 1,
            });
        }
        if out.len() != n_tokens * l.head_dim {
            return Err(KvError::ShapeMismatch {
                what: "gathered head",
                got: out.len(),
                expected: n_tokens * l.head_dim,
            });
        }
        for (page, chunk) in pages.iter().zip(out.chunks_mut(l.block_len())) {
            self.read_block_f32(*page, layer, head, kind, chunk)?;
        }
        Ok(())
    }

    /// Copies positions `0..len` of page `src` to page `dst` in one layer's blocks.
    pub fn copy_positions(
        &mut self,
        src: PageId,
        dst: PageId,
        layer: usize,
        len: usize,
    ) -> Result<()> {
        Self::check_index("position count", len, self.layout.page_size + 1)?;
        let n = len * self.row_units();
        for head in 0..self.layout.n_head_kv {
            for kind in [KvKind::Key, KvKind::Value] {
                let s = self.block_start(src, layer, head, kind)?;
                let d = self.block_start(dst, layer, head, kind)?;
                self.data.copy_within(s, n, d);
            }
        }
        Ok(())
    }

    /// Copies every value of page `src` to page `dst` (copy-on-write).
    pub fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<()> {
        self.check_page(src)?;
        self.check_page(dst)?;
        // One block per (layer, kind, head), each in its own region of the pool.
        let blocks = self.page_elems / self.layout.block_len();
        let block = self.layout.page_size * self.row_units();
        for b in 0..blocks {
            let region = b * self.n_pages * block;
            let (s, d) = (region + src.index() * block, region + dst.index() * block);
            self.data.copy_within(s, block, d);
        }
        Ok(())
    }
}

impl PageStore for KvStorage {
    fn layout(&self) -> &KvLayout {
        KvStorage::layout(self)
    }

    fn n_pages(&self) -> usize {
        KvStorage::n_pages(self)
    }

    fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<()> {
        KvStorage::copy_page(self, src, dst)
    }
}

/// The K/V values of a cache whose pages are in host memory ([`KvStorage`]), through its
/// page tables.
pub trait HostPages {
    /// The values in host memory.
    fn storage(&self) -> Result<&KvStorage>;

    /// Writes the K/V rows of tokens of `layer` to their slots in the layer's group (see
    /// [`KvStorage::write_tokens`]). The slots should come from
    /// [`PagedKvCache::append_slots`]; writing is not checked against sharing.
    fn write(
        &mut self,
        slots: &[Vec<Slot>],
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()>;

    /// Writes the K/V rows of position `pos` of `seq` in `layer`. Refuses
    /// ([`KvError::SharedPage`]) to write into a page other sequences share.
    fn write_pos(
        &mut self,
        seq: SeqId,
        pos: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()>;

    /// The keys and values of the first `n_tokens` positions of `seq` for one (layer, KV
    /// head), gathered through its page table as f32 into `keys` and `values`, which hold
    /// exactly `n_tokens * head_dim` values each.
    fn read_head_f32(
        &self,
        seq: SeqId,
        layer: usize,
        head: usize,
        n_tokens: usize,
        keys: &mut [f32],
        values: &mut [f32],
    ) -> Result<()>;
}

impl HostPages for PagedKvCache {
    fn storage(&self) -> Result<&KvStorage> {
        self.store()
    }

    fn write(
        &mut self,
        slots: &[Vec<Slot>],
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let group = self.groups().place(layer)?.0;
        let slots = slots.get(group).ok_or(KvError::OutOfRange {
            what: "layer group",
            index: group,
            len: slots.len(),
        })?;
        self.store_mut::<KvStorage>()?
            .write_tokens(slots, layer, keys, values)
    }

    fn write_pos(
        &mut self,
        seq: SeqId,
        pos: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let slot = self.writable_slot(seq, pos, layer)?;
        self.store_mut::<KvStorage>()?
            .write_token(slot, layer, keys, values)
    }

    fn read_head_f32(
        &self,
        seq: SeqId,
        layer: usize,
        head: usize,
        n_tokens: usize,
        keys: &mut [f32],
        values: &mut [f32],
    ) -> Result<()> {
        let len = self.sequences().seq_len(seq)?;
        if n_tokens > len {
            return Err(KvError::OutOfRange {
                what: "token count",
                index: n_tokens,
                len: len + 1,
            });
        }
        let pages = self.page_table(seq, layer)?;
        let storage = self.storage()?;
        storage.gather_f32(pages, n_tokens, layer, head, KvKind::Key, keys)?;
        storage.gather_f32(pages, n_tokens, layer, head, KvKind::Value, values)
    }
}

/// A cache in host memory whose pool is as large as `budget` allows, each page holding the
/// layers of one of `groups` (`layout.page_layers` must be their size).
pub fn host_cache(layout: KvLayout, groups: LayerGroups, budget: KvBudget) -> Result<PagedKvCache> {
    let n_pages = tallow_kv::pages_for_budget(&layout, budget)?;
    // The values first: they are the large allocation, the one that fails first. The
    // storage checks that the groups fit the layout.
    let storage = KvStorage::grouped(layout, &groups, n_pages)?;
    PagedKvCache::over(groups, storage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dtype: KvDtype) -> KvLayout {
        KvLayout::new(2, 3, 4).with_page_size(4).with_dtype(dtype)
    }

    fn row(seed: f32, n: usize) -> Vec<f32> {
        (0..n).map(|i| seed + i as f32 * 0.37 - 1.1).collect()
    }

    #[test]
    fn one_head_of_a_page_is_one_contiguous_block() {
        let mut s = KvStorage::new(layout(KvDtype::F32), 3).unwrap();
        assert_eq!(s.n_bytes(), 3 * 2 * 2 * 3 * 4 * 4 * 4);
        let k: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..12).map(|i| 100.0 + i as f32).collect();
        s.write_token(
            Slot {
                page: PageId(1),
                offset: 2,
            },
            1,
            &k,
            &v,
        )
        .unwrap();
        let kb = s.block_f32(PageId(1), 1, 2, KvKind::Key).unwrap();
        assert_eq!(kb.len(), 16);
        assert_eq!(&kb[8..12], &[8.0, 9.0, 10.0, 11.0]);
        assert!(kb[..8].iter().chain(&kb[12..]).all(|&x| x == 0.0));
        let vb = s.block_f32(PageId(1), 1, 0, KvKind::Value).unwrap();
        assert_eq!(&vb[8..12], &[100.0, 101.0, 102.0, 103.0]);
        // Nothing else changed: other layer, other page.
        assert!(s
            .block_f32(PageId(1), 0, 2, KvKind::Key)
            .unwrap()
            .iter()
            .all(|&x| x == 0.0));
        assert!(s
            .block_f32(PageId(0), 1, 2, KvKind::Key)
            .unwrap()
            .iter()
            .all(|&x| x == 0.0));
        assert!(s
            .block_f32(PageId(2), 1, 2, KvKind::Key)
            .unwrap()
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn quantized_pages_hold_each_row_as_ggml_quantizes_it() {
        for (dtype, format) in [
            (KvDtype::Q8_0, GgmlType::Q8_0),
            (KvDtype::Q4_0, GgmlType::Q4_0),
        ] {
            // Two KV heads of 64 values: two blocks a row.
            let l = KvLayout::new(2, 2, 64).with_page_size(4).with_dtype(dtype);
            let mut s = KvStorage::new(l, 3).unwrap();
            assert_eq!(s.n_bytes(), 3 * 2 * 2 * 2 * 4 * l.row_bytes());
            assert_eq!(l.row_bytes(), format.block_bytes() * 2);
            let slots: Vec<Slot> = (0..3)
                .map(|o| Slot {
                    page: PageId(2),
                    offset: o,
                })
                .collect();
            let k = row(0.3, 3 * 128);
            let v = row(-7.0, 3 * 128);
            s.write_tokens(&slots, 1, &k, &v).unwrap();
            s.copy_page(PageId(2), PageId(0)).unwrap();
            for (kind, src) in [(KvKind::Key, &k), (KvKind::Value, &v)] {
                for head in 0..2 {
                    let mut got = vec![0.0; 3 * 64];
                    s.read_block_f32(PageId(0), 1, head, kind, &mut got)
                        .unwrap();
                    for (slot, got) in got.chunks(64).enumerate() {
                        let x = &src[slot * 128 + head * 64..][..64];
                        let mut bytes = vec![0u8; l.row_bytes()];
                        tallow_quant::quantize_row(format, x, &mut bytes).unwrap();
                        let mut want = vec![0.0; 64];
                        tallow_quant::dequantize(format, &bytes, &mut want).unwrap();
                        assert_eq!(got, want, "{dtype:?} {kind:?} head {head} slot {slot}");
                    }
                }
            }
            // The other layer is untouched.
            let mut other = vec![1.0; 64];
            s.read_block_f32(PageId(0), 0, 0, KvKind::Key, &mut other)
                .unwrap();
            assert!(other.iter().all(|&x| x == 0.0));
        }
        let odd = KvLayout::new(1, 1, 48).with_dtype(KvDtype::Q8_0);
        assert!(matches!(
            KvStorage::new(odd, 1),
            Err(KvError::InvalidLayout(_))
        ));
    }

    #[test]
    fn f16_round_trip_is_within_half_precision() {
        let mut s = KvStorage::new(layout(KvDtype::F16), 2).unwrap();
        let slots: Vec<Slot> = (0..4)
            .map(|o| Slot {
                page: PageId(1),
                offset: o,
            })
            .collect();
        let k = row(0.3, 4 * 12);
        let v = row(-7.0, 4 * 12);
        s.write_tokens(&slots, 0, &k, &v).unwrap();
        for head in 0..3 {
            let mut out = vec![0.0; 16];
            s.read_block_f32(PageId(1), 0, head, KvKind::Key, &mut out)
                .unwrap();
            let raw = s.block_f16(PageId(1), 0, head, KvKind::Key).unwrap();
            for slot in 0..4 {
                for d in 0..4 {
                    let want = k[slot * 12 + head * 4 + d];
                    let got = out[slot * 4 + d];
                    assert!(
                        (got - want).abs() <= want.abs() * 1e-3 + 1e-4,
                        "{got} vs {want}"
                    );
                    assert_eq!(raw[slot * 4 + d], f16::from_f32(want));
                }
            }
        }
        assert!(matches!(
            s.block_f32(PageId(0), 0, 0, KvKind::Key),
            Err(KvError::DtypeMismatch {
                requested: KvDtype::F32,
                actual: KvDtype::F16
            })
        ));
    }

    /// bf16 pages keep each value rounded to the nearest bfloat16 (ties to even), f32's range
    /// included, and read back exactly what they hold.
    #[test]
    fn bf16_pages_hold_each_value_rounded_to_nearest_even() {
        let mut s = KvStorage::new(layout(KvDtype::Bf16), 2).unwrap();
        // Ties (the 17th bit set and nothing below it), just past ties, values past f16's
        // range, and the ordinary rows.
        let mut k = row(0.3, 2 * 12);
        k[..6].copy_from_slice(&[
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x3f80_8001),
            -1e30,
            7e4,
            1e-30,
        ]);
        let v = row(-7.0, 2 * 12);
        let slots = [0, 1].map(|o| Slot {
            page: PageId(1),
            offset: o,
        });
        s.write_tokens(&slots, 1, &k, &v).unwrap();
        // The rounding spelt out on the bits: add half an ulp of bf16, less one where the
        // kept part is even, and cut.
        let nearest_even = |x: f32| {
            let b = x.to_bits();
            f32::from_bits((b + 0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
        };
        for (kind, src) in [(KvKind::Key, &k), (KvKind::Value, &v)] {
            for head in 0..3 {
                let mut out = vec![0.0; 8];
                s.read_block_f32(PageId(1), 1, head, kind, &mut out)
                    .unwrap();
                for slot in 0..2 {
                    for d in 0..4 {
                        let want = nearest_even(src[slot * 12 + head * 4 + d]);
                        assert_eq!(out[slot * 4 + d].to_bits(), want.to_bits());
                    }
                }
            }
        }
        let mut first = vec![0.0; 4];
        s.read_block_f32(PageId(1), 1, 0, KvKind::Key, &mut first)
            .unwrap();
        // Ties go to the even neighbour, a bit past a tie up; f16 would make -1e30 infinite.
        assert_eq!(first[..3], [1.0, f32::from_bits(0x3f82_0000), 1.0078125]);
        assert!((first[3] / -1e30 - 1.0).abs() < 1e-2);
    }

    #[test]
    fn bad_indices_are_errors_and_write_nothing() {
        let mut s = KvStorage::new(layout(KvDtype::F32), 2).unwrap();
        let k = row(1.0, 24);
        let good = Slot {
            page: PageId(0),
            offset: 0,
        };
        let slots = [
            good,
            Slot {
                page: PageId(2),
                offset: 0,
            },
        ];
        assert_eq!(
            s.write_tokens(&slots, 0, &k, &k).unwrap_err(),
            KvError::PageOutOfRange {
                page: PageId(2),
                n_pages: 2
            }
        );
        let slots = [
            good,
            Slot {
                page: PageId(1),
                offset: 4,
            },
        ];
        assert!(matches!(
            s.write_tokens(&slots, 0, &k, &k),
            Err(KvError::OutOfRange { what: "slot", .. })
        ));
        assert!(s
            .block_f32(PageId(0), 0, 0, KvKind::Key)
            .unwrap()
            .iter()
            .all(|&x| x == 0.0));
        assert!(matches!(
            s.write_token(good, 2, &k[..12], &k[..12]),
            Err(KvError::OutOfRange { what: "layer", .. })
        ));
        assert_eq!(
            s.write_token(good, 0, &k[..11], &k[..12]).unwrap_err(),
            KvError::ShapeMismatch {
                what: "keys",
                expected: 12,
                got: 11
            }
        );
        assert!(matches!(
            s.block(PageId(0), 0, 3, KvKind::Value),
            Err(KvError::OutOfRange {
                what: "KV head",
                ..
            })
        ));
        assert!(s.copy_page(PageId(0), PageId(5)).is_err());
        let mut out = vec![0.0; 5 * 4];
        assert!(s
            .gather_f32(&[PageId(0)], 5, 0, 0, KvKind::Key, &mut out)
            .is_err());
        assert!(matches!(
            s.gather_f32(&[PageId(0)], 2, 0, 0, KvKind::Key, &mut out),
            Err(KvError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn copy_positions_copies_one_layer_up_to_len() {
        let mut s = KvStorage::new(layout(KvDtype::F32), 2).unwrap();
        for layer in 0..2 {
            for o in 0..4 {
                let k = row(layer as f32 + o as f32, 12);
                let v = row(-(layer as f32) - o as f32, 12);
                let slot = |page| Slot { page, offset: o };
                s.write_token(slot(PageId(0)), layer, &k, &v).unwrap();
            }
        }
        s.copy_positions(PageId(0), PageId(1), 1, 3).unwrap();
        for head in 0..3 {
            for kind in [KvKind::Key, KvKind::Value] {
                let KvBlock::F32(src) = s.block(PageId(0), 1, head, kind).unwrap() else {
                    unreachable!()
                };
                let KvBlock::F32(dst) = s.block(PageId(1), 1, head, kind).unwrap() else {
                    unreachable!()
                };
                assert_eq!(src[..12], dst[..12]);
                assert!(dst[12..].iter().all(|&x| x == 0.0));
                let KvBlock::F32(other) = s.block(PageId(1), 0, head, kind).unwrap() else {
                    unreachable!()
                };
                assert!(other.iter().all(|&x| x == 0.0));
            }
        }
        assert!(s.copy_positions(PageId(0), PageId(1), 0, 5).is_err());
        assert!(s.copy_positions(PageId(0), PageId(2), 0, 1).is_err());
    }

    #[test]
    fn copy_page_copies_every_layer_and_head() {
        for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Bf16] {
            let mut s = KvStorage::new(layout(dtype), 3).unwrap();
            for layer in 0..2 {
                for o in 0..4 {
                    let k = row(layer as f32 + o as f32, 12);
                    let v = row(-(layer as f32) - o as f32, 12);
                    s.write_token(
                        Slot {
                            page: PageId(0),
                            offset: o,
                        },
                        layer,
                        &k,
                        &v,
                    )
                    .unwrap();
                }
            }
            s.copy_page(PageId(0), PageId(2)).unwrap();
            for layer in 0..2 {
                for head in 0..3 {
                    for kind in [KvKind::Key, KvKind::Value] {
                        assert_eq!(
                            s.block(PageId(0), layer, head, kind).unwrap(),
                            s.block(PageId(2), layer, head, kind).unwrap()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn gather_reads_through_a_page_table() {
        let mut s = KvStorage::new(layout(KvDtype::F32), 4).unwrap();
        let table = [PageId(3), PageId(1)];
        for pos in 0..6 {
            let slot = Slot {
                page: table[pos / 4],
                offset: pos % 4,
            };
            let k = row(pos as f32 * 10.0, 12);
            s.write_token(slot, 1, &k, &k).unwrap();
        }
        let mut out = vec![0.0; 24];
        s.gather_f32(&table, 6, 1, 2, KvKind::Value, &mut out)
            .unwrap();
        assert_eq!(out.len(), 24);
        for pos in 0..6 {
            assert_eq!(
                &out[pos * 4..pos * 4 + 4],
                &row(pos as f32 * 10.0, 12)[8..12]
            );
        }
    }
}
