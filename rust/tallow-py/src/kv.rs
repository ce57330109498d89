//! `KvCache`: the paged KV pool, shared by every sequence an engine runs. The scheduler
//! (Python) reserves positions in it; `Model.forward` writes and reads them.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tallow_backend_cpu::host_cache;
use tallow_kv::{KvBudget, KvDtype, KvLayout, LayerGroups, PagedKvCache, SeqId};
use tallow_model::AnyScratch;

use crate::errors::{invalid_argument, kv_error};

#[pyclass(module = "tallow._core")]
pub struct KvCache {
    pub(crate) inner: PagedKvCache,
    /// The forward pass's scratch memory for steps over this pool, kept between steps.
    pub(crate) scratch: AnyScratch,
}

fn page_ids(pages: Vec<tallow_kv::PageId>) -> Vec<u32> {
    pages.into_iter().map(|p| p.0).collect()
}

fn parse_dtype(dtype: &str) -> PyResult<KvDtype> {
    KvDtype::from_name(dtype).ok_or_else(|| {
        invalid_argument(format!(
            "dtype must be 'f16', 'f32', 'bf16', 'q8_0' or 'q4_0', got {dtype:?}"
        ))
    })
}

/// The layout of pages of `page_size` positions holding one of `groups`.
fn layout(
    groups: &LayerGroups,
    (n_head_kv, head_dim): (usize, usize),
    page_size: usize,
    dtype: &str,
) -> PyResult<KvLayout> {
    let layout = KvLayout::new(groups.n_layer(), n_head_kv, head_dim)
        .with_page_layers(groups.page_layers())
        .with_page_size(page_size)
        .with_dtype(parse_dtype(dtype)?);
    layout.validate().map_err(kv_error)?;
    Ok(layout)
}

impl KvCache {
    /// Bytes of one page of a pool of `groups` with `(n_head_kv, head_dim)` heads.
    pub(crate) fn page_bytes(
        groups: &LayerGroups,
        heads: (usize, usize),
        page_size: usize,
        dtype: &str,
    ) -> PyResult<usize> {
        layout(groups, heads, page_size, dtype)?
            .bytes_per_page()
            .map_err(kv_error)
    }

    /// The layout and budget of a pool for `groups` of layers with `(n_head_kv, head_dim)`
    /// heads; shared by the constructor and `Model.new_kv_cache`.
    pub(crate) fn shape(
        groups: &LayerGroups,
        heads: (usize, usize),
        page_size: usize,
        dtype: &str,
        max_pages: Option<usize>,
        max_bytes: Option<u64>,
    ) -> PyResult<(KvLayout, KvBudget)> {
        let budget = match (max_pages, max_bytes) {
            (Some(pages), None) => KvBudget::Pages(pages),
            (None, Some(bytes)) => KvBudget::Bytes(bytes),
            _ => {
                return Err(invalid_argument(
                    "give exactly one of max_pages and max_bytes",
                ))
            }
        };
        Ok((layout(groups, heads, page_size, dtype)?, budget))
    }

    pub(crate) fn new_with(inner: PagedKvCache) -> Self {
        KvCache {
            inner,
            scratch: AnyScratch::new(),
        }
    }
}

