//! The vector operations the packed kernels' one loop (`super`) is written
//! in, at two widths: [`V256`] (AVX2, eight i32 lanes: half of a packed group per vector) and
//! [`V512`] (AVX-512 BW, sixteen lanes: a whole group, with VNNI's dot products where the CPU
//! has them). Each i32 lane belongs to one weight row; a packed word of 64 bytes holds four
//! bytes of each of the group's 16 rows.
//!
//! The generic code calls these through `#[inline(always)]` functions of its own, inside a
//! loop compiled with each set's target features, so everything is inlined into code
//! compiled for the set it runs on.
//!
//! # Safety
//! [`V256`]'s operations need AVX2, FMA and F16C, [`V512`]'s AVX-512 F and BW (and VNNI with
//! `V512<Vnni>`); the kernels built on them are only handed out by `crate::kernels::Isa::kernels` when
//! the CPU has them.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::super::DotBytes;

/// A vector of one i32 lane (or f32 lane) per weight row.
pub(super) trait Simd {
    /// Rows per vector.
    const ROWS: usize;
    /// Vectors per packed group of `PACK_ROWS` rows.
    const HALVES: usize = super::PACK_ROWS / Self::ROWS;
    type I: Copy;
    type F: Copy;

    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    /// Part `h` of packed word `w`: its bytes for rows `ROWS * h..ROWS * (h + 1)`.
    unsafe fn word(words: &[u8], w: usize, h: usize) -> Self::I;
    /// Part `h` of f16 field `k` (one value per row, 16 rows per field), as f32.
    unsafe fn field(fields: &[u8], k: usize, h: usize) -> Self::F;
    /// Part `h` of an f32 field (one value per row, 16 rows in 64 bytes).
    unsafe fn field_f32(fields: &[u8; 64], h: usize) -> Self::F;
    /// `x` in every i32 lane.
    unsafe fn splat_i32(x: i32) -> Self::I;
    /// `x` in every i16 lane.
    unsafe fn splat_i16(x: i16) -> Self::I;
    /// The low (`n == 0`) or high (`n == 1`) nibbles of `v`'s bytes.
    unsafe fn nibbles(v: Self::I, n: usize) -> Self::I;
    /// The bits of `v`'s bytes at `from..` moved to bit 4 and up, kept where `mask` is set. A
    /// 16-bit shift of at most 4 places cannot carry another byte's bits into bits 4 and 5.
    unsafe fn bits_to_4(v: Self::I, from: usize, mask: i8) -> Self::I;
    /// Per i32 lane, bytes `lo` and `hi` of the lane as the two i16 of the lane:
    /// zero-extended, or sign-extended with `signed`.
    unsafe fn byte_pair(v: Self::I, lo: usize, hi: usize, signed: bool) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// Each i16 lane shifted right by `n` bits, shifting in zeros.
    unsafe fn shr16(v: Self::I, n: u32) -> Self::I;
    /// Each i32 lane shifted right by `n` places, its sign kept.
    unsafe fn sra32(v: Self::I, n: u32) -> Self::I;
    /// Unsigned bytes of `u` times signed bytes of `s`, adjacent products summed to i16
    /// (`vpmaddubsw`).
    unsafe fn maddubs(u: Self::I, s: Self::I) -> Self::I;
    /// i16 products, adjacent ones summed to i32 (`vpmaddwd`).
    unsafe fn madd(a: Self::I, b: Self::I) -> Self::I;
    /// Whether [`Simd::dot4`] is one instruction (VNNI's `vpdpbusd`): then a sum of byte
    /// products without an integer scale is cheapest taken straight into i32 lanes.
    const FUSED_DOT: bool = false;
    /// How a product asks for its weights ahead of its loads on each kind of core (see
    /// `super::prefetch_part`), by [`Cores`] as an index.
    const PREFETCH: [Prefetch; CORE_KINDS];
    /// [`Simd::PREFETCH`] of the running CPU's cores. (A `match` of constants: the array
    /// indexed by the cores as a number cost VNNI's prefill products of Q8_0 a fifth of their
    /// rate, laundered through `black_box` as well.)
    #[inline(always)]
    fn running_prefetch() -> Prefetch {
        match cores() {
            Cores::ZenUpTo4 => Self::PREFETCH[Cores::ZenUpTo4 as usize],
            Cores::Zen5On => Self::PREFETCH[Cores::Zen5On as usize],
            Cores::Other => Self::PREFETCH[Cores::Other as usize],
        }
    }
    /// `acc` plus, per i32 lane, the sum of the four products of `u`'s unsigned bytes and
    /// `s`'s signed bytes.
    #[inline(always)]
    unsafe fn dot4(acc: Self::I, u: Self::I, s: Self::I) -> Self::I {
        Self::add32(acc, Self::madd(Self::maddubs(u, s), Self::splat_i16(1)))
    }
    /// `acc` plus `madd(a, b)` (VNNI: one `vpdpwssd`).
    #[inline(always)]
    unsafe fn madd_add(acc: Self::I, a: Self::I, b: Self::I) -> Self::I {
        Self::add32(acc, Self::madd(a, b))
    }
    /// Per i32 lane, the low i16 of `a`'s lane and of `b`'s as the lane's two i16 (`a`'s
    /// low): two sums known to fit in i16, to widen against a pair of scales at once.
    unsafe fn pack_pairs(a: Self::I, b: Self::I) -> Self::I;
    /// The high i16 of each i32 lane, sign-extended: one of a lane's two equal i16 scales as
    /// an i32.
    unsafe fn high_i16(v: Self::I) -> Self::I;
    /// The low 32 bits of the i32 lanes' products.
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add16(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub32(a: Self::I, b: Self::I) -> Self::I;
    /// Each i32 lane shifted left by `N` bits.
    unsafe fn shl32<const N: u32>(v: Self::I) -> Self::I;
    unsafe fn to_f32(v: Self::I) -> Self::F;
    unsafe fn splat(x: f32) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, rounded once.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c - a * b`, rounded once.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Stores the `ROWS` lanes of `v` at `out[..ROWS]`.
    unsafe fn store(v: Self::F, out: &mut [f32]);
}

/// The byte offset of each i32 lane within its 128-bit part, four times over (what
/// `vpshufb` indexes: it shuffles within 128-bit parts).
const LANE_BYTES: [i8; 16] = [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12];

/// The `vpshufb` pattern of [`Simd::byte_pair`] for lane offset 0; an index with bit 7 set
/// gives 0.
fn byte_pair_pattern(lo: usize, hi: usize, signed: bool) -> i32 {
    let (lo, hi) = (lo as i32, hi as i32);
    let zero = 0x80;
    if signed {
        zero | (lo << 8) | (zero << 16) | (hi << 24)
    } else {
        lo | (zero << 8) | (hi << 16) | (zero << 24)
    }
}

/// How far ahead of the block it reads a product asks for the weights, and into
/// which cache.
#[derive(Clone, Copy)]
pub(super) struct Prefetch {
    /// Bytes ahead.
    pub ahead: usize,
    /// Into the L1 cache (`_MM_HINT_T0`), else into L2 (`_MM_HINT_T1`).
    pub into_l1: bool,
    /// Where one-token products of the light formats (`Format::LIGHT`) ask for the first
    /// line of each 4 KiB page alone, this many bytes ahead; `None` where they ask as others do.
    pub pages_ahead: Option<usize>,
    /// Where every line is also asked for into L2 this many bytes ahead (further than `ahead`).
    pub l2_ahead: Option<usize>,
}

impl Prefetch {
    /// The requests for a block other than the next in memory, for its lines alone (into L1
    /// where `self` asks so).
    pub fn at_next(self) -> Prefetch {
        Prefetch {
            ahead: 0,
            l2_ahead: None,
            ..self
        }
    }
}

/// Every line, 2048 bytes ahead, into L1: AVX2's requests on AMD's CPUs up to Zen 4. On
/// Zen 3 (AVX2 only) the hardware prefetcher alone left a tenth to a fifth of two threads'
/// memory bandwidth unused; requests into L1 1536 to 3072 bytes ahead read within noise of
/// each other.
const EVERY_LINE_INTO_L1: Prefetch = Prefetch {
    ahead: 2048,
    into_l1: true,
    pages_ahead: None,
    l2_ahead: None,
};

/// [`EVERY_LINE_INTO_L1`], and every line 4096 bytes ahead into L2 as well: the requests of
/// both instruction sets on Intel's CPUs. On a 2-core Intel Xeon with AVX-512 VNNI (2
/// threads, one-token products of 300 MiB of weights, `cargo bench -p tallow-quant --bench
/// kernels -- matvec_streamed`, GiB/s), VNNI's Q4_K read 26.4 with the requests into L1 alone
/// against 17.2 with Zen 4's requests below, 24.2 with every line 8192 bytes ahead into L2
/// alone, 25.6 1024 bytes ahead into L1 and 18.5 4096 ahead (Q6_K 26.7 against 17.6, Q3_K
/// 24.5 against 14.0, Q4_0 25.1 against 24.9). The requests into L2 keep the stream fuller
/// where the memory is busy: there a 1B Q4_K_M model's decode ran 30.6-31.6 t/s with them,
/// 24.2-26.4 without, in turns (the read probe at 25-28 GB/s); where it was not, the streamed
/// bench's Q4_K read 25.1-25.3 GiB/s with them against 22.8-23.8 without, Q6_K 23.3-23.7
/// against 22.8-23.8.
const INTEL_EVERY_LINE: Prefetch = Prefetch {
    l2_ahead: Some(4096),
    ..EVERY_LINE_INTO_L1
};

/// AVX-512's requests on AMD's CPUs up to Zen 4. On Zen 4 requests into L1 cost a fifth of
/// one thread's stream (Q4_K at 36864 x 768: 15.5-18 GiB/s with them, 18-24 without), while
/// requests 8192 bytes ahead into L2 keep two threads' streams fuller (3B decode 14.3-15.4
/// to 16.8-19.9 t/s) and leave one thread's as it is. But not a light format's one-token
/// stream, which reads fastest with the first line of each page asked for alone, 32 KiB
/// ahead, the hardware prefetcher following the rest. Two threads over 300 MiB of weights,
/// each way in turns after a read probe, the share of the probe's rate read, page starts /
/// every line / nothing: VNNI's Q4_K in minutes when the probe read 55-65 GB/s 0.86 / 0.73 /
/// 0.79, where it read 33-37 1.00 / 0.94 / 1.00; Q6_K 1.01 / 0.94, Q5_K 0.99 / 0.93, Q8_0
/// 0.99 / 0.93, IQ4_XS 0.98 / 0.91, Q3_K 0.97-0.99 / 0.92-0.93 (equal in fast minutes). The
/// formats with more work per byte read slower so in fast minutes (Q4_1 0.61 / 0.70, Q4_0
/// 0.61 / 0.69, Q5_0 0.50 / 0.74, Q2_K 0.74 / 0.80), as do products of two tokens or more.
/// A 1B Q4_K_M model's decode steps, page starts against every line in turns in one
/// process: 48-54 against 37-42 GB/s where the probe read 62-68, 31-33 against 28-31 where
/// it read 35.
const ZEN4_AVX512: Prefetch = Prefetch {
    ahead: 8192,
    into_l1: false,
    pages_ahead: Some(32768),
    l2_ahead: None,
};

/// Every line, 8192 bytes ahead, into L2: both instruction sets' requests on AMD's Zen 5 and
/// later. There a light format's one-token stream asked for by page starts alone (Zen 4's
/// [`ZEN4_AVX512`]) read at half the rate: two threads' one-token products over 300 MiB of
/// weights (`cargo bench -p tallow-quant --bench kernels -- matvec_streamed`, GiB/s, VNNI)
/// read Q4_K at 64.8 against 25.4, Q6_K 55.6 against 30.5, IQ4_XS 70.2 against 34.5, Q2_K
/// 65.2 against 46.8. A 1B Q4_K_M model's decode steps, each way in turns in one process in
/// minutes when the read probe read 84 GB/s: 74.5 GB/s with these, 72.4 at 6144 bytes ahead,
/// 67.9 at 4096, 70.5 with every line 4096 ahead into L1 and 8192 into L2 as well, 28-30
/// with page starts; capped to AVX2, 73 against 63 for AVX2's requests on older AMD CPUs
/// ([`EVERY_LINE_INTO_L1`]). Further ahead read less (10240 bytes the same, 12288 4%
/// less, 16384 5%); prefill reads the same either way.
const ZEN5_EVERY_LINE: Prefetch = Prefetch {
    ahead: 8192,
    into_l1: false,
    pages_ahead: None,
    l2_ahead: None,
};

/// Whose cores the running CPU has, as far as their prefetching goes.
#[derive(Clone, Copy)]
pub(super) enum Cores {
    /// AMD's, up to Zen 4 (families 0x17 and 0x19).
    ZenUpTo4 = 0,
    /// AMD's, Zen 5 (family 0x1A) and later.
    Zen5On = 1,
    /// Intel's, and any other maker's.
    Other = 2,
}

/// Kinds of [`Cores`] (the last one's discriminant and one).
const CORE_KINDS: usize = Cores::Other as usize + 1;

/// What a kernel compiled for `CORES` (a [`Cores`] as an index, or [`ANY_CORES`]) asks for.
pub(super) const ANY_CORES: usize = CORE_KINDS;

/// `S`'s requests on the cores a kernel is compiled for: `CORES` names them, or is
/// [`ANY_CORES`], where they are the running CPU's, looked up as the kernel runs. A one-token
/// product, the stream of weights with the least work per byte, is compiled for each kind of
/// core, so that its requests are constants and nothing else is done for them: asking which
/// requests to make as it ran (a branch or two per part of a block) cost VNNI's Q8_0 products
/// of a 1B model's decode steps a tenth of their rate (two threads on a Zen 5, processes of
/// each build in turns: 90% of a read probe's rate against 97% where the probe read about 40
/// GB/s, 75% against 87% where it read 80). AVX2's own one-token kernels of Q4_K and Q6_K read
/// faster looking theirs up (`super::one_token_avx2`).
#[inline(always)]
pub(super) fn requests<S: Simd, const CORES: usize>() -> Prefetch {
    match CORES {
        ANY_CORES => S::running_prefetch(),
        kind => S::PREFETCH[kind],
    }
}

/// The running CPU's cores.
pub(super) fn cores() -> Cores {
    match super::super::cpu::amd_family() {
        None => Cores::Other,
        Some(family) if family >= 0x1A => Cores::Zen5On,
        Some(_) => Cores::ZenUpTo4,
    }
}

/// AVX2: eight rows per vector.
pub(super) struct V256;

impl Simd for V256 {
    const ROWS: usize = 8;
    const PREFETCH: [Prefetch; CORE_KINDS] =
        [EVERY_LINE_INTO_L1, ZEN5_EVERY_LINE, INTEL_EVERY_LINE];
    type I = __m256i;
    type F = __m256;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn word(words: &[u8], w: usize, h: usize) -> __m256i {
        let part: &[u8; 32] = words[64 * w + 32 * h..][..32].try_into().unwrap();
        _mm256_loadu_si256(part.as_ptr().cast())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn field(fields: &[u8], k: usize, h: usize) -> __m256 {
        let part: &[u8; 16] = fields[32 * k + 16 * h..][..16].try_into().unwrap();
        _mm256_cvtph_ps(_mm_loadu_si128(part.as_ptr().cast()))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn field_f32(fields: &[u8; 64], h: usize) -> __m256 {
        let part: &[u8; 32] = fields[32 * h..][..32].try_into().unwrap();
        _mm256_loadu_ps(part.as_ptr().cast())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat_i32(x: i32) -> __m256i {
        _mm256_set1_epi32(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat_i16(x: i16) -> __m256i {
        _mm256_set1_epi16(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(v: __m256i, n: usize) -> __m256i {
        let v = if n == 0 { v } else { _mm256_srli_epi16::<4>(v) };
        _mm256_and_si256(v, _mm256_set1_epi8(0xf))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bits_to_4(v: __m256i, from: usize, mask: i8) -> __m256i {
        let shifted = if from <= 4 {
            _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - from as i32))
        } else {
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(from as i32 - 4))
        };
        _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn byte_pair(v: __m256i, lo: usize, hi: usize, signed: bool) -> __m256i {
        let lanes = _mm256_broadcastsi128_si256(_mm_loadu_si128(LANE_BYTES.as_ptr().cast()));
        let pattern = _mm256_set1_epi32(byte_pair_pattern(lo, hi, signed));
        let picked = _mm256_shuffle_epi8(v, _mm256_add_epi8(pattern, lanes));
        if signed {
            _mm256_srai_epi16::<8>(picked)
        } else {
            picked
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shr16(v: __m256i, n: u32) -> __m256i {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sra32(v: __m256i, n: u32) -> __m256i {
        _mm256_sra_epi32(v, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn maddubs(u: __m256i, s: __m256i) -> __m256i {
        _mm256_maddubs_epi16(u, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn madd(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_pairs(a: __m256i, b: __m256i) -> __m256i {
        _mm256_blend_epi16::<0xaa>(a, _mm256_slli_epi32::<16>(b))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn high_i16(v: __m256i) -> __m256i {
        _mm256_srai_epi32::<16>(v)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mullo32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_mullo_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add16(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_sub_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shl32<const N: u32>(v: __m256i) -> __m256i {
        // A constant count, which the compiler makes an immediate.
        _mm256_sll_epi32(v, _mm_cvtsi32_si128(N as i32))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn to_f32(v: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(v: __m256, out: &mut [f32]) {
        let out: &mut [f32; 8] = (&mut out[..8]).try_into().unwrap();
        _mm256_storeu_ps(out.as_mut_ptr(), v)
    }
}

/// AVX-512 (F and BW): sixteen rows per vector, a whole packed group; its byte and word dot
/// products from `D` (VNNI's, or BW's `vpmaddubsw` and `vpmaddwd`).
pub(super) struct V512<D>(PhantomData<D>);

impl<D: DotBytes> Simd for V512<D> {
    const ROWS: usize = 16;
    type I = __m512i;
    type F = __m512;
    const FUSED_DOT: bool = D::FUSED;
    const PREFETCH: [Prefetch; CORE_KINDS] = [ZEN4_AVX512, ZEN5_EVERY_LINE, INTEL_EVERY_LINE];

    #[inline(always)]
    unsafe fn dot4(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        D::dot(acc, u, s)
    }
    #[inline(always)]
    unsafe fn madd_add(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        D::dot_i16(acc, a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn word(words: &[u8], w: usize, h: usize) -> __m512i {
        debug_assert_eq!(h, 0, "one vector holds the whole group");
        let part: &[u8; 64] = words[64 * w..][..64].try_into().unwrap();
        _mm512_loadu_si512(part.as_ptr().cast())
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn field(fields: &[u8], k: usize, h: usize) -> __m512 {
        debug_assert_eq!(h, 0, "one vector holds the whole group");
        let part: &[u8; 32] = fields[32 * k..][..32].try_into().unwrap();
        _mm512_cvtph_ps(_mm256_loadu_si256(part.as_ptr().cast()))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn field_f32(fields: &[u8; 64], h: usize) -> __m512 {
        debug_assert_eq!(h, 0, "one vector holds the whole group");
        _mm512_loadu_ps(fields.as_ptr().cast())
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn splat_i32(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn splat_i16(x: i16) -> __m512i {
        _mm512_set1_epi16(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn nibbles(v: __m512i, n: usize) -> __m512i {
        // A shift by a count in a register, not a branch on `n`: the loop over a block's
        // sub-blocks stays rolled at this width, where `n` is no constant and a branch per
        // step cost the Q4_K and Q5_K products a sixth of their speed. (At AVX2's width the
        // branch costs nothing and the shift by a register 3-8%.)
        _mm512_and_si512(Self::shr16(v, 4 * n as u32), _mm512_set1_epi8(0xf))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn bits_to_4(v: __m512i, from: usize, mask: i8) -> __m512i {
        let shifted = if from <= 4 {
            _mm512_sll_epi16(v, _mm_cvtsi32_si128(4 - from as i32))
        } else {
            _mm512_srl_epi16(v, _mm_cvtsi32_si128(from as i32 - 4))
        };
        _mm512_and_si512(shifted, _mm512_set1_epi8(mask))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn byte_pair(v: __m512i, lo: usize, hi: usize, signed: bool) -> __m512i {
        let lanes = _mm512_broadcast_i32x4(_mm_loadu_si128(LANE_BYTES.as_ptr().cast()));
        let pattern = _mm512_set1_epi32(byte_pair_pattern(lo, hi, signed));
        let picked = _mm512_shuffle_epi8(v, _mm512_add_epi8(pattern, lanes));
        if signed {
            _mm512_srai_epi16::<8>(picked)
        } else {
            picked
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn shr16(v: __m512i, n: u32) -> __m512i {
        _mm512_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn sra32(v: __m512i, n: u32) -> __m512i {
        _mm512_sra_epi32(v, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn maddubs(u: __m512i, s: __m512i) -> __m512i {
        _mm512_maddubs_epi16(u, s)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn madd(a: __m512i, b: __m512i) -> __m512i {
        _mm512_madd_epi16(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack_pairs(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mask_blend_epi16(0xaaaa_aaaa, a, _mm512_slli_epi32::<16>(b))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn high_i16(v: __m512i) -> __m512i {
        _mm512_srai_epi32::<16>(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn mullo32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn add16(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi16(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn sub32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn shl32<const N: u32>(v: __m512i) -> __m512i {
        _mm512_slli_epi32::<N>(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn to_f32(v: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn store(v: __m512, out: &mut [f32]) {
        let out: &mut [f32; 16] = (&mut out[..16]).try_into().unwrap();
        _mm512_storeu_ps(out.as_mut_ptr(), v)
    }
}
