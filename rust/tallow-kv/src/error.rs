//! The one error type of the crate.

use thiserror::Error;

use crate::layout::{KvBudget, KvDtype};
use crate::{PageId, SeqId};

/// Everything that can go wrong in the KV cache. Every public operation reports bad input
/// through this type instead of panicking, and an operation that fails changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// The layout has a zero dimension, or its pages are too large to address.
    #[error("invalid KV layout: {0}")]
    InvalidLayout(String),
    /// The budget cannot hold even one page.
    #[error("KV cache budget of {budget} cannot hold one page of {page_bytes} bytes")]
    BudgetTooSmall {
        /// The budget that was asked for.
        budget: KvBudget,
        /// Bytes one page needs with this layout.
        page_bytes: usize,
    },
    /// The pool would have more pages, or more bytes, than can be addressed.
    #[error("KV cache pool of {pages} pages is too large (at most {max} pages of this size)")]
    PoolTooLarge {
        /// Pages asked for.
        pages: usize,
        /// The largest pool of this page size.
        max: usize,
    },
    /// The cache's values are held by another kind of store (another device) than the one
    /// asked for.
    #[error("the KV cache's pages live on another device")]
    WrongStore,
    /// The device that holds the pages (a GPU) failed.
    #[error("KV pages on the device: {0}")]
    Device(String),
    /// The memory of the pool could not be allocated.
    #[error("cannot allocate {bytes} bytes for the KV cache: not enough memory")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// Not enough free pages for the operation; nothing was allocated.
    #[error("out of KV pages: need {needed}, only {free} free")]
    OutOfPages {
        /// Pages the operation needs.
        needed: usize,
        /// Pages that are free.
        free: usize,
    },
    /// No live sequence has this id (never created, or already freed).
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// A page id past the end of the pool.
    #[error("page {page} out of range: the pool has {n_pages} pages")]
    PageOutOfRange {
        /// The page asked for.
        page: PageId,
        /// Pages in the pool.
        n_pages: usize,
    },
    /// An operation that needs a page in use got a free one (double free, retain of a free page).
    #[error("page {0} is not in use")]
    PageNotInUse(PageId),
    /// A page is shared by too many sequences for its reference count.
    #[error("page {0} has too many references")]
    RefcountOverflow(PageId),
    /// An index (layer, KV head, slot, position, ...) out of range.
    #[error("{what} {index} out of range (must be below {len})")]
    OutOfRange {
        /// What the index addresses.
        what: &'static str,
        /// The index given.
        index: usize,
        /// The exclusive upper bound.
        len: usize,
    },
    /// A slice does not have the length the layout asks for.
    #[error("{what} has {got} values, expected {expected}")]
    ShapeMismatch {
        /// Which argument.
        what: &'static str,
        /// Length required by the layout.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// Typed access in a dtype other than the pool's.
    #[error("KV pool holds {actual:?}, not {requested:?}")]
    DtypeMismatch {
        /// The dtype asked for.
        requested: KvDtype,
        /// The pool's dtype.
        actual: KvDtype,
    },
    /// `truncate` asked to keep more tokens than the sequence holds.
    #[error("cannot truncate sequence {seq} to {keep} tokens: it holds {len}")]
    TruncateBeyondLength {
        /// The sequence.
        seq: SeqId,
        /// Tokens asked to keep.
        keep: usize,
        /// Tokens the sequence holds.
        len: usize,
    },
    /// `truncate` would need K/V that a sliding-window layer group already gave back.
    #[error(
        "cannot truncate sequence {seq} to {keep} tokens: its sliding-window layers gave back \
         the K/V of positions before {released}"
    )]
    WindowReleased {
        /// The sequence.
        seq: SeqId,
        /// Tokens asked to keep.
        keep: usize,
        /// Positions before this one are gone from a windowed group.
        released: usize,
    },
    /// Writing through a sequence into a page other sequences share would change their KV.
    #[error(
        "page {page} is shared by {refcount} sequences; writing to it would change the others"
    )]
    SharedPage {
        /// The shared page.
        page: PageId,
        /// Its reference count.
        refcount: u32,
    },
    /// The page is in use where a free one was expected.
    #[error("page {0} is in use")]
    PageInUse(PageId),
    /// A cached prefix can only be attached to a sequence that holds no tokens yet.
    #[error("sequence {0} already holds tokens; a cached prefix goes only into an empty one")]
    NotEmpty(SeqId),
    /// More token ids were committed than the sequence has positions.
    #[error("sequence {seq} has {len} positions; {tokens} token ids were committed to it")]
    TooManyTokens {
        /// The sequence.
        seq: SeqId,
        /// Its length in positions.
        len: usize,
        /// Token ids it would hold.
        tokens: usize,
    },
}

/// Result with [`KvError`].
pub type Result<T, E = KvError> = std::result::Result<T, E>;
