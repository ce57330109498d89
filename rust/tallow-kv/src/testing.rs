//! For the tests of other crates (the `testing` feature): page tables with no values behind
//! them, for what reads only the tables (a step's plan).

use crate::cache::PageStore;
use crate::error::Result;
use crate::layout::KvLayout;
use crate::PageId;

/// `n_pages` pages of `layout` that hold nothing: copying one is a no-op.
#[derive(Debug, Clone)]
pub struct TablesOnly {
    layout: KvLayout,
    n_pages: usize,
}

impl TablesOnly {
    /// `n_pages` pages of `layout`.
    pub fn new(layout: KvLayout, n_pages: usize) -> Self {
        TablesOnly { layout, n_pages }
    }
}

impl PageStore for TablesOnly {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn n_pages(&self) -> usize {
        self.n_pages
    }

    fn copy_page(&mut self, _: PageId, _: PageId) -> Result<()> {
        Ok(())
    }
}
