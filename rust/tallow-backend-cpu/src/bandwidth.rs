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
/// and touched first, so that no page fault is timed): the best of `passes` reads of it with
/// each of the summing loops of [`summing_loops`] (how fast a loop streams memory depends on
/// its shape in ways no one shape wins on every CPU: on a 2-core Xeon, two 256-bit
/// accumulators read 31-34 GB/s where four read 29.5 and four 512-bit ones 30.5).
pub fn read_bandwidth(bytes: usize, passes: usize) -> f64 {
    let mut probe = ReadProbe::uncalibrated(bytes);
    for _ in 0..passes.max(1) {
        probe.calibrate();
    }
    probe.len() as f64 / probe.fastest[probe.best()]
}

/// A buffer of a decode step's size, made once, whose reads are timed one at a time: a probe
/// to take turns with decode steps, token by token, on a machine whose memory's rate moves
/// within a second (where a probe before and after a run of steps can each catch another
/// rate than the steps saw).
pub struct ReadProbe {
    buffer: AlignedBytes,
    /// Per compute thread, the sum of what it read: keeps the reads from being optimised away.
    sums: Vec<AtomicU64>,
    /// The summing loops of [`summing_loops`], and the fastest read of each so far.
    loops: Vec<fn(&[u8]) -> u64>,
    fastest: Vec<f64>,
}

impl ReadProbe {
    /// A probe of `bytes` (rounded up to whole chunks of a MiB), laid out as packed weights
    /// are: aligned to huge pages, which the kernel is asked for; written with nonzero bytes,
    /// so that every page is faulted in before a read is timed and none is the kernel's
    /// shared zero page (which a zeroing the compiler turns into a zeroed allocation would
    /// leave). Calibrated once ([`ReadProbe::calibrate`]).
    pub fn new(bytes: usize) -> ReadProbe {
        let mut probe = ReadProbe::uncalibrated(bytes);
        probe.calibrate();
        probe
    }

    /// The probe of [`ReadProbe::new`], no loop timed yet.
    fn uncalibrated(bytes: usize) -> ReadProbe {
        let mut buffer = AlignedBytes::zeroed(bytes.div_ceil(CHUNK).max(1) * CHUNK);
        buffer.as_mut_slice().fill(1);
        let loops = summing_loops();
        ReadProbe {
            buffer,
            sums: (0..global().threads())
                .map(|_| AtomicU64::default())
                .collect(),
            fastest: vec![f64::INFINITY; loops.len()],
            loops,
        }
    }

    /// Reads the buffer once with each summing loop, keeping each loop's fastest read so far
    /// ([`ReadProbe::seconds`] reads with the loop whose fastest is the fastest). Which loop
    /// reads fastest can depend on how busy the memory is (on a 2-core Zen 5, loops that ask
    /// for lines ahead read as fast as plain ones where the memory gave 40-50 GB/s, 5-15%
    /// slower where it gave 80): calibrated again from time to time, the probe settles on the
    /// loop that reads fastest where the memory is fastest, and reads with it in every minute.
    pub fn calibrate(&mut self) {
        for (i, &sum) in self.loops.iter().enumerate() {
            self.fastest[i] = self.fastest[i].min(self.time(sum));
        }
    }

    /// The loop whose fastest read is the fastest (the first before any read is timed).
    fn best(&self) -> usize {
        let times = self.fastest.iter().enumerate();
        times.min_by(|a, b| a.1.total_cmp(b.1)).unwrap().0
    }

    /// Bytes one read covers.
    pub fn len(&self) -> usize {
        self.buffer.as_slice().len()
    }

    /// Whether the probe reads nothing (never: it is at least a chunk).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Seconds the compute threads take to read the whole buffer once, with the loop whose
    /// fastest read ([`ReadProbe::calibrate`]) is the fastest.
    pub fn seconds(&self) -> f64 {
        self.time(self.loops[self.best()])
    }

    /// Seconds of one read of the buffer with `sum_chunk`, the chunks spread over the pool.
    fn time(&self, sum_chunk: fn(&[u8]) -> u64) -> f64 {
        // The buffer is whole chunks.
        let bytes = self.buffer.as_slice();
        let start = Instant::now();
        global().run(bytes.len() / CHUNK, &|i, worker| {
            let chunk = &bytes[i * CHUNK..(i + 1) * CHUNK];
            self.sums[worker].fetch_add(sum_chunk(chunk), Ordering::Relaxed);
        });
        start.elapsed().as_secs_f64()
    }
}

