//! Subnormal floats flushed to zero while the engine computes.
//!
//! x86 cores handle an operation whose input or result is subnormal (below f32's normal range,
//! about 1.2e-38) in microcode, about a hundred times slower than any other: a quantized product
//! whose activations fell that low ran 7 times slower. Such values carry nothing a model's
//! output depends on, so a model's steps compute with the MXCSR's flush-to-zero and
//! denormals-are-zero modes on (a [`FlushSubnormals`] held by the thread running the step), as
//! oneDNN and TensorFlow run theirs. A loop of the pool runs its tasks on every thread in the
//! mode of the thread that started it, so that where a task runs never changes its result, and
//! work that must match another program bit for bit (quantizing weights as llama-quantize does)
//! keeps IEEE subnormals. Arm cores run subnormals at full speed: nothing changes there.

/// While alive, this thread's floating-point operations read subnormal inputs as zero and
/// write zero for subnormal results; dropping it restores the thread's previous mode (the
/// calling thread's mode is its owner's, Python's or an embedding program's).
#[must_use = "the mode holds only while the guard lives"]
pub struct FlushSubnormals {
    saved: u32,
}

/// The [`mode`] that flushes: MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
#[cfg(target_arch = "x86_64")]
const FLUSH: u32 = 0x8040;
#[cfg(not(target_arch = "x86_64"))]
const FLUSH: u32 = 0;

impl FlushSubnormals {
    /// Turns the flush on for this thread.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let saved = mode();
        if saved != FLUSH {
            set_mode(FLUSH);
        }
        FlushSubnormals { saved }
    }
}

impl Drop for FlushSubnormals {
    fn drop(&mut self) {
        if self.saved != FLUSH {
            set_mode(self.saved);
        }
    }
}

/// This thread's handling of subnormals: its MXCSR's flush-to-zero and denormals-are-zero
/// bits (0 where there are none to set).
pub(crate) fn mode() -> u32 {
    #[cfg(target_arch = "x86_64")]
    return x86::read_mxcsr() & FLUSH;
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Sets this thread's handling of subnormals to `mode` (of [`mode`]): a pool worker taking
/// that of the thread whose loop it runs.
pub(crate) fn set_mode(mode: u32) {
    #[cfg(target_arch = "x86_64")]
    x86::write_mxcsr((x86::read_mxcsr() & !FLUSH) | mode);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = mode;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    pub(super) fn read_mxcsr() -> u32 {
        let mut csr = 0u32;
        // SAFETY: stores the 4-byte MXCSR into a local; every x86-64 CPU has SSE.
        unsafe { asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags)) };
        csr
    }

    pub(super) fn write_mxcsr(csr: u32) {
        // SAFETY: loads a value read from MXCSR with only FTZ and DAZ changed, both valid on
        // every x86-64 CPU (DAZ since the Pentium 4, and reported in MXCSR_MASK).
        unsafe { asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags, readonly)) };
    }
}

#[cfg(test)]
mod tests {
    use super::FlushSubnormals;
    use std::hint::black_box;

    /// The smallest normal f32 halved: a subnormal.
    fn subnormal() -> f32 {
        black_box(f32::MIN_POSITIVE) / black_box(2.0)
    }

    #[test]
    fn flushes_while_alive_and_restores_after() {
        let before = subnormal();
        assert!(before > 0.0 && !before.is_normal());
        {
            let _flush = FlushSubnormals::new();
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(subnormal(), 0.0, "a subnormal result is written as zero");
                let input = black_box(f32::from_bits(1));
                assert_eq!(black_box(input) * black_box(2.0f32), 0.0, "read as zero");
            }
            let nested = FlushSubnormals::new();
            drop(nested);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                subnormal(),
                0.0,
                "a nested guard leaves its outer one's mode"
            );
        }
        assert_eq!(subnormal(), before, "the thread's mode is back");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_loop_runs_on_every_thread_in_the_mode_of_its_caller() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pool = crate::ThreadPool::new(3);
        // Flushed tasks and threads seen, for a loop started without and with the guard.
        let run = || {
            let (flushed, workers) = (AtomicUsize::new(0), AtomicUsize::new(0));
            pool.run(64, &|_, worker| {
                if subnormal() == 0.0 {
                    flushed.fetch_add(1, Ordering::Relaxed);
                }
                workers.fetch_or(1 << worker, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(200));
            });
            (flushed.into_inner(), workers.into_inner().count_ones())
        };
        let (flushed, threads) = run();
        assert_eq!(flushed, 0);
        assert!(threads > 1, "the loop ran on several threads");
        {
            let _flush = FlushSubnormals::new();
            let (flushed, threads) = run();
            assert_eq!(flushed, 64);
            assert!(threads > 1);
        }
        let (flushed, _) = run();
        assert_eq!(
            flushed, 0,
            "workers that flushed for the last loop follow the caller"
        );
        assert!(subnormal() > 0.0);
    }
}
