//! The page allocator: reference counts and the free list.
//!
//! All decisions about which page is handed out next and when a page becomes free are made
//! here, so prefix caching can later keep freed full pages (keyed by a hash of the parent
//! page's hash and the page's token ids) on the free list and evict them from its head.

use crate::error::{KvError, Result};
use crate::layout::MAX_PAGES;
use crate::memory::{collect, zeroed};
use crate::PageId;

const NIL: u32 = u32::MAX;

/// Reference-counted pages with a FIFO free list.
///
/// Order (deterministic, tests rely on it):
/// - a fresh allocator hands out pages `0, 1, 2, ...` in order;
/// - [`PageAllocator::allocate`] takes the page at the head of the free list;
/// - a page whose reference count drops to zero goes to the tail.
///
/// So a freed page is reused only after every page that was free before it. That is the
/// least-recently-freed-first order prefix caching wants for eviction (as in vLLM's free block
/// queue). The free list is doubly linked through two arrays so a page can later be taken out
/// of the middle in O(1) (a prefix-cache hit on a freed page).
#[derive(Debug, Clone)]
pub struct PageAllocator {
    refcount: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    n_free: usize,
}

impl PageAllocator {
    /// An allocator of `n_pages` pages, all free. At most [`MAX_PAGES`].
    pub fn new(n_pages: usize) -> Result<Self> {
        if n_pages > MAX_PAGES {
            return Err(KvError::PoolTooLarge {
                pages: n_pages,
                max: MAX_PAGES,
            });
        }
        let n = n_pages as u32;
        Ok(PageAllocator {
            refcount: zeroed(n_pages)?,
            prev: collect(n_pages, (0..n).map(|i| if i == 0 { NIL } else { i - 1 }))?,
            next: collect(
                n_pages,
                (0..n).map(|i| if i + 1 == n { NIL } else { i + 1 }),
            )?,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            n_free: n_pages,
        })
    }

    /// Pages in the pool.
    pub fn n_total(&self) -> usize {
        self.refcount.len()
    }

    /// Pages with reference count zero.
    pub fn n_free(&self) -> usize {
        self.n_free
    }

    /// Pages with a non-zero reference count.
    pub fn n_used(&self) -> usize {
        self.n_total() - self.n_free
    }

    /// Reference count of `page` (0 when free).
    pub fn refcount(&self, page: PageId) -> Result<u32> {
        self.check(page)?;
        Ok(self.refcount[page.index()])
    }

