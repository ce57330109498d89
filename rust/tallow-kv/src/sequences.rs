//! Per-sequence page tables over the allocator: append, truncate, fork, copy-on-write, free,
//! and the pages sliding-window layer groups give back.

use std::collections::BTreeMap;

use crate::allocator::PageAllocator;
use crate::error::{KvError, Result};
use crate::prefix::{PrefixCache, PrefixStats};
use crate::{PageId, SeqId, Slot};

/// A page copy the owner of the K/V data must perform before writing the appended slots:
/// copy-on-write of a shared, partly filled last page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    /// The shared page (still used by the other sequences).
    pub src: PageId,
    /// The new page that replaces it in the appending sequence.
    pub dst: PageId,
}

/// The result of [`Sequences::append_slots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Position of the first appended token in its sequence.
    pub first_pos: usize,
    /// For each layer group, where to write each appended token, in order.
    pub slots: Vec<Vec<Slot>>,
    /// Pages to copy before writing (copy-on-write), at most one per group.
    pub copies: Vec<CopyOp>,
}

/// An entry of a page table whose page a sliding-window group gave back: no query of the
/// sequence reads it any more.
const RELEASED: PageId = PageId(u32::MAX);

#[derive(Debug, Clone, Default)]
struct SeqEntry {
    /// One page table per layer group; the first `released[g]` entries of group `g` are
    /// [`RELEASED`].
    tables: Vec<Vec<PageId>>,
    released: Vec<usize>,
    len: usize,
    /// Token ids committed to the sequence (those whose KV is written), at most `len`.
    tokens: Vec<u32>,
    /// Prefix-cache keys of its first `keys.len()` pages, all full and committed.
    keys: Vec<u64>,
    /// Keys the first page's: sequences with different salts share nothing.
    salt: u64,
}

impl SeqEntry {
    /// The key the next full page chains from.
    fn last_key(&self) -> u64 {
        self.keys.last().copied().unwrap_or(self.salt)
    }

    /// Pages the sequence holds (in every group).
    fn held(&self) -> impl Iterator<Item = PageId> + '_ {
        self.tables
            .iter()
            .zip(&self.released)
            .flat_map(|(t, &r)| t[r..].iter().copied())
    }
}

/// Per layer group, the index of the first page a sequence keeps and the pages from there on.
type Kept = Vec<(usize, Vec<PageId>)>;

/// What [`Sequences::match_prefix`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Leading tokens whose KV is cached (whole pages, then maybe part of one).
    pub tokens: usize,
    /// Of the pages holding them, those waiting in the free list: attaching takes them out of
    /// it, as allocation would.
    pub free_pages: usize,
}

/// Numbers about the pool and its sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvStats {
    /// Pages in the pool.
    pub pages_total: usize,
    /// Pages with a non-zero reference count.
    pub pages_used: usize,
    /// Free pages.
    pub pages_free: usize,
    /// Pages referenced by more than one page table.
    pub pages_shared: usize,
    /// Token slots holding KV: for each page in use, the most slots any sequence using it
    /// fills (a page shared by forks counts once).
    pub tokens_stored: usize,
    /// Sum of the sequences' lengths (shared tokens count once per sequence).
    pub seq_tokens: usize,
    /// Live sequences.
    pub n_sequences: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// The prefix cache's counters.
    pub prefix: PrefixStats,
}

impl KvStats {
    /// `tokens_stored / (pages_used * page_size)`; 1.0 when no page is in use.
    pub fn utilization(&self) -> f64 {
        let cap = self.pages_used * self.page_size;
        if cap == 0 {
            1.0
        } else {
            self.tokens_stored as f64 / cap as f64
        }
    }
}

/// Page tables of every live sequence, and the allocator their pages come from. This is pure
/// bookkeeping (no K/V data), so it can drive a pool on the host or on a device: copies needed
/// by copy-on-write are returned as [`CopyOp`]s.
///
/// Each sequence has one page table per layer group (see [`crate::LayerGroups`]), all from
/// one pool. A group with a sliding window of `w` positions gives back, when the sequence
/// appends at position `q`, the pages wholly before `q + 1 - w`: no later query sees them.
///
/// Sequence ids are assigned `0, 1, 2, ...` by [`Sequences::create`] and
/// [`Sequences::fork`] and never reused. Pages of a sequence are released from its last page
/// to its first, so with the FIFO free list a sequence's tail pages are reused before its
/// prefix pages.
#[derive(Debug, Clone)]
pub struct Sequences {
    page_size: usize,
    /// The sliding window of each layer group (`None`: keeps every position).
    windows: Vec<Option<usize>>,
    alloc: PageAllocator,
    seqs: BTreeMap<SeqId, SeqEntry>,
    next_id: u64,
    prefix: PrefixCache,
}

impl Sequences {
    /// Bookkeeping for a pool of `n_pages` pages of `page_size` tokens, one page table per
    /// sequence.
    pub fn new(page_size: usize, n_pages: usize) -> Result<Self> {
        Self::grouped(page_size, n_pages, &[None])
    }