#[pymethods]
impl KvCache {
    /// A pool for a model of `n_layer` layers with `n_head_kv` KV heads of `head_dim`, holding
    /// `max_pages` pages or as many as `max_bytes` allows (exactly one of the two).
    /// `windows[layer]`, when given, is each layer's sliding window (`None` for global
    /// attention): the layers are then grouped and windowed groups give back their old pages.
    #[new]
    #[pyo3(signature = (n_layer, n_head_kv, head_dim, *, page_size = 16, dtype = "f16", max_pages = None, max_bytes = None, windows = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        page_size: usize,
        dtype: &str,
        max_pages: Option<usize>,
        max_bytes: Option<u64>,
        windows: Option<Vec<Option<usize>>>,
    ) -> PyResult<Self> {
        let windows = windows.unwrap_or_else(|| vec![None; n_layer]);
        if windows.len() != n_layer {
            return Err(invalid_argument(format!(
                "windows has {} entries for {n_layer} layers",
                windows.len()
            )));
        }
        let groups = LayerGroups::from_windows(&windows).map_err(kv_error)?;
        let (layout, budget) = Self::shape(
            &groups,
            (n_head_kv, head_dim),
            page_size,
            dtype,
            max_pages,
            max_bytes,
        )?;
        let inner = host_cache(layout, groups, budget).map_err(kv_error)?;
        Ok(Self::new_with(inner))
    }

    /// Tokens per page.
    #[getter]
    fn page_size(&self) -> usize {
        self.inner.layout().page_size
    }

    /// Layer groups: page tables per sequence (one unless sliding windows split the layers).
    #[getter]
    fn n_groups(&self) -> usize {
        self.inner.groups().len()
    }

    /// Pages in the pool.
    #[getter]
    fn n_pages(&self) -> usize {
        self.inner.sequences().allocator().n_total()
    }

    /// Free pages (cached ones waiting for reuse included).
    #[getter]
    fn n_free(&self) -> usize {
        self.inner.sequences().allocator().n_free()
    }

    /// A new, empty sequence; `salt` separates the cached prefixes of sequences whose KV
    /// differs for the same tokens.
    #[pyo3(signature = (salt = 0))]
    fn create(&mut self, salt: u64) -> u64 {
        self.inner.create_salted(salt).0
    }

    /// `(tokens, free_pages)`: the leading tokens of `tokens` (at most `max_tokens`; whole
    /// pages, then part of one) whose KV is cached, and how many of their pages wait in the
    /// free list.
    #[pyo3(signature = (tokens, max_tokens, salt = 0))]
    fn match_prefix(&self, tokens: Vec<u32>, max_tokens: usize, salt: u64) -> (usize, usize) {
        let found = self.inner.match_prefix(salt, &tokens, max_tokens);
        (found.tokens, found.free_pages)
    }

    /// Gives the empty `seq` the cached pages of the longest cached prefix of `tokens` (at
    /// most `max_tokens` tokens); returns the tokens attached.
    fn attach_prefix(&mut self, seq: u64, tokens: Vec<u32>, max_tokens: usize) -> PyResult<usize> {
        self.inner
            .attach_prefix(SeqId(seq), &tokens, max_tokens)
            .map_err(kv_error)
    }

    /// Records the token ids whose KV was written at the next positions of `seq`, caching the
    /// pages they complete.
    fn commit(&mut self, seq: u64, tokens: Vec<u32>) -> PyResult<()> {
        self.inner.commit(SeqId(seq), &tokens).map_err(kv_error)
    }

    /// Whether `page` is in the prefix cache.
    fn is_cached(&self, page: u32) -> bool {
        self.inner.sequences().is_cached(tallow_kv::PageId(page))
    }

    /// A new sequence sharing every page of `seq`.
    fn fork(&mut self, seq: u64) -> PyResult<u64> {
        Ok(self.inner.fork(SeqId(seq)).map_err(kv_error)?.0)
    }

    /// Ends `seq`; returns the pages that became free.
    fn free(&mut self, seq: u64) -> PyResult<Vec<u32>> {
        Ok(page_ids(self.inner.free(SeqId(seq)).map_err(kv_error)?))
    }

    /// Keeps the first `keep` positions of `seq`; returns the pages that became free.
    fn truncate(&mut self, seq: u64, keep: usize) -> PyResult<Vec<u32>> {
        Ok(page_ids(
            self.inner.truncate(SeqId(seq), keep).map_err(kv_error)?,
        ))
    }

    /// Pages that reserving `n` more positions of `seq` would take (copy-on-write included).
    fn pages_needed(&self, seq: u64, n: usize) -> PyResult<usize> {
        self.inner.pages_needed(SeqId(seq), n).map_err(kv_error)
    }

    /// The most positions, up to `want`, that `seq` can reserve taking at most `free` pages.
    fn max_append(&self, seq: u64, want: usize, free: usize) -> PyResult<usize> {
        self.inner
            .max_append(SeqId(seq), want, free)
            .map_err(kv_error)
    }

    /// The most pages a sequence of `n_tokens` positions holds at once (over all layer
    /// groups) when it grows by at most `chunk` positions at a time.
    #[pyo3(signature = (n_tokens, chunk = 1))]
    fn pages_to_hold(&self, n_tokens: usize, chunk: usize) -> usize {
        let page_size = self.inner.layout().page_size;
        self.inner
            .groups()
            .pages_to_hold(n_tokens, chunk, page_size)
    }

    /// Reserves the next `n` positions of `seq` (all or nothing).
    fn reserve(&mut self, seq: u64, n: usize) -> PyResult<()> {
        self.inner
            .append_slots(SeqId(seq), n)
            .map(drop)
            .map_err(kv_error)
    }

    /// Positions reserved for `seq`.
    fn seq_len(&self, seq: u64) -> PyResult<usize> {
        self.inner.seq_len(SeqId(seq)).map_err(kv_error)
    }

    /// The pages of `seq` that hold `layer`, in position order (an id of 2**32 - 1 where a
    /// sliding window gave the page back).
    #[pyo3(signature = (seq, layer = 0))]
    fn page_table(&self, seq: u64, layer: usize) -> PyResult<Vec<u32>> {
        let pages = self.inner.page_table(SeqId(seq), layer).map_err(kv_error)?;
        Ok(pages.iter().map(|p| p.0).collect())
    }

    /// The free pages, in the order they will be handed out.
    fn free_pages(&self) -> Vec<u32> {
        let allocator = self.inner.sequences().allocator();
        allocator.free_pages().map(|p| p.0).collect()
    }

    /// Pages total / used / free / shared, tokens stored, sequences, slot utilization and the
    /// prefix cache's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let dict = PyDict::new(py);
        for (key, value) in [
            ("pages_total", s.pages_total),
            ("pages_used", s.pages_used),
            ("pages_free", s.pages_free),
            ("pages_shared", s.pages_shared),
            ("tokens_stored", s.tokens_stored),
            ("seq_tokens", s.seq_tokens),
            ("n_sequences", s.n_sequences),
            ("page_size", s.page_size),
        ] {
            dict.set_item(key, value)?;
        }
        dict.set_item("utilization", s.utilization())?;
        dict.set_item("cached_pages", s.prefix.cached_pages)?;
        dict.set_item("prefix_queried_tokens", s.prefix.queried_tokens)?;
        dict.set_item("prefix_hit_tokens", s.prefix.hit_tokens)?;
        dict.set_item("evicted_pages", s.prefix.evicted_pages)?;
        Ok(dict)
    }
}
