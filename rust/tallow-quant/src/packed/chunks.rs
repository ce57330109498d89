//! How a product's row groups are shared among the threads of the pool.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The row groups `0..total` of a product, split into one contiguous range per thread, which
/// its owner claims from the front in shrinking chunks and others, once theirs is done, take
/// from the back in halves of what is left.
///
/// A one-token product is a stream of weights from memory, and a thread reads its own range
/// as one stream: its chunks follow one another in memory, so that the requests a kernel makes
/// ahead of its reads (`crate::kernels`) are already on their way for the next chunk. The
/// threads still finish together where one reads slower than another: the others take the rest
/// of its range from its far end. (One shared front, each claim a share of what is left, gives
/// the first claimant a large chunk, and where that thread reads slower the others wait for it.)
pub(crate) struct StealingRanges {
    /// Per range, the front and the back of what is left of it, packed as `front << 32 |
    /// back`, each on a cache line of its own; the first `count` are used. On the stack: a
    /// decode step allocates nothing.
    ranges: [PaddedRange; MAX_RANGES],
    count: usize,
}

/// Ranges a product is split into at most: past as many threads, threads share them (thread
/// `w` the range `w % MAX_RANGES`), each claim still a half of what is left of one.
pub(crate) const MAX_RANGES: usize = 32;

#[repr(align(64))]
struct PaddedRange(AtomicU64);

fn pack(front: usize, back: usize) -> u64 {
    ((front as u64) << 32) | back as u64
}

fn unpack(range: u64) -> (usize, usize) {
    (
        (range >> 32) as usize,
        (range & u64::from(u32::MAX)) as usize,
    )
}

impl StealingRanges {
    /// The groups `0..total` (fewer than 2^32: a group is 16 rows) split evenly over
    /// `threads` threads (at most [`MAX_RANGES`] ranges).
    pub(crate) fn new(total: usize, threads: usize) -> Self {
        assert!(u32::try_from(total).is_ok(), "{total} row groups");
        let count = threads.clamp(1, MAX_RANGES);
        let ranges = std::array::from_fn(|i| {
            let range = match i < count {
                true => pack(total * i / count, total * (i + 1) / count),
                false => 0,
            };
            PaddedRange(AtomicU64::new(range))
        });
        StealingRanges { ranges, count }
    }

    /// The next chunk for thread `worker` (taken modulo the ranges' count): half of what is left
    /// of its own range, from the front, else half of what is left of the range with the most
    /// left, from the back; `None` once every group is taken.
    pub(crate) fn claim(&self, worker: usize) -> Option<Range<usize>> {
        let ranges = &self.ranges[..self.count];
        let own = &ranges[worker % self.count].0;
        let mut range = own.load(Ordering::Acquire);
        loop {
            let (front, back) = unpack(range);
            if front >= back {
                break;
            }
            let end = front + (back - front).div_ceil(2);
            match own.compare_exchange_weak(
                range,
                pack(end, back),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(front..end),
                Err(now) => range = now,
            }
        }
        loop {
            let (victim, range) = ranges
                .iter()
                .map(|r| (&r.0, r.0.load(Ordering::Acquire)))
                .max_by_key(|&(_, range)| {
                    let (front, back) = unpack(range);
                    back.saturating_sub(front)
                })?;
            let (front, back) = unpack(range);
            if front >= back {
                return None;
            }
            let start = back - (back - front).div_ceil(2);
            let taken = pack(front, start);
            if victim
                .compare_exchange_weak(range, taken, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(start..back);
            }
        }
    }
}