    /// Bookkeeping with one page table per layer group, `windows[g]` being group `g`'s
    /// sliding window.
    pub fn grouped(page_size: usize, n_pages: usize, windows: &[Option<usize>]) -> Result<Self> {
        if page_size == 0 {
            return Err(KvError::InvalidLayout(
                "page_size must be at least 1".into(),
            ));
        }
        if windows.is_empty() || windows.contains(&Some(0)) {
            return Err(KvError::InvalidLayout(
                "at least one layer group, and windows of at least one position".into(),
            ));
        }
        Ok(Sequences {
            page_size,
            windows: windows.to_vec(),
            alloc: PageAllocator::new(n_pages)?,
            seqs: BTreeMap::new(),
            next_id: 0,
            prefix: PrefixCache::new(page_size, n_pages)?,
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Layer groups (page tables per sequence).
    pub fn n_groups(&self) -> usize {
        self.windows.len()
    }

    /// The allocator (reference counts, free list).
    pub fn allocator(&self) -> &PageAllocator {
        &self.alloc
    }

    /// A new empty sequence.
    pub fn create(&mut self) -> SeqId {
        self.create_salted(0)
    }

    /// A new empty sequence whose cached prefixes are those of sequences with the same
    /// `salt`: give sequences whose KV differs for the same tokens (another adapter) another
    /// salt.
    pub fn create_salted(&mut self, salt: u64) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let groups = self.windows.len();
        let entry = SeqEntry {
            tables: vec![Vec::new(); groups],
            released: vec![0; groups],
            salt,
            ..SeqEntry::default()
        };
        self.seqs.insert(id, entry);
        id
    }

    fn entry(&self, seq: SeqId) -> Result<&SeqEntry> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    /// Whether `seq` is live.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Live sequences, in id order.
    pub fn seq_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    /// Number of live sequences.
    pub fn n_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens in `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.entry(seq)?.len)
    }

    /// The page table of `seq` in layer group `group`: position `pos` lives in page
    /// `table[pos / page_size]`. Entries a sliding window gave back hold an id past the
    /// pool (`u32::MAX`), which every read refuses.
    pub fn page_table(&self, seq: SeqId, group: usize) -> Result<&[PageId]> {
        let e = self.entry(seq)?;
        e.tables
            .get(group)
            .map(Vec::as_slice)
            .ok_or(KvError::OutOfRange {
                what: "layer group",
                index: group,
                len: e.tables.len(),
            })
    }

    /// Where position `pos` of `seq` lives in layer group `group`.
    pub fn slot(&self, seq: SeqId, group: usize, pos: usize) -> Result<Slot> {
        let e = self.entry(seq)?;
        let table = self.page_table(seq, group)?;
        let first = e.released[group] * self.page_size;
        if pos >= e.len || pos < first {
            return Err(KvError::OutOfRange {
                what: "position",
                index: pos,
                len: e.len,
            });
        }
        Ok(Slot {
            page: table[pos / self.page_size],
            offset: pos % self.page_size,
        })
    }

    /// Pages of group `g` that no query at position `q` or later sees: those before page
    /// `floor((q + 1 - w) / page_size)` for a window `w`.
    fn keep_from(&self, g: usize, q: usize) -> usize {
        self.windows[g].map_or(0, |w| (q + 1).saturating_sub(w) / self.page_size)
    }

    /// Whether appending to group `g` of `e` must first copy its last page: it is partly
    /// filled and shared with another sequence, or cached (taken in part from the cache).
    fn needs_cow(&self, e: &SeqEntry, g: usize) -> Result<bool> {
        if e.len.is_multiple_of(self.page_size) {
            return Ok(false);
        }
        let last = *e.tables[g].last().expect("a non-empty sequence has pages");
        // A cached page taken in part (see [`PrefixCache`]) keeps what it holds for others.
        Ok(self.alloc.refcount(last)? > 1 || self.prefix.is_cached(last))
    }

    /// Pages [`Sequences::append_slots`] would take from the free list for `n` more tokens
    /// (copy-on-write pages included), less the pages its windowed groups give back to the
    /// free list first (never below zero).
    pub fn pages_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        let e = self.entry(seq)?;
        if n == 0 {
            return Ok(0);
        }
        let total = e.len.checked_add(n).ok_or(KvError::OutOfRange {
            what: "token count",
            index: n,
            len: usize::MAX - e.len,
        })?;
        let (mut taken, mut given) = (0, 0);
        for g in 0..self.windows.len() {
            taken += total.div_ceil(self.page_size) - e.tables[g].len();
            taken += usize::from(self.needs_cow(e, g)?);
            for &p in &e.tables[g][e.released[g]..self.keep_from(g, e.len).max(e.released[g])] {
                given += usize::from(self.alloc.refcount(p)? == 1);
            }
        }
        Ok(taken.saturating_sub(given))
    }

    /// The most tokens, up to `want`, that `seq` can append while taking at most `free`
    /// pages from the free list (see [`Sequences::pages_needed`]).
    pub fn max_append(&self, seq: SeqId, want: usize, free: usize) -> Result<usize> {
        // pages_needed grows with n: the largest n that fits, by bisection.
        let (mut lo, mut hi) = (0, want);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.pages_needed(seq, mid)? <= free {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    /// Reserves `n` more token positions at the end of `seq` and returns the slots to write
    /// them to. All or nothing: when the pool cannot supply the pages,
    /// [`KvError::OutOfPages`] is returned and nothing changes.
    ///
    /// Windowed groups first give back the pages no query from the first new position on can
    /// see. Copy-on-write: if a group's last page is partly filled and shared (refcount > 1) or cached,
    /// a new page is allocated first (before any page for new positions), takes the old one's
    /// place in this sequence's table, and the old page loses one reference;
    /// [`Appended::copies`] says which page to copy into which. Pages the slots point into
    /// are owned by `seq` alone.
    pub fn append_slots(&mut self, seq: SeqId, n: usize) -> Result<Appended> {
        let needed = self.pages_needed(seq, n)?;
        let e = self.entry(seq)?;
        let first_pos = e.len;
        let groups = self.windows.len();
        if n == 0 {
            return Ok(Appended {
                first_pos,
                slots: vec![Vec::new(); groups],
                copies: Vec::new(),
            });
        }
        if needed > self.alloc.n_free() {
            return Err(KvError::OutOfPages {
                needed,
                free: self.alloc.n_free(),
            });
        }
        let cow: Vec<bool> = (0..groups)
            .map(|g| self.needs_cow(e, g))
            .collect::<Result<_>>()?;
        for g in 0..groups {
            self.release_before(seq, g, self.keep_from(g, first_pos))?;
        }
        let ps = self.page_size;
        let mut appended = Appended {
            first_pos,
            slots: Vec::with_capacity(groups),
            copies: Vec::new(),
        };
        for (g, cow) in cow.into_iter().enumerate() {
            let table_len = self.entry(seq)?.tables[g].len();
            let fresh = (first_pos + n).div_ceil(ps) - table_len + usize::from(cow);
            let mut pages = Vec::with_capacity(fresh);
            for _ in 0..fresh {
                pages.push(self.take_free_page()?);
            }
            let mut pages = pages.into_iter();
            let e = self.seqs.get_mut(&seq).expect("checked above");
            let table = &mut e.tables[g];
            if cow {
                let dst = pages.next().expect("allocated");
                let src = std::mem::replace(table.last_mut().expect("non-empty"), dst);
                // Another sequence's, or back to the free list with its key (still cached).
                self.alloc.release(src)?;
                appended.copies.push(CopyOp { src, dst });
            }
            table.extend(pages);
            let slots = (first_pos..first_pos + n)
                .map(|pos| Slot {
                    page: table[pos / ps],
                    offset: pos % ps,
                })
                .collect();
            appended.slots.push(slots);
        }
        self.seqs.get_mut(&seq).expect("checked above").len += n;
        Ok(appended)
    }

    /// Gives back the pages of group `g` of `seq` before page `keep_from` (a sliding
    /// window's), first to last.
    fn release_before(&mut self, seq: SeqId, g: usize, keep_from: usize) -> Result<()> {
        let e = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let end = keep_from.min(e.tables[g].len());
        for i in e.released[g]..end {
            let page = std::mem::replace(&mut e.tables[g][i], RELEASED);
            self.alloc.release(page)?;
        }
        e.released[g] = e.released[g].max(end);
        Ok(())
    }

    /// Keeps the first `keep` tokens of `seq`, dropping the rest (rejected speculative
    /// tokens); returns the pages that became free, in the order they went to the free list
    /// (last page first). Pages past the kept tokens lose this sequence's reference; a kept,
    /// partly filled shared page stays shared until the next append copies it. Refused
    /// ([`KvError::WindowReleased`]) where a windowed group already gave back K/V that a
    /// query at position `keep` sees.
    pub fn truncate(&mut self, seq: SeqId, keep: usize) -> Result<Vec<PageId>> {
        let ps = self.page_size;
        let e = self.entry(seq)?;
        if keep > e.len {
            return Err(KvError::TruncateBeyondLength {
                seq,
                keep,
                len: e.len,
            });
        }
        for g in 0..self.windows.len() {
            if e.released[g] > self.keep_from(g, keep) {
                return Err(KvError::WindowReleased {
                    seq,
                    keep,
                    released: e.released[g] * ps,
                });
            }
        }
        let e = self.seqs.get_mut(&seq).expect("checked above");
        e.len = keep;
        e.tokens.truncate(keep);
        e.keys.truncate(keep / ps);
        let mut freed = Vec::new();
        for table in &mut e.tables {
            let dropped = table.split_off(keep.div_ceil(ps));
            if !keep.is_multiple_of(ps) {
                // The kept last page is no longer full: it will be written again, so its key
                // no longer describes it, unless other sequences still use it whole (then the
                // next append copies it).
                let last = *table.last().expect("a partly kept page");
                if self.alloc.refcount(last)? == 1 {
                    self.prefix.forget(last, false);
                }
            }
            freed.extend(Self::release_all(&mut self.alloc, &dropped)?);
        }
        Ok(freed)
    }

    /// Releases pages last to first; returns those that became free.
    fn release_all(alloc: &mut PageAllocator, pages: &[PageId]) -> Result<Vec<PageId>> {
        let mut freed = Vec::new();
        for &p in pages.iter().rev() {
            if alloc.release(p)? {
                freed.push(p);
            }
        }
        Ok(freed)
    }

    /// A new sequence with the same tokens as `seq`, sharing all its pages (each page's
    /// reference count goes up by one). Allocates nothing.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let e = self.entry(seq)?.clone();
        for p in e.held() {
            if self.alloc.refcount(p)? == u32::MAX {
                return Err(KvError::RefcountOverflow(p));
            }
        }
        for p in e.held() {
            self.alloc.retain(p)?;
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(id, e);
        Ok(id)
    }

    /// Ends `seq`: its pages lose one reference each (each group's last page first); returns
    /// those that became free.
    pub fn free(&mut self, seq: SeqId) -> Result<Vec<PageId>> {
        let e = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let mut freed = Vec::new();
        for (table, &released) in e.tables.iter().zip(&e.released) {
            freed.extend(Self::release_all(&mut self.alloc, &table[released..])?);
        }
        Ok(freed)
    }

    /// Takes a page from the head of the free list; a cached page taken so is evicted.
    fn take_free_page(&mut self) -> Result<PageId> {
        let page = self.alloc.allocate()?;
        self.prefix.forget(page, true);
        Ok(page)
    }

    /// The cached pages of the longest prefix of `tokens` (at most `max_tokens` tokens) that a
    /// sequence created with `salt` can continue from: whole pages, then part of one where a
    /// cached page after the last begins with the next tokens (see [`PrefixCache`]); every
    /// page in a global group, and in a windowed group the pages a query at the prefix's end
    /// sees. Returns the whole pages' keys, the tokens of the prefix and, per group, its first
    /// kept page and the pages from there on.
    fn find_prefix(&self, salt: u64, tokens: &[u32], max_tokens: usize) -> (Vec<u64>, usize, Kept) {
        let ps = self.page_size;
        let groups = self.windows.len();
        let tokens = &tokens[..max_tokens.min(tokens.len())];
        let mut keys = Vec::new();
        // found[g][i]: group g's cached page for prefix page i, for each page while every
        // global group has one.
        let mut found: Vec<Vec<Option<PageId>>> = vec![Vec::new(); groups];
        let mut parent = salt;
        for page_tokens in tokens.chunks_exact(ps) {
            let key = self.prefix.key(parent, page_tokens);
            let pages: Vec<_> = (0..groups)
                .map(|g| self.prefix.find(g, parent, key, page_tokens))
                .collect();
            let global_miss = (0..groups).any(|g| self.windows[g].is_none() && pages[g].is_none());
            if global_miss {
                break;
            }
            for (f, p) in found.iter_mut().zip(pages) {
                f.push(p);
            }
            keys.push(key);
            parent = key;
        }
        // Part of one more page, where every group has it.
        let rest = &tokens[keys.len() * ps..];
        let partial = self
            .prefix
            .longest_child(parent, &rest[..rest.len().min(ps)])
            .and_then(|(key, n)| {
                let pages: Option<Vec<PageId>> =
                    (0..groups).map(|g| self.prefix.page_of(key, g)).collect();
                pages.map(|pages| (n, pages))
            });
        if let Some((n, pages)) = partial {
            let mut with = found.clone();
            for (f, p) in with.iter_mut().zip(pages) {
                f.push(Some(p));
            }
            let len = keys.len() * ps + n;
            if let Some(kept) = self.try_kept(&with, keys.len() + 1, len) {
                return (keys, len, kept);
            }
        }
        // The longest prefix of whole pages whose windowed groups hold every page its end
        // sees.
        let mut m = keys.len();
        loop {
            if let Some(kept) = self.try_kept(&found, m, m * ps) {
                keys.truncate(m);
                return (keys, m * ps, kept);
            }
            m -= 1;
        }
    }

    /// Per group, the first page a query at `len` sees and the pages from there to page
    /// `pages` (of `found`, see [`Sequences::find_prefix`]); `None` where a windowed group
    /// misses one.
    fn try_kept(&self, found: &[Vec<Option<PageId>>], pages: usize, len: usize) -> Option<Kept> {
        (0..self.windows.len())
            .map(|g| {
                let from = self.keep_from(g, len).min(pages);
                found[g][from..pages]
                    .iter()
                    .copied()
                    .collect::<Option<Vec<_>>>()
                    .map(|pages| (from, pages))
            })
            .collect()
    }

    /// The longest cached prefix of `tokens`, at most `max_tokens` tokens (whole pages, then
    /// maybe part of one),
    /// for a sequence created with `salt` (see [`Sequences::attach_prefix`]). Changes
    /// nothing.
    pub fn match_prefix(&self, salt: u64, tokens: &[u32], max_tokens: usize) -> PrefixMatch {
        let (_, len, kept) = self.find_prefix(salt, tokens, max_tokens);
        let free_pages = kept
            .iter()
            .flat_map(|(_, pages)| pages)
            // A page appears once (its key includes its parent's and its group).
            .filter(|&&p| self.alloc.refcount(p).unwrap_or(1) == 0)
            .count();
        PrefixMatch {
            tokens: len,
            free_pages,
        }
    }

    /// Gives the empty sequence `seq` the cached pages of the longest cached prefix of
    /// `tokens` (at most `max_tokens` tokens, whole pages and maybe part of one; see
    /// [`Sequences::match_prefix`]): they join its page tables, shared, and their tokens count
    /// as committed. A windowed
    /// group gets only the pages a query at the prefix's end sees. Returns the tokens
    /// attached. Counts `tokens.len()` looked-up tokens in the prefix statistics.
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Result<usize> {
        let e = self.entry(seq)?;
        if e.len > 0 {
            return Err(KvError::NotEmpty(seq));
        }
        let (keys, n, kept) = self.find_prefix(e.salt, tokens, max_tokens);
        for &page in kept.iter().flat_map(|(_, pages)| pages) {
            if self.alloc.refcount(page)? == 0 {
                self.alloc.revive(page)?;
            } else {
                self.alloc.retain(page)?;
            }
        }
        self.prefix.count_lookup(tokens.len(), n);
        let e = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        for (g, (from, pages)) in kept.into_iter().enumerate() {
            e.tables[g] = vec![RELEASED; from];
            e.tables[g].extend(pages);
            e.released[g] = from;
        }
        e.keys = keys;
        e.len = n;
        e.tokens.extend_from_slice(&tokens[..n]);
        Ok(n)
    }

    /// Records the token ids of the next positions of `seq` whose KV has been written, and
    /// registers every page they complete in the prefix cache (in each group that still holds
    /// it). The committed tokens never outnumber the sequence's positions.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        let ps = self.page_size;
        let e = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if e.tokens.len() + tokens.len() > e.len {
            return Err(KvError::TooManyTokens {
                seq,
                len: e.len,
                tokens: e.tokens.len() + tokens.len(),
            });
        }
        e.tokens.extend_from_slice(tokens);
        while e.keys.len() < e.tokens.len() / ps {
            let i = e.keys.len();
            let (parent, page_tokens) = (e.last_key(), &e.tokens[i * ps..(i + 1) * ps]);
            let key = self.prefix.key(parent, page_tokens);
            for (g, table) in e.tables.iter().enumerate() {
                if i >= e.released[g] {
                    self.prefix.register(table[i], g, parent, key, page_tokens);
                }
            }
            e.keys.push(key);
        }
        Ok(())
    }

    /// Whether `page` is in the prefix cache (false for a page outside the pool).
    pub fn is_cached(&self, page: PageId) -> bool {
        self.prefix.is_cached(page)
    }

    /// Pool and sequence numbers. Walks every page table (O(pages + table entries)).
    pub fn stats(&self) -> KvStats {
        let ps = self.page_size;
        let mut filled = vec![0usize; self.alloc.n_total()];
        let mut refs = vec![0u32; self.alloc.n_total()];
        let mut seq_tokens = 0;
        for e in self.seqs.values() {
            seq_tokens += e.len;
            for (table, &released) in e.tables.iter().zip(&e.released) {
                for (i, p) in table.iter().enumerate().skip(released) {
                    let f = &mut filled[p.index()];
                    *f = (*f).max((e.len - i * ps).min(ps));
                    refs[p.index()] += 1;
                }
            }
        }
        KvStats {
            pages_total: self.alloc.n_total(),
            pages_used: self.alloc.n_used(),
            pages_free: self.alloc.n_free(),
            pages_shared: refs.iter().filter(|&&r| r > 1).count(),
            tokens_stored: filled.iter().sum(),
            seq_tokens,
            n_sequences: self.seqs.len(),
            page_size: ps,
            prefix: self.prefix.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<PageId> {
        v.iter().copied().map(PageId).collect()
    }

    fn rc(s: &Sequences, p: u32) -> u32 {
        s.allocator().refcount(PageId(p)).unwrap()
    }

    #[test]
    fn append_allocates_pages_in_order_and_returns_slots() {
        let mut s = Sequences::new(4, 8).unwrap();
        let a = s.create();
        let b = s.create();
        assert_eq!((a, b), (SeqId(0), SeqId(1)));
        let r = s.append_slots(a, 6).unwrap();
        assert_eq!(r.first_pos, 0);
        assert_eq!(r.copies, vec![]);
        assert_eq!(
            r.slots[0][0],
            Slot {
                page: PageId(0),
                offset: 0
            }
        );
        assert_eq!(
            r.slots[0][5],
            Slot {
                page: PageId(1),
                offset: 1
            }
        );
        assert_eq!(
            s.append_slots(b, 3).unwrap().slots[0][2],
            Slot {
                page: PageId(2),
                offset: 2
            }
        );
        let r = s.append_slots(a, 3).unwrap();
        assert_eq!(r.first_pos, 6);
        assert_eq!(
            r.slots[0],
            vec![
                Slot {
                    page: PageId(1),
                    offset: 2
                },
                Slot {
                    page: PageId(1),
                    offset: 3
                },
                Slot {
                    page: PageId(3),
                    offset: 0
                },
            ]
        );
        assert_eq!(s.page_table(a, 0).unwrap(), ids(&[0, 1, 3]));
        assert_eq!(s.page_table(b, 0).unwrap(), ids(&[2]));
        assert_eq!((s.seq_len(a).unwrap(), s.seq_len(b).unwrap()), (9, 3));
        assert_eq!(
            s.slot(a, 0, 8).unwrap(),
            Slot {
                page: PageId(3),
                offset: 0
            }
        );
        assert!(matches!(
            s.slot(a, 0, 9),
            Err(KvError::OutOfRange {
                what: "position",
                ..
            })
        ));
        assert_eq!(s.allocator().n_used(), 4);
        let r = s.append_slots(b, 0).unwrap();
        assert!(r.slots[0].is_empty());
        assert_eq!(r.first_pos, 3);
    }

    #[test]
    fn free_returns_pages_last_first_to_the_tail_of_the_free_list() {
        let mut s = Sequences::new(2, 6).unwrap();
        let a = s.create();
        let b = s.create();
        s.append_slots(a, 5).unwrap(); // pages 0 1 2
        s.append_slots(b, 1).unwrap(); // page 3
        assert_eq!(s.free(a).unwrap(), ids(&[2, 1, 0]));
        assert_eq!(
            s.allocator().free_pages().collect::<Vec<_>>(),
            ids(&[4, 5, 2, 1, 0])
        );
        let c = s.create();
        s.append_slots(c, 7).unwrap();
        assert_eq!(s.page_table(c, 0).unwrap(), ids(&[4, 5, 2, 1]));
        assert_eq!(s.free(a).unwrap_err(), KvError::UnknownSequence(a));
        assert_eq!(
            KvError::UnknownSequence(a).to_string(),
            "unknown sequence 0"
        );
    }

    #[test]
    fn append_is_all_or_nothing_when_pages_run_out() {
        let mut s = Sequences::new(4, 3).unwrap();
        let a = s.create();
        s.append_slots(a, 5).unwrap(); // pages 0 1
        assert_eq!(s.pages_needed(a, 8).unwrap(), 2);
        let err = s.append_slots(a, 8).unwrap_err();
        assert_eq!(err, KvError::OutOfPages { needed: 2, free: 1 });
        assert_eq!(err.to_string(), "out of KV pages: need 2, only 1 free");
        assert_eq!(s.seq_len(a).unwrap(), 5);
        assert_eq!(s.page_table(a, 0).unwrap(), ids(&[0, 1]));
        assert_eq!(s.allocator().n_free(), 1);
        // Fills page 1 and takes page 2: exactly enough.
        assert_eq!(s.pages_needed(a, 7).unwrap(), 1);
        s.append_slots(a, 7).unwrap();
        assert_eq!(s.page_table(a, 0).unwrap(), ids(&[0, 1, 2]));
        assert_eq!(s.allocator().n_free(), 0);
    }

    #[test]
    fn truncate_frees_exactly_the_pages_past_the_kept_tokens() {
        let mut s = Sequences::new(4, 8).unwrap();
        let a = s.create();
        s.append_slots(a, 14).unwrap(); // pages 0 1 2 3
        assert_eq!(s.truncate(a, 9).unwrap(), ids(&[3]));
        assert_eq!(s.page_table(a, 0).unwrap(), ids(&[0, 1, 2]));
        assert_eq!(s.truncate(a, 8).unwrap(), ids(&[2]));
        assert_eq!(s.truncate(a, 8).unwrap(), ids(&[]));
        assert_eq!(s.seq_len(a).unwrap(), 8);
        assert_eq!(
            s.truncate(a, 9).unwrap_err(),
            KvError::TruncateBeyondLength {
                seq: a,
                keep: 9,
                len: 8
            }
        );
        // Page 1 is full, so the next token takes a new page: 4, the head of the free list.
        let r = s.append_slots(a, 1).unwrap();
        assert_eq!(
            r.slots[0],
            vec![Slot {
                page: PageId(4),
                offset: 0
            }]
        );
        assert_eq!(s.truncate(a, 0).unwrap(), ids(&[4, 1, 0]));
        assert_eq!(s.allocator().n_free(), 8);
        assert_eq!(
            s.allocator().free_pages().collect::<Vec<_>>(),
            ids(&[5, 6, 7, 3, 2, 4, 1, 0])
        );
    }

    #[test]
    fn fork_shares_pages_and_copy_on_write_takes_a_new_one() {
        let mut s = Sequences::new(4, 8).unwrap();
        let a = s.create();
        s.append_slots(a, 6).unwrap(); // pages 0 1 (page 1 half full)
        let b = s.fork(a).unwrap();
        assert_eq!(b, SeqId(1));
        assert_eq!(s.page_table(b, 0).unwrap(), ids(&[0, 1]));
        assert_eq!((rc(&s, 0), rc(&s, 1)), (2, 2));
        assert_eq!(s.stats().pages_shared, 2);
        assert_eq!(s.pages_needed(b, 1).unwrap(), 1);
        // b appends into shared, partly filled page 1: copy to page 2 first.
        let r = s.append_slots(b, 2).unwrap();
        assert_eq!(
            r.copies,
            vec![CopyOp {
                src: PageId(1),
                dst: PageId(2)
            }]
        );
        assert_eq!(
            r.slots[0][0],
            Slot {
                page: PageId(2),
                offset: 2
            }
        );
        assert_eq!(s.page_table(b, 0).unwrap(), ids(&[0, 2]));
        assert_eq!((rc(&s, 0), rc(&s, 1), rc(&s, 2)), (2, 1, 1));
        // a now owns page 1 alone: no copy.
        let r = s.append_slots(a, 1).unwrap();
        assert_eq!(r.copies, vec![]);
        assert_eq!(
            r.slots[0],
            vec![Slot {
                page: PageId(1),
                offset: 2
            }]
        );
        // Shared but full page 0: appending past it needs no copy.
        let c = s.create();
        s.append_slots(c, 4).unwrap(); // page 3
        let d = s.fork(c).unwrap();
        let r = s.append_slots(d, 1).unwrap();
        assert_eq!(r.copies, vec![]);
        assert_eq!(s.page_table(d, 0).unwrap(), ids(&[3, 4]));
        assert_eq!(rc(&s, 3), 2);
        // Freeing the fork leaves the original's pages in use.
        assert_eq!(s.free(d).unwrap(), ids(&[4]));
        assert_eq!(rc(&s, 3), 1);
        assert_eq!(s.free(b).unwrap(), ids(&[2]));
        assert_eq!(s.free(a).unwrap(), ids(&[1, 0]));
        assert_eq!(s.free(c).unwrap(), ids(&[3]));
        assert_eq!(s.allocator().n_free(), 8);
    }

    #[test]
    fn copy_on_write_needs_a_page_and_is_all_or_nothing() {
        let mut s = Sequences::new(4, 2).unwrap();
        let a = s.create();
        s.append_slots(a, 5).unwrap(); // pages 0 1
        let b = s.fork(a).unwrap();
        assert_eq!(
            s.append_slots(b, 1).unwrap_err(),
            KvError::OutOfPages { needed: 1, free: 0 }
        );
        assert_eq!(s.page_table(b, 0).unwrap(), ids(&[0, 1]));
        assert_eq!(rc(&s, 1), 2);
        // Truncating into a shared page keeps it shared; the next append copies it.
        s.free(a).unwrap();
        let c = s.fork(b).unwrap();
        s.truncate(c, 2).unwrap();
        assert_eq!(s.page_table(c, 0).unwrap(), ids(&[0]));
        assert_eq!((rc(&s, 0), rc(&s, 1)), (2, 1));
        s.free(b).unwrap();
        assert_eq!(s.free_pages_for_test(), ids(&[1]));
        let r = s.append_slots(c, 1).unwrap();
        assert_eq!(r.copies, vec![]); // page 0 is c's alone now
        assert_eq!(
            r.slots[0],
            vec![Slot {
                page: PageId(0),
                offset: 2
            }]
        );
    }

    #[test]
    fn stats_count_shared_pages_once() {
        let mut s = Sequences::new(4, 8).unwrap();
        let st = s.stats();
        assert_eq!(
            (
                st.pages_total,
                st.pages_used,
                st.pages_free,
                st.tokens_stored
            ),
            (8, 0, 8, 0)
        );
        assert_eq!(st.utilization(), 1.0);
        let a = s.create();
        s.append_slots(a, 6).unwrap();
        let b = s.fork(a).unwrap();
        s.append_slots(b, 1).unwrap(); // CoW: page 2 holds 7 slots' worth of b's second page
        let st = s.stats();
        assert_eq!(st.pages_used, 3);
        assert_eq!(st.tokens_stored, 4 + 2 + 3);
        assert_eq!(st.seq_tokens, 13);
        assert_eq!(st.n_sequences, 2);
        assert_eq!(st.pages_shared, 1);
        assert!((st.utilization() - 9.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn absurd_appends_are_errors_not_panics() {
        let mut s = Sequences::new(4, 2).unwrap();
        let a = s.create();
        s.append_slots(a, 1).unwrap();
        assert!(matches!(
            s.append_slots(a, usize::MAX),
            Err(KvError::OutOfRange { .. })
        ));
        assert_eq!(
            s.append_slots(a, usize::MAX - 1).unwrap_err(),
            KvError::OutOfPages {
                needed: usize::MAX / 4,
                free: 1
            }
        );
        assert_eq!(s.seq_len(a).unwrap(), 1);
    }

    #[test]
    fn unknown_sequences_are_errors() {
        let mut s = Sequences::new(4, 2).unwrap();
        let ghost = SeqId(7);
        for err in [
            s.append_slots(ghost, 1).unwrap_err(),
            s.truncate(ghost, 0).unwrap_err(),
            s.fork(ghost).unwrap_err(),
            s.free(ghost).unwrap_err(),
            s.seq_len(ghost).unwrap_err(),
            s.pages_needed(ghost, 1).unwrap_err(),
        ] {
            assert_eq!(err, KvError::UnknownSequence(ghost));
        }
        assert!(Sequences::new(0, 2).is_err());
    }

    /// Pages of 4, a global group and a group with a window of 6 positions.
    fn windowed(n_pages: usize) -> Sequences {
        Sequences::grouped(4, n_pages, &[None, Some(6)]).unwrap()
    }

    #[test]
    fn a_windowed_group_gives_back_the_pages_no_query_sees() {
        let mut s = windowed(64);
        let a = s.create();
        for _ in 0..20 {
            s.append_slots(a, 1).unwrap();
        }
        // The last append was at position 19, which sees positions 14..=19: pages 0..3 of
        // the windowed group are gone, the global group keeps all five.
        let table = s.page_table(a, 1).unwrap();
        assert_eq!(&table[..3], &[RELEASED; 3]);
        assert!(table[3..].iter().all(|p| p.index() < 64));
        assert_eq!(s.page_table(a, 0).unwrap().len(), 5);
        assert_eq!(s.stats().pages_used, 5 + 2);
        assert!(s.slot(a, 1, 11).is_err());
        assert_eq!(s.slot(a, 1, 12).unwrap().page, table[3]);
        assert!(s.slot(a, 0, 0).is_ok());
        // Position 20 needs a page in each group; position 23 needs none and gives back page
        // 3 (positions 12..16) of the windowed group.
        assert_eq!(s.pages_needed(a, 1).unwrap(), 2);
        s.append_slots(a, 3).unwrap();
        assert_eq!(s.seq_len(a).unwrap(), 23);
        assert_eq!(s.pages_needed(a, 1).unwrap(), 0);
        let free = s.allocator().n_free();
        s.append_slots(a, 1).unwrap();
        assert_eq!(s.allocator().n_free(), free + 1);
        assert_eq!(s.page_table(a, 1).unwrap()[3], RELEASED);
        // max_append counts the page given back.
        assert_eq!(s.max_append(a, 100, 0).unwrap(), 0);
        assert_eq!(s.max_append(a, 100, 2).unwrap(), 4);
        // The pool gets every page back.
        let used = s.stats().pages_used;
        assert_eq!(s.free(a).unwrap().len(), used);
        assert_eq!(s.allocator().n_free(), 64);
    }

    #[test]
    fn truncation_cannot_reach_back_past_what_the_window_gave_back() {
        let mut s = windowed(64);
        let a = s.create();
        s.append_slots(a, 16).unwrap();
        s.append_slots(a, 4).unwrap(); // at 16, sees 11..: page 2 on, pages 0 1 gone
        assert_eq!(
            s.truncate(a, 12).unwrap_err(),
            KvError::WindowReleased {
                seq: a,
                keep: 12,
                released: 8
            }
        );
        assert_eq!(s.seq_len(a).unwrap(), 20);
        // Keeping 13 tokens: a query at 13 sees 8..=13, still held.
        s.truncate(a, 13).unwrap();
        assert_eq!(s.page_table(a, 1).unwrap().len(), 4);
        assert_eq!(s.page_table(a, 0).unwrap().len(), 4);
    }

    #[test]
    fn a_prefix_is_found_where_the_windowed_group_holds_what_its_end_sees() {
        let mut s = windowed(64);
        let tokens: Vec<u32> = (100..120).collect();
        let a = s.create();
        for _ in 0..20 {
            s.append_slots(a, 1).unwrap();
        }
        // Committed once at the end: the windowed pages given back were never cached.
        s.commit(a, &tokens).unwrap();
        let fork = s.fork(a).unwrap();
        s.free(a).unwrap();
        // All 20 tokens: a query at 20 sees 15..=20, in pages 3 and 4, which are cached.
        let m = s.match_prefix(0, &tokens, 20);
        assert_eq!(m.tokens, 20);
        assert_eq!(m.free_pages, 0);
        // 19 tokens end inside page 4 and see pages 3 and 4: found, part of page 4 with them.
        assert_eq!(s.match_prefix(0, &tokens, 19).tokens, 19);
        // 16 tokens would need windowed page 2 (positions 11..16): gone, and so is every
        // shorter prefix's.
        assert_eq!(s.match_prefix(0, &tokens, 16).tokens, 0);
        let b = s.create();
        assert_eq!(s.attach_prefix(b, &tokens, 20).unwrap(), 20);
        assert_eq!(s.page_table(b, 0).unwrap(), s.page_table(fork, 0).unwrap());
        assert_eq!(s.page_table(b, 1).unwrap(), s.page_table(fork, 1).unwrap());
        s.append_slots(b, 1).unwrap();
        // Forks and frees leave every reference count balanced.
        s.free(fork).unwrap();
        s.free(b).unwrap();
        assert_eq!(s.allocator().n_free(), 64);
    }

    impl Sequences {
        fn free_pages_for_test(&self) -> Vec<PageId> {
            self.alloc.free_pages().collect()
        }
    }
}
