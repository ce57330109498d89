//! Prefix caching: full pages stay findable by their content after their sequences end.
//!
//! A full page is registered under a key that hashes its parent page's key (or, for a first
//! page, the sequence's salt: whatever else changes the KV, such as an adapter) and the token
//! ids it holds, so a key stands for the whole prefix up to the end of the page. A page whose
//! last reference goes away keeps its key while it waits in the free list; allocation takes
//! pages from the head of that list, so cached pages are evicted least recently freed first,
//! and only when the pool needs a page. A page in use is never evicted.
//!
//! With layer groups (see [`crate::LayerGroups`]) the same prefix has one page per group; a
//! page is found by its key and its group.
//!
//! Keys are SipHash with random keys (no crafted collisions), and a hit is checked against the
//! page's stored token ids and parent key before it is used.
//!
//! After the last whole page, a prompt may continue with part of a cached page: the page
//! after the same parent whose tokens share the longest beginning with the prompt's next ones
//! ([`PrefixCache::longest_child`]). A sequence takes that page shared and uses only those
//! positions; its next append copies the page (copy-on-write) and writes its own after them.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use crate::error::Result;
use crate::memory::{collect, zeroed};
use crate::PageId;

/// Counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Pages registered under a key (in use or waiting in the free list).
    pub cached_pages: usize,
    /// Prompt tokens looked up when attaching a prefix.
    pub queried_tokens: u64,
    /// Of those, tokens found in the cache.
    pub hit_tokens: u64,
    /// Cached pages reused for other content.
    pub evicted_pages: u64,
}

/// What a registered page holds.
#[derive(Debug, Clone)]
struct Entry {
    key: u64,
    group: usize,
    parent: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct PrefixCache {
    page_size: usize,
    hasher: RandomState,
    /// The entry of each page, if registered.
    entries: Vec<Option<Entry>>,
    /// Token ids of every page (`page_size` per page), valid where `entries` is set.
    tokens: Vec<u32>,
    by_key: HashMap<(u64, usize), PageId>,
    /// The registered pages of each (parent key, group).
    children: HashMap<(u64, usize), Vec<PageId>>,
    stats: PrefixStats,
}

impl PrefixCache {
    pub(crate) fn new(page_size: usize, n_pages: usize) -> Result<Self> {
        Ok(PrefixCache {
            page_size,
            hasher: RandomState::new(),
            entries: collect(n_pages, std::iter::repeat_with(|| None))?,
            tokens: zeroed(n_pages.saturating_mul(page_size))?,
            by_key: HashMap::new(),
            children: HashMap::new(),
            stats: PrefixStats::default(),
        })
    }

    /// The key of a full page holding `tokens` after a page keyed `parent`.
    pub(crate) fn key(&self, parent: u64, tokens: &[u32]) -> u64 {
        let mut h = self.hasher.build_hasher();
        parent.hash(&mut h);
        tokens.hash(&mut h);
        h.finish()
    }

    /// The registered page of layer group `group` holding `tokens` after `parent`, whose key
    /// is `key` (from [`PrefixCache::key`]).
    pub(crate) fn find(
        &self,
        group: usize,
        parent: u64,
        key: u64,
        tokens: &[u32],
    ) -> Option<PageId> {
        let &page = self.by_key.get(&(key, group))?;
        let entry = self.entries[page.index()].as_ref()?;
        (entry.parent == parent && self.page_tokens(page) == tokens).then_some(page)
    }

    /// The key of the registered page of group 0 after `parent` whose tokens begin with the
    /// longest run of `tokens` (at least one, fewer than a page), with that run's length.
    pub(crate) fn longest_child(&self, parent: u64, tokens: &[u32]) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for &page in self.children.get(&(parent, 0))? {
            let common = (self.page_tokens(page).iter().zip(tokens))
                .take_while(|(a, b)| a == b)
                .count()
                .min(self.page_size - 1);
            let entry = self.entries[page.index()].as_ref()?;
            if common > best.map_or(0, |(_, n)| n) {
                best = Some((entry.key, common));
            }
        }
        best
    }

    /// The registered page of group `group` under `key`.
    pub(crate) fn page_of(&self, key: u64, group: usize) -> Option<PageId> {
        self.by_key.get(&(key, group)).copied()
    }

    fn page_tokens(&self, page: PageId) -> &[u32] {
        &self.tokens[page.index() * self.page_size..][..self.page_size]
    }

    /// Registers full `page` of layer group `group` (holding `tokens` after `parent`) under
    /// `key`, unless the group has a page under that key already (the same prefix computed
    /// twice) or the page has a key.
    pub(crate) fn register(
        &mut self,
        page: PageId,
        group: usize,
        parent: u64,
        key: u64,
        tokens: &[u32],
    ) {
        if self.by_key.contains_key(&(key, group)) || self.entries[page.index()].is_some() {
            return;
        }
        self.by_key.insert((key, group), page);
        self.children.entry((parent, group)).or_default().push(page);
        self.entries[page.index()] = Some(Entry { key, group, parent });
        let ps = self.page_size;
        self.tokens[page.index() * ps..][..ps].copy_from_slice(tokens);
        self.stats.cached_pages += 1;
    }

    /// Whether `page` is registered (false for a page outside the pool).
    pub(crate) fn is_cached(&self, page: PageId) -> bool {
        self.entries.get(page.index()).is_some_and(Option::is_some)
    }

    /// Drops `page`'s key, if it has one; `evicted` counts it as an eviction.
    pub(crate) fn forget(&mut self, page: PageId, evicted: bool) {
        if let Some(entry) = self.entries[page.index()].take() {
            self.by_key.remove(&(entry.key, entry.group));
            let siblings = (self.children)
                .get_mut(&(entry.parent, entry.group))
                .expect("a registered page is its parent's child");
            siblings.retain(|&p| p != page);
            if siblings.is_empty() {
                self.children.remove(&(entry.parent, entry.group));
            }
            self.stats.cached_pages -= 1;
            if evicted {
                self.stats.evicted_pages += 1;
            }
        }
    }

    /// Counts one lookup of `queried` prompt tokens that found `hit` of them.
    pub(crate) fn count_lookup(&mut self, queried: usize, hit: usize) {
        self.stats.queried_tokens += queried as u64;
        self.stats.hit_tokens += hit as u64;
    }

    pub(crate) fn stats(&self) -> PrefixStats {
        self.stats
    }
}
