//! How fast this machine streams memory into its cores: the limit of a decode step, which
//! reads every weight once. A probe sums a buffer far larger than the caches on the compute
//! threads, as a decode step's products read their weights.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tallow_quant::AlignedBytes;
use tallow_threads::global;

/// Bytes each task of the probe sums: large enough that claiming it costs nothing.
const CHUNK: usize = 1 << 20;

/// The rate, in bytes per second, at which the compute threads read `bytes` of memory (made
/// and touched first, so that no page fault is timed): the best of `passes` reads of it.
pub fn read_bandwidth(bytes: usize, passes: usize) -> f64 {
    // Laid out as packed weights are: aligned to huge pages, which the kernel is asked for.
    // Written with nonzero bytes, so that every page is faulted in before the reads are timed
    // and none is the kernel's shared zero page (which a zeroing the compiler turns into a
    // zeroed allocation would leave).
    let mut buffer = AlignedBytes::zeroed(bytes.div_ceil(CHUNK).max(1) * CHUNK);
    buffer.as_mut_slice().fill(1);
    let chunks: Vec<&[u8]> = buffer.as_slice().chunks(CHUNK).collect();
    let sum_chunk = widest_sum();
    let sums: Vec<AtomicU64> = (0..global().threads())
        .map(|_| Default::default())
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let start = Instant::now();
        global().run(chunks.len(), &|i, worker| {
            let sum = sum_chunk(chunks[i]);
            sums[worker].fetch_add(sum, Ordering::Relaxed);
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    // The sums keep the reads from being optimised away.
    let total = sums
        .iter()
        .fold(0u64, |s, v| s.wrapping_add(v.load(Ordering::Relaxed)));
    std::hint::black_box(total);
    buffer.as_slice().len() as f64 / best
}

/// [`sum_words`] with the widest loads this CPU has (a streaming read with narrow loads
/// can fall short of what the memory gives), chosen once.
fn widest_sum() -> fn(&[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            return |bytes| unsafe { sum_words_avx512(bytes.as_chunks().0) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return |bytes| unsafe { sum_words_avx2(bytes.as_chunks().0) };
        }
    }
    |bytes| sum_words(bytes.as_chunks().0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_words_avx512(words: &[[u8; 8]]) -> u64 {
    sum_words(words)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_words_avx2(words: &[[u8; 8]]) -> u64 {
    sum_words(words)
}

/// The wrapping sum of `words`, over eight independent lanes so that loads, not additions,
/// bound it.
#[inline(always)]
fn sum_words(words: &[[u8; 8]]) -> u64 {
    let mut lanes = [0u64; 8];
    for block in words.chunks_exact(8) {
        for (lane, w) in lanes.iter_mut().zip(block) {
            *lane = lane.wrapping_add(u64::from_ne_bytes(*w));
        }
    }
    let rest = words.chunks_exact(8).remainder();
    let rest = rest.iter().map(|w| u64::from_ne_bytes(*w));
    lanes.into_iter().chain(rest).fold(0, u64::wrapping_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<[u8; 8]> = (1..=21u64).map(u64::to_ne_bytes).collect();
        assert_eq!(sum_words(&words), 231);
    }

    #[test]
    fn a_probe_reads_at_a_plausible_rate() {
        let rate = read_bandwidth(32 << 20, 2);
        // Any machine that runs models reads faster than 100 MB/s and slower than 10 TB/s.
        assert!((1e8..1e13).contains(&rate), "{rate}");
    }
}