/// How far ahead of its reads a prefetching loop of the probe asks for lines, as the one-token
/// products ask for their weights on most CPUs. The hardware prefetcher alone leaves part of
/// the bandwidth unused: on a 2-core Xeon the loops without requests read 29-31 GB/s, with
/// them 32-34.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 2048;

/// How far ahead a loop that also asks for every line into the L2 cache asks so, as the
/// one-token products do on Intel's CPUs. On a 2-core Xeon with AVX-512 (a 636 MiB buffer,
/// each loop after the others in one probe, nine probes) the best of the other loops read
/// 34.8-38.1 GB/s, the better of these 35.6-39.0, 1-5% more; capped to AVX2, 0.5-1% more.
#[cfg(target_arch = "x86_64")]
const L2_AHEAD: usize = 4096;

/// The loops the probe reads with: [`sum_words`] with the vector loads of the instruction set
/// the kernels use (the CPU's best, or what `TALLOW_ISA` caps it to: a capped run's kernels
/// read with the narrower loads), with two and with four accumulators, with two accumulators
/// asking for each line [`AHEAD`] bytes before reading it, and with one and two asking also
/// [`L2_AHEAD`] bytes before into the L2 cache.
fn summing_loops() -> Vec<fn(&[u8]) -> u64> {
    #[cfg(target_arch = "x86_64")]
    {
        use tallow_quant::Isa;
        let isa = Isa::detected();
        // SAFETY (each): the CPU has the loop's instruction set (`Isa::detected` checked it).
        if isa >= Isa::Avx512 {
            return vec![
                |bytes| unsafe { x86::sum_avx512::<2, 0, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx512::<4, 0, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<2, 0, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx512::<2, AHEAD, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<2, AHEAD, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx512::<1, AHEAD, L2_AHEAD>(bytes) },
                |bytes| unsafe { x86::sum_avx512::<2, AHEAD, L2_AHEAD>(bytes) },
            ];
        }
        if isa >= Isa::Avx2 {
            return vec![
                |bytes| unsafe { x86::sum_avx2::<2, 0, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<4, 0, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<2, AHEAD, 0>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<1, AHEAD, L2_AHEAD>(bytes) },
                |bytes| unsafe { x86::sum_avx2::<2, AHEAD, L2_AHEAD>(bytes) },
            ];
        }
    }
    vec![|bytes| sum_words(bytes.as_chunks().0)]
}