    /// The free pages in the order they will be allocated.
    pub fn free_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let p = cur;
                cur = self.next[p as usize];
                PageId(p)
            })
        })
    }

    /// Takes `page` out of the free list wherever it is, with reference count 1 (a cached
    /// page found again before it was reused).
    pub fn revive(&mut self, page: PageId) -> Result<()> {
        self.check(page)?;
        if self.refcount[page.index()] != 0 {
            return Err(KvError::PageInUse(page));
        }
        self.unlink(page);
        self.refcount[page.index()] = 1;
        Ok(())
    }

    /// Takes the page at the head of the free list, with reference count 1.
    pub fn allocate(&mut self) -> Result<PageId> {
        if self.head == NIL {
            return Err(KvError::OutOfPages { needed: 1, free: 0 });
        }
        let page = PageId(self.head);
        self.unlink(page);
        self.refcount[page.index()] = 1;
        Ok(page)
    }

    /// Takes `n` pages, all or none: on [`KvError::OutOfPages`] nothing changes.
    pub fn allocate_n(&mut self, n: usize) -> Result<Vec<PageId>> {
        if n > self.n_free {
            return Err(KvError::OutOfPages {
                needed: n,
                free: self.n_free,
            });
        }
        (0..n).map(|_| self.allocate()).collect()
    }

    /// Adds one reference to a page in use (sharing it).
    pub fn retain(&mut self, page: PageId) -> Result<()> {
        self.check(page)?;
        let rc = &mut self.refcount[page.index()];
        if *rc == 0 {
            return Err(KvError::PageNotInUse(page));
        }
        *rc = rc.checked_add(1).ok_or(KvError::RefcountOverflow(page))?;
        Ok(())
    }

    /// Drops one reference; returns whether the page became free (it then goes to the tail of
    /// the free list). Releasing a free page is [`KvError::PageNotInUse`], never an underflow.
    pub fn release(&mut self, page: PageId) -> Result<bool> {
        self.check(page)?;
        let rc = &mut self.refcount[page.index()];
        if *rc == 0 {
            return Err(KvError::PageNotInUse(page));
        }
        *rc -= 1;
        if *rc > 0 {
            return Ok(false);
        }
        self.push_tail(page);
        Ok(true)
    }

    fn check(&self, page: PageId) -> Result<()> {
        if page.index() < self.n_total() {
            Ok(())
        } else {
            Err(KvError::PageOutOfRange {
                page,
                n_pages: self.n_total(),
            })
        }
    }

    /// Removes a free page from the free list (anywhere in it).
    fn unlink(&mut self, page: PageId) {
        let (p, n) = (self.prev[page.index()], self.next[page.index()]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[page.index()] = NIL;
        self.next[page.index()] = NIL;
        self.n_free -= 1;
    }

    fn push_tail(&mut self, page: PageId) {
        self.prev[page.index()] = self.tail;
        self.next[page.index()] = NIL;
        match self.tail {
            NIL => self.head = page.0,
            t => self.next[t as usize] = page.0,
        }
        self.tail = page.0;
        self.n_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<PageId> {
        v.iter().copied().map(PageId).collect()
    }

    #[test]
    fn allocates_in_order_and_reuses_freed_pages_last() {
        let mut a = PageAllocator::new(4).unwrap();
        assert_eq!((a.n_total(), a.n_free(), a.n_used()), (4, 4, 0));
        assert_eq!(a.allocate_n(3).unwrap(), ids(&[0, 1, 2]));
        assert_eq!((a.n_free(), a.n_used()), (1, 3));
        assert!(a.release(PageId(1)).unwrap());
        assert!(a.release(PageId(0)).unwrap());
        assert_eq!(a.free_pages().collect::<Vec<_>>(), ids(&[3, 1, 0]));
        assert_eq!(a.allocate().unwrap(), PageId(3));
        assert_eq!(a.allocate().unwrap(), PageId(1));
        assert_eq!(a.allocate().unwrap(), PageId(0));
        assert_eq!(
            a.allocate().unwrap_err(),
            KvError::OutOfPages { needed: 1, free: 0 }
        );
        assert_eq!(a.free_pages().count(), 0);
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let mut a = PageAllocator::new(3).unwrap();
        a.allocate().unwrap();
        assert_eq!(
            a.allocate_n(3).unwrap_err(),
            KvError::OutOfPages { needed: 3, free: 2 }
        );
        assert_eq!(a.n_free(), 2);
        assert_eq!(a.free_pages().collect::<Vec<_>>(), ids(&[1, 2]));
    }

    #[test]
    fn refcounts_share_and_never_go_negative() {
        let mut a = PageAllocator::new(2).unwrap();
        let p = a.allocate().unwrap();
        a.retain(p).unwrap();
        assert_eq!(a.refcount(p).unwrap(), 2);
        assert!(!a.release(p).unwrap());
        assert_eq!(a.n_used(), 1);
        assert!(a.release(p).unwrap());
        assert_eq!(a.refcount(p).unwrap(), 0);
        assert_eq!(a.release(p).unwrap_err(), KvError::PageNotInUse(p));
        assert_eq!(a.retain(p).unwrap_err(), KvError::PageNotInUse(p));
        assert_eq!(a.n_free(), 2);
        let bad = PageId(2);
        assert_eq!(
            a.release(bad).unwrap_err(),
            KvError::PageOutOfRange {
                page: bad,
                n_pages: 2
            }
        );
        assert!(a.refcount(bad).is_err());
    }

    #[test]
    fn empty_pool_allocates_nothing() {
        let mut a = PageAllocator::new(0).unwrap();
        assert!(a.allocate().is_err());
        assert_eq!(a.allocate_n(0).unwrap(), vec![]);
    }
}