/// The probe's loops in intrinsics: one aligned vector load per vector of bytes, into `A`
/// accumulators. (Left to the compiler, the generic loop over eight lanes became gathers,
/// which read a fifth slower than plain loads.)
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The wrapping sum of `bytes`' u64 words: its length is a multiple of 256 and it starts
    /// on a 64-byte boundary. With `AHEAD` > 0, each cache line is asked for into the L1
    /// cache `AHEAD` bytes before it is read; with `L2` > 0, into the L2 cache `L2` bytes
    /// before.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_avx512<const A: usize, const AHEAD: usize, const L2: usize>(
        bytes: &[u8],
    ) -> u64 {
        assert!(bytes.len().is_multiple_of(64 * A) && bytes.as_ptr().addr().is_multiple_of(64));
        let mut acc = [_mm512_setzero_si512(); A];
        for block in bytes.chunks_exact(64 * A) {
            prefetch_lines::<AHEAD, L2>(block);
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 64 aligned bytes inside `block`.
                let v = unsafe { _mm512_load_si512(block.as_ptr().add(64 * k).cast()) };
                *acc = _mm512_add_epi64(*acc, v);
            }
        }
        let sum = acc
            .into_iter()
            .fold(_mm512_setzero_si512(), |s, v| _mm512_add_epi64(s, v));
        _mm512_reduce_add_epi64(sum) as u64
    }

    /// [`sum_avx512`] with 256-bit loads.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_avx2<const A: usize, const AHEAD: usize, const L2: usize>(
        bytes: &[u8],
    ) -> u64 {
        assert!(bytes.len().is_multiple_of(32 * A) && bytes.as_ptr().addr().is_multiple_of(32));
        let mut acc = [_mm256_setzero_si256(); A];
        for block in bytes.chunks_exact(32 * A) {
            prefetch_lines::<AHEAD, L2>(block);
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 32 aligned bytes inside `block`.
                let v = unsafe { _mm256_load_si256(block.as_ptr().add(32 * k).cast()) };
                *acc = _mm256_add_epi64(*acc, v);
            }
        }
        let sum = acc
            .into_iter()
            .fold(_mm256_setzero_si256(), |s, v| _mm256_add_epi64(s, v));
        let mut words = [0u64; 4];
        _mm256_storeu_si256(words.as_mut_ptr().cast(), sum);
        words.into_iter().fold(0, u64::wrapping_add)
    }

    /// Asks for the cache lines that begin in `block`, `AHEAD` bytes on, into the L1 cache
    /// and `L2` bytes on into the L2 cache (nothing where they are 0). A prefetch reads nothing
    /// and never faults, past the end of the buffer included.
    #[inline(always)]
    fn prefetch_lines<const AHEAD: usize, const L2: usize>(block: &[u8]) {
        if AHEAD == 0 && L2 == 0 {
            return;
        }
        let start = block.as_ptr();
        let first = start.addr().next_multiple_of(64) - start.addr();
        for line in (first..block.len()).step_by(64) {
            // SAFETY (both): `_mm_prefetch` only hints the cache; `wrapping_add` never
            // dereferences.
            if AHEAD > 0 {
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(line + AHEAD).cast()) };
            }
            if L2 > 0 {
                unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(line + L2).cast()) };
            }
        }
    }
}

/// The wrapping sum of `words`, over eight independent lanes so that loads, not additions,
/// bound it.
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
    fn every_loop_sums_alike() {
        let mut buffer = AlignedBytes::zeroed(CHUNK);
        for (i, b) in buffer.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7 + i / 251) as u8;
        }
        let bytes = buffer.as_slice();
        let expected = sum_words(bytes.as_chunks().0);
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                assert_eq!(unsafe { x86::sum_avx2::<2, 0, 0>(bytes) }, expected);
                assert_eq!(unsafe { x86::sum_avx2::<4, 0, 0>(bytes) }, expected);
                assert_eq!(unsafe { x86::sum_avx2::<2, AHEAD, 0>(bytes) }, expected);
                assert_eq!(
                    unsafe { x86::sum_avx2::<1, AHEAD, L2_AHEAD>(bytes) },
                    expected
                );
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                assert_eq!(unsafe { x86::sum_avx512::<2, 0, 0>(bytes) }, expected);
                assert_eq!(unsafe { x86::sum_avx512::<4, 0, 0>(bytes) }, expected);
                assert_eq!(unsafe { x86::sum_avx512::<2, AHEAD, 0>(bytes) }, expected);
                assert_eq!(
                    unsafe { x86::sum_avx512::<1, AHEAD, L2_AHEAD>(bytes) },
                    expected
                );
            }
        }
        for sum in summing_loops() {
            assert_eq!(sum(bytes), expected);
        }
    }

    #[test]
    fn a_probe_reads_at_a_plausible_rate() {
        let rate = read_bandwidth(32 << 20, 2);
        // Any machine reads faster than 1 MB/s and slower than 10 TB/s; the floor is that low
        // because these tests also run under an instruction-set emulator (qemu reads at tens of
        // MB/s on a busy host).
        let plausible = 1e6..1e13;
        assert!(plausible.contains(&rate), "{rate}");
        let mut probe = ReadProbe::new(3 << 20);
        assert_eq!(probe.len(), 3 << 20);
        let rate = probe.len() as f64 / probe.seconds();
        assert!(plausible.contains(&rate), "{rate}");
        // Calibrating again keeps each loop's fastest read, and reads with the fastest loop.
        let before = probe.fastest.clone();
        probe.calibrate();
        for (now, then) in probe.fastest.iter().zip(&before) {
            assert!(now <= then && now.is_finite());
        }
        assert!(probe
            .fastest
            .iter()
            .all(|&t| probe.fastest[probe.best()] <= t));
    }
}
