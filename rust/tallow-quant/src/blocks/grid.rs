//! The IQ1, IQ2, IQ3 and ternary (TQ) formats: super-blocks of 256 weights whose values are
//! small integers (codebook entries with signs, or -1/0/1) times a small integer scale per
//! group, times the block's scale.
//!
//! Every format decodes the same way, through [`GridBlock::decode`]: 256 `i8` values and 16
//! integer scales (one per 16 elements; a format whose scale covers 32 repeats it), so that
//! weight `e` is `d * UNIT * scale[e / 16] * value[e]`. The products are exact in f32 (at most
//! 22 significant bits), so the reference dequantizer gives ggml's bits whatever the order of
//! its multiplies, and one dot product (integer sums per group, one float multiply per block)
//! serves every format.

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::{Block, QK_K};
use crate::fp16::f16_to_f32;

/// A super-block whose weights are `d() * UNIT * scale[e / 16] * value[e]`.
pub(crate) trait GridBlock: Block {
    /// The power of two the integer values are in units of.
    const UNIT: f32;
    /// The block's scale: the bits of an f16.
    fn d_bits(&self) -> [u8; 2];
    /// The block's float scale.
    #[inline(always)]
    fn d(&self) -> f32 {
        f16_to_f32(self.d_bits())
    }
    /// Writes the 256 integer values and returns the 16 integer group scales.
    fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16];
}

/// A grid block whose values are nonzero magnitudes (1 to 62) with signs (codebook entries
/// with explicit signs in the IQ2 and IQ3 formats, `8 * grid ± 1` in the IQ1 ones), which SIMD
/// kernels apply to the activations instead.
pub(crate) trait SignedGridBlock: GridBlock {
    /// Values 8k..8k+8: their magnitudes (bytes, first value lowest) and their signs (bit j
    /// set: value j is negative).
    fn piece(&self, k: usize) -> (u64, u8);
    /// Values 8k..8k+8: their magnitudes, and bytewise 1 or -1 with their signs (what SIMD
    /// kernels move onto the activations; only x86 has such kernels).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    fn piece_ones(&self, k: usize) -> (u64, u64) {
        let (magnitudes, signs) = self.piece(k);
        (magnitudes, SIGN_MASKS[usize::from(signs)] | ONES)
    }
    /// The scales of groups `2c` and `2c + 1` (values `32c..32c + 32`), read alone.
    fn chunk_scales(&self, c: usize) -> (i32, i32);
    /// Whether a one-token product is better off reading each chunk's scales alone as it
    /// reaches the chunk (IQ3_XXS, whose scale shares a u32 with the chunk's signs) than all
    /// 16 of the block at once.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const CHUNK_SCALES_ALONE: bool = false;
    /// The 16 integer group scales.
    #[inline(always)]
    fn scales(&self) -> [i32; 16] {
        // A loop rather than `array::from_fn`, whose closure stayed a call in the SIMD kernels.
        let mut scales = [0; 16];
        for c in 0..8 {
            (scales[2 * c], scales[2 * c + 1]) = self.chunk_scales(c);
        }
        scales
    }
    /// Values 32c..32c+32's magnitudes as eight codebook entries of four values each, for
    /// the formats whose entries hold four (IQ3): gathered as they are, where
    /// [`SignedGridBlock::piece`] puts pairs of them together first. `None` for the formats
    /// of 8-value entries.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    fn quads(&self, _c: usize) -> Option<[u32; 8]> {
        None
    }
    /// [`SignedGridBlock::quads`], their indices put together with BMI2's `pdep` where the
    /// format's are split between bytes (IQ3_S).
    ///
    /// # Safety
    /// The CPU has BMI2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quads_pdep(&self, c: usize) -> Option<[u32; 8]> {
        self.quads(c)
    }
    /// Values 32c..32c+32's magnitudes as four codebook entries of eight values, their indices
    /// put together with BMI2's `pdep` where the format's are split between bytes (IQ2_S);
    /// `None` for the other formats.
    ///
    /// # Safety
    /// The CPU has BMI2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn entries_pdep(&self, _c: usize) -> Option<[u64; 4]> {
        None
    }
    /// Values 32c..32c+32's signs, bit e for value 32c + e, for the formats that store them
    /// bit by bit (IQ2_S, IQ3_S): SIMD kernels spread them over bytes in vector registers,
    /// where [`SignedGridBlock::piece_ones`] looks each byte's eight up. `None` for the
    /// formats of 7-bit sign indices.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    fn sign_bits(&self, _c: usize) -> Option<u32> {
        None
    }
    /// Values 32c..32c+32 of the IQ1 formats: the four grid entries (bytes -1, 0 or 1), and
    /// bit `4l + 3` set where entry `l`'s 1/8 shift is negative (as IQ1_M stores them), which
    /// SIMD kernels turn into `8 * grid ± 1` in registers. `None` for the other formats.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    fn shifted_entries(&self, _c: usize) -> Option<([u64; 4], u16)> {
        None
    }
}

/// The codebooks of the IQ1, IQ2 and IQ3 formats (ggml's `iq*_grid`, by those names upper
/// case) as 32-bit words, as GPU kernels read them: each entry's values are its bytes, first
/// value lowest, and an entry of 8 values is two words, low first.
pub fn codebook_words() -> [(&'static str, Vec<u32>); 6] {
    let eights = |grid: &[u64]| {
        let words = grid.iter().flat_map(|&e| [e as u32, (e >> 32) as u32]);
        words.collect()
    };
    [
        ("IQ2XXS_GRID", eights(&IQ2XXS_GRID)),
        ("IQ2XS_GRID", eights(&IQ2XS_GRID)),
        ("IQ2S_GRID", eights(&IQ2S_GRID)),
        ("IQ3XXS_GRID", IQ3XXS_GRID.to_vec()),
        ("IQ3S_GRID", IQ3S_GRID.to_vec()),
        ("IQ1S_GRID", eights(&IQ1S_GRID)),
    ]
}

/// 1 in every byte.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const ONES: u64 = 0x0101_0101_0101_0101;

/// [`GridBlock::decode`] of a [`SignedGridBlock`].
#[inline]
fn decode_signed<B: SignedGridBlock>(b: &B, values: &mut [i8; QK_K]) -> [i32; 16] {
    for (k, out) in values.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let (magnitudes, signs) = b.piece(k);
        *out = signed(magnitudes, signs);
    }
    b.scales()
}

block! {
    /// 8 groups of 32: bytes 8g..8g+4 of `qs` index [`IQ2XXS_GRID`] for 8 values each; the u32
    /// at 8g+4 holds four 7-bit sign indices ([`KSIGNS`]) and, in its top 4 bits, the scale
    /// `s`: weights `d * (2s + 1) / 8 * grid * sign`.
    BlockIq2Xxs = IQ2_XXS { d: [u8; 2], qs: [u8; 64] }
}
block! {
    /// 16 groups of 16: u16 `k` of `qs` holds a 9-bit index into [`IQ2XS_GRID`] (8 values) and
    /// a 7-bit sign index; group g's scale `s` is nibble g of `scales` (low first):
    /// `d * (2s + 1) / 8 * grid * sign`.
    BlockIq2Xs = IQ2_XS { d: [u8; 2], qs: [u8; 64], scales: [u8; 8] }
}
block! {
    /// 16 groups of 16: entry k of [`IQ2S_GRID`] (8 values) is `qs[k]` with bits 2(k%4)..+2 of
    /// `qh[k / 4]` above it; `signs[k]` gives the 8 values' signs bit by bit; scales as IQ2_XS.
    BlockIq2S = IQ2_S { d: [u8; 2], qs: [u8; 32], signs: [u8; 32], qh: [u8; 8], scales: [u8; 8] }
}
block! {
    /// 8 groups of 32: `qs[k]` indexes [`IQ3XXS_GRID`] (4 values); the u32 `signs_scales[g]`
    /// holds four 7-bit sign indices and the scale `s` in its top 4 bits:
    /// `d * (2s + 1) / 4 * grid * sign`.
    BlockIq3Xxs = IQ3_XXS { d: [u8; 2], qs: [u8; 64], signs_scales: [u8; 32] }
}
block! {
    /// 8 groups of 32: entry k of [`IQ3S_GRID`] (4 values) is `qs[k]` with bit k%8 of
    /// `qh[k / 8]` as its ninth bit; bit e%8 of `signs[e / 8]` is element e's sign; group g's
    /// scale `s` is nibble g of `scales`: `d * (2s + 1) * grid * sign`.
    BlockIq3S = IQ3_S { d: [u8; 2], qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4] }
}
block! {
    /// 8 groups of 32: u16 `qh[g]` holds four 3-bit high parts of the [`IQ1S_GRID`] indices
    /// (low parts in `qs`), the scale `s` in bits 12..15 and the sign of the group's shift in
    /// bit 15: `d * (2s + 1) * (grid ± 1/8)`.
    BlockIq1S = IQ1_S { d: [u8; 2], qs: [u8; 32], qh: [u8; 16] }
}
block! {
    /// 16 groups of 16: nibble k of `qh` holds index k's high 3 bits and the sign of its
    /// shift; the four u16 of `scales` hold 3-bit group scales in bits 0..12 and, in their top
    /// nibbles, the f16 block scale: `d * (2s + 1) * (grid ± 1/8)`.
    BlockIq1M = IQ1_M { qs: [u8; 32], qh: [u8; 16], scales: [u8; 8] }
}
block! {
    /// 256 ternary weights `d * (t - 1)`: bytes hold five (`qs`) or four (`qh`) base-3 digits
    /// as a fixed-point fraction of 3^5, digit n read as `(byte * 3^n mod 256) * 3 >> 8`.
    BlockTq1_0 = TQ1_0 { qs: [u8; 48], qh: [u8; 4], d: [u8; 2] }
}
block! {
    /// 256 ternary weights `d * (t - 1)`, t in 0..3: byte 32h + m holds element 128h + 32l + m
    /// at bits 2l..2l+2.
    BlockTq2_0 = TQ2_0 { qs: [u8; 64], d: [u8; 2] }
}

/// The 128 sign patterns of the IQ2/IQ3 formats (`ksigns_iq2xs`): seven explicit signs and
/// an eighth that makes their count even.
pub(crate) static KSIGNS: [u8; 128] = {
    let mut table = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        table[i] = i as u8 | (((i as u8).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    table
};

/// [`KSIGNS`] as [`SignedGridBlock::piece_ones`] gives them: per sign index, bytewise -1
/// where the sign is set and 1 elsewhere (one load where `KSIGNS` then [`SIGN_MASKS`] are two).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static KSIGN_ONES: [u64; 128] = {
    let mut table = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let signs = i | (((i as u32).count_ones() as usize & 1) << 7);
        let mut j = 0;
        while j < 8 {
            table[i] |= if signs & (1 << j) != 0 { 0xff } else { 0x01 } << (8 * j);
            j += 1;
        }
        i += 1;
    }
    table
};

/// For each sign byte, `0xff` in the bytes whose bit is set.
pub(crate) static SIGN_MASKS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if i & (1 << j) != 0 {
                table[i] |= 0xff << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    table
};

/// The 8 codebook values of `entry` with the signs of the bits of `signs`: bytewise
/// `(v ^ m) + (m & 1)` negates where the mask `m` is `0xff`, without carries as every value is
/// at least 1.
#[inline]
fn signed(entry: u64, signs: u8) -> [i8; 8] {
    let mask = SIGN_MASKS[usize::from(signs)];
    let v = (entry ^ mask).wrapping_add(mask & 0x0101_0101_0101_0101);
    v.to_le_bytes().map(|b| b as i8)
}

#[inline(always)]
fn u16_at(bytes: &[u8], k: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]])
}

/// The `k`th u64 of `bytes`, read whole ([`u32_at`]).
#[inline(always)]
fn u64_at(bytes: &[u8], k: usize) -> u64 {
    let word: &[u8; 8] = bytes[8 * k..8 * k + 8].try_into().unwrap();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; the load reads the 8 bytes of `word`.
    return unsafe {
        use std::arch::x86_64::{_mm_cvtsi128_si64, _mm_loadl_epi64};
        _mm_cvtsi128_si64(_mm_loadl_epi64(word.as_ptr().cast())) as u64
    };
    #[cfg(not(target_arch = "x86_64"))]
    u64::from_le_bytes(*word)
}

/// The `k`th u32 of `bytes`, read whole: a word read as bytes, whose bit fields a kernel
/// takes several of, the compiler read again byte by byte for each field and put together
/// (a dozen more instructions for IQ3_XXS's four 7-bit sign indices, its one-token product
/// 1.1 times as slow); through a vector register on x86 it stays one load.
#[inline(always)]
fn u32_at(bytes: &[u8], k: usize) -> u32 {
    let word: &[u8; 4] = bytes[4 * k..4 * k + 4].try_into().unwrap();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; the load reads the 4 bytes of `word`.
    return unsafe {
        use std::arch::x86_64::{_mm_cvtsi128_si32, _mm_loadu_si32};
        _mm_cvtsi128_si32(_mm_loadu_si32(word.as_ptr().cast())) as u32
    };
    #[cfg(not(target_arch = "x86_64"))]
    u32::from_le_bytes(*word)
}

/// Odd scales `2s + 1` of the two nibbles of `byte`, low first.
#[inline(always)]
fn nibble_pair(byte: u8) -> (i32, i32) {
    (2 * i32::from(byte & 0xf) + 1, 2 * i32::from(byte >> 4) + 1)
}

/// The odd scale `2s + 1` of a group of 32 whose `s` is the top 4 bits of `word`.
#[inline(always)]
fn top_nibble_scale(word: u32) -> (i32, i32) {
    let scale = 2 * (word >> 28) as i32 + 1;
    (scale, scale)
}

/// The GridBlock items of a SignedGridBlock.
macro_rules! signed_grid_block {
    ($block:ident, $unit:expr) => {
        impl GridBlock for $block {
            const UNIT: f32 = $unit;
            #[inline(always)]
            fn d_bits(&self) -> [u8; 2] {
                self.d
            }
            fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16] {
                decode_signed(self, values)
            }
        }
    };
}

/// `piece` and `piece_ones` of a format whose values 8k..8k+8 are a codebook entry and a 7-bit
/// sign index (its inherent `entry(k)`): IQ2_XXS, IQ2_XS, IQ3_XXS.
macro_rules! sign_indexed_pieces {
    () => {
        #[inline(always)]
        fn piece(&self, k: usize) -> (u64, u8) {
            let (magnitudes, signs) = self.entry(k);
            (magnitudes, KSIGNS[signs])
        }
        #[inline(always)]
        fn piece_ones(&self, k: usize) -> (u64, u64) {
            let (magnitudes, signs) = self.entry(k);
            (magnitudes, KSIGN_ONES[signs])
        }
    };
}

signed_grid_block!(BlockIq2Xxs, 0.125);
signed_grid_block!(BlockIq2Xs, 0.125);
signed_grid_block!(BlockIq2S, 0.125);
signed_grid_block!(BlockIq3Xxs, 0.25);
signed_grid_block!(BlockIq3S, 1.0);

impl BlockIq2Xxs {
    /// Values 8k..8k+8: their codebook entry and their sign index.
    #[inline(always)]
    fn entry(&self, k: usize) -> (u64, usize) {
        // Group g's 8 bytes in one load: 4 codebook indices, then the 4 sign indices (7 bits
        // each) and the scale.
        let (g, l) = (k / 4, k % 4);
        let group = u64_at(&self.qs, g);
        let signs = ((group >> (32 + 7 * l)) & 127) as usize;
        (IQ2XXS_GRID[usize::from((group >> (8 * l)) as u8)], signs)
    }
}

impl SignedGridBlock for BlockIq2Xxs {
    sign_indexed_pieces!();
    #[inline(always)]
    fn chunk_scales(&self, c: usize) -> (i32, i32) {
        // The second u32 of the chunk's 8 bytes.
        top_nibble_scale(u32_at(&self.qs, 2 * c + 1))
    }
}

impl BlockIq2Xs {
    /// Values 8k..8k+8: their codebook entry and their sign index.
    #[inline(always)]
    fn entry(&self, k: usize) -> (u64, usize) {
        // A piece's u16 taken from the u64 of its chunk's four: read u16 by u16, the compiler
        // gathered a chunk's eight into a vector and took each back out (two instructions
        // each).
        let q = (u64_at(&self.qs, k / 4) >> (16 * (k % 4))) as u16;
        (IQ2XS_GRID[usize::from(q & 511)], usize::from(q >> 9))
    }
}

impl SignedGridBlock for BlockIq2Xs {
    sign_indexed_pieces!();
    #[inline(always)]
    fn chunk_scales(&self, c: usize) -> (i32, i32) {
        nibble_pair(self.scales[c])
    }
}

impl SignedGridBlock for BlockIq2S {
    #[inline(always)]
    fn piece(&self, k: usize) -> (u64, u8) {
        let high = usize::from((self.qh[k / 4] >> (2 * (k % 4))) & 3) << 8;
        (IQ2S_GRID[usize::from(self.qs[k]) | high], self.signs[k])
    }
    #[inline(always)]
    fn chunk_scales(&self, c: usize) -> (i32, i32) {
        nibble_pair(self.scales[c])
    }
    #[inline(always)]
    fn sign_bits(&self, c: usize) -> Option<u32> {
        Some(u32_at(&self.signs, c))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn entries_pdep(&self, c: usize) -> Option<[u64; 4]> {
        use std::arch::x86_64::_pdep_u64;
        // Index l in u16 l: byte l of the chunk's u32 of `qs` below bits 2l..2l + 2 of its
        // byte of `qh`.
        let low = u64::from(u32_at(&self.qs, c));
        let indices = _pdep_u64(low, 0x00ff_00ff_00ff_00ff)
            | _pdep_u64(u64::from(self.qh[c]), 0x0300_0300_0300_0300);
        let mut entries = [0; 4];
        for (l, entry) in entries.iter_mut().enumerate() {
            *entry = IQ2S_GRID[((indices >> (16 * l)) & 0x3ff) as usize];
        }
        Some(entries)
    }
}

impl BlockIq3Xxs {
    /// Values 8k..8k+8: their two codebook entries and their sign index.
    #[inline(always)]
    fn entry(&self, k: usize) -> (u64, usize) {
        let (g, l) = (k / 4, k % 4);
        let aux = u32_at(&self.signs_scales, g);
        (
            u64::from(self.quad(2 * k)) | (u64::from(self.quad(2 * k + 1)) << 32),
            ((aux >> (7 * l)) & 127) as usize,
        )
    }

    /// Values 4j..4j+4: their codebook entry.
    #[inline(always)]
    fn quad(&self, j: usize) -> u32 {
        IQ3XXS_GRID[usize::from(self.qs[j])]
    }
}

impl SignedGridBlock for BlockIq3Xxs {
    sign_indexed_pieces!();
    const CHUNK_SCALES_ALONE: bool = true;
    #[inline(always)]
    fn chunk_scales(&self, c: usize) -> (i32, i32) {
        top_nibble_scale(u32_at(&self.signs_scales, c))
    }
    #[inline(always)]
    fn quads(&self, c: usize) -> Option<[u32; 8]> {
        let mut quads = [0; 8];
        for (i, quad) in quads.iter_mut().enumerate() {
            *quad = self.quad(8 * c + i);
        }
        Some(quads)
    }
}

impl BlockIq3S {
    /// Values 4j..4j+4: their codebook entry.
    #[inline(always)]
    fn quad(&self, j: usize) -> u32 {
        let high = usize::from((self.qh[j / 8] >> (j % 8)) & 1) << 8;
        IQ3S_GRID[usize::from(self.qs[j]) | high]
    }
}

impl SignedGridBlock for BlockIq3S {
    #[inline(always)]
    fn piece(&self, k: usize) -> (u64, u8) {
        let magnitudes = u64::from(self.quad(2 * k)) | (u64::from(self.quad(2 * k + 1)) << 32);
        (magnitudes, self.signs[k])
    }
    #[inline(always)]
    fn chunk_scales(&self, c: usize) -> (i32, i32) {
        let (low, high) = nibble_pair(self.scales[c / 2]);
        let scale = if c.is_multiple_of(2) { low } else { high };
        (scale, scale)
    }
    #[inline(always)]
    fn sign_bits(&self, c: usize) -> Option<u32> {
        Some(u32_at(&self.signs, c))
    }
    #[inline(always)]
    fn quads(&self, c: usize) -> Option<[u32; 8]> {
        // The chunk's 8 low index bytes and their 8 ninth bits (byte `c` of `qh`) in
        // registers: index by index, the compiler put the bits together in a vector and took
        // each index back out (two instructions each).
        let (low, high) = (u64_at(&self.qs, c), u64::from(self.qh[c]));
        let mut quads = [0; 8];
        for (i, quad) in quads.iter_mut().enumerate() {
            let index = ((low >> (8 * i)) & 0xff) | (((high >> i) & 1) << 8);
            *quad = IQ3S_GRID[index as usize];
        }
        Some(quads)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quads_pdep(&self, c: usize) -> Option<[u32; 8]> {
        use std::arch::x86_64::_pdep_u64;
        // Indices 4h..4h + 4 in the u16s of `halves[h]`: four low bytes, four ninth bits.
        let (low, high) = (u64_at(&self.qs, c), u64::from(self.qh[c]));
        let bytes = 0x00ff_00ff_00ff_00ff;
        let ninths = 0x0100_0100_0100_0100;
        let halves = [
            _pdep_u64(low, bytes) | _pdep_u64(high, ninths),
            _pdep_u64(low >> 32, bytes) | _pdep_u64(high >> 4, ninths),
        ];
        let mut quads = [0; 8];
        for (i, quad) in quads.iter_mut().enumerate() {
            *quad = IQ3S_GRID[((halves[i / 4] >> (16 * (i % 4))) & 0x1ff) as usize];
        }
        Some(quads)
    }
}

/// IQ1 values `8 * grid ± 1` (the grid in units of the 1/8 shift) of the 8 entries' bytes.
#[inline]
fn shifted(entry: u64, negative_shift: bool) -> [i8; 8] {
    let shift = if negative_shift { -1 } else { 1 };
    entry.to_le_bytes().map(|b| 8 * (b as i8) + shift)
}

/// The magnitudes (bytes) and sign bits of 8 nonzero values, as [`SignedGridBlock::piece`]
/// gives them.
#[inline(always)]
fn magnitudes_and_signs(values: [i8; 8]) -> (u64, u8) {
    let mut signs = 0;
    for (j, &v) in values.iter().enumerate() {
        signs |= u8::from(v < 0) << j;
    }
    (u64::from_le_bytes(values.map(i8::unsigned_abs)), signs)
}

/// An IQ1 format: values 8k..8k+8 are `8 * grid ± 1` of one [`IQ1S_GRID`] entry and the sign
/// of its shift; the format gives the bits between its entries' top index bits in a chunk's
/// u16 of `qh` (`HIGH_STRIDE`), the signs of a chunk's shifts (`negative_shifts(c)`) and a
/// scale per group of 16 (`group_scale(g)`).
macro_rules! shifted_grid_block {
    ($block:ident) => {
        impl GridBlock for $block {
            const UNIT: f32 = 0.125;
            #[inline(always)]
            fn d_bits(&self) -> [u8; 2] {
                self.d_bits_of()
            }
            fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16] {
                decode_signed(self, values)
            }
        }

        impl SignedGridBlock for $block {
            #[inline(always)]
            fn piece(&self, k: usize) -> (u64, u8) {
                let (c, l) = (k / 4, k % 4);
                let index = Self::entry_index(u32_at(&self.qs, c), u16_at(&self.qh, c), l);
                let negative = self.negative_shifts(c) & (8 << (4 * l)) != 0;
                magnitudes_and_signs(shifted(IQ1S_GRID[index], negative))
            }
            #[inline(always)]
            fn chunk_scales(&self, c: usize) -> (i32, i32) {
                (self.group_scale(2 * c), self.group_scale(2 * c + 1))
            }
            #[inline(always)]
            fn shifted_entries(&self, c: usize) -> Option<([u64; 4], u16)> {
                // The chunk's four low index bytes and its u16 of `qh` in registers.
                let (low, high) = (u32_at(&self.qs, c), u16_at(&self.qh, c));
                let mut entries = [0; 4];
                for (l, entry) in entries.iter_mut().enumerate() {
                    *entry = IQ1S_GRID[Self::entry_index(low, high, l)];
                }
                Some((entries, self.negative_shifts(c)))
            }
        }

        impl $block {
            /// The grid index of entry `l` of a chunk: byte `l` of the chunk's u32 of `qs`,
            /// with its top three bits from bits `HIGH_STRIDE * l..` of its u16 of `qh`.
            #[inline(always)]
            fn entry_index(low: u32, high: u16, l: usize) -> usize {
                let top = (u32::from(high) >> (Self::HIGH_STRIDE * l)) & 7;
                (((low >> (8 * l)) & 0xff) | (top << 8)) as usize
            }
        }
    };
}

shifted_grid_block!(BlockIq1S);
shifted_grid_block!(BlockIq1M);

impl BlockIq1S {
    /// Bits of a chunk's u16 of `qh` between its entries' top index bits.
    const HIGH_STRIDE: usize = 3;
    fn d_bits_of(&self) -> [u8; 2] {
        self.d
    }
    /// Bit `4l + 3` set where entry `4c + l`'s shift is negative: one bit for the chunk.
    #[inline(always)]
    fn negative_shifts(&self, c: usize) -> u16 {
        match u16_at(&self.qh, c) & 0x8000 {
            0 => 0,
            _ => 0x8888,
        }
    }
    /// The scale `2s + 1` of group `g` of 16 (one per 32 values).
    #[inline(always)]
    fn group_scale(&self, g: usize) -> i32 {
        2 * i32::from((u16_at(&self.qh, g / 2) >> 12) & 7) + 1
    }
}

impl BlockIq1M {
    /// Bits of a chunk's u16 of `qh` between its entries' top index bits.
    const HIGH_STRIDE: usize = 4;
    fn d_bits_of(&self) -> [u8; 2] {
        let sc: [u16; 4] = std::array::from_fn(|k| u16_at(&self.scales, k));
        let bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        bits.to_le_bytes()
    }
    /// Bit `4l + 3` set where entry `4c + l`'s shift is negative: the top bits of the
    /// entries' nibbles of `qh`, where they are.
    #[inline(always)]
    fn negative_shifts(&self, c: usize) -> u16 {
        u16_at(&self.qh, c) & 0x8888
    }
    /// The scale `2s + 1` of group `g` of 16.
    #[inline(always)]
    fn group_scale(&self, g: usize) -> i32 {
        let sc = u16_at(&self.scales, g / 4);
        2 * i32::from((sc >> (3 * (g % 4))) & 7) + 1
    }
}

impl GridBlock for BlockTq1_0 {
    const UNIT: f32 = 1.0;
    #[inline(always)]
    fn d_bits(&self) -> [u8; 2] {
        self.d
    }
    fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16] {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        let digit =
            |byte: u8, n: usize| (((u16::from(byte.wrapping_mul(POW3[n])) * 3) >> 8) as i8) - 1;
        let mut e = 0;
        for (bytes, digits) in [(&self.qs[..32], 5), (&self.qs[32..], 5), (&self.qh[..], 4)] {
            for n in 0..digits {
                for &byte in bytes {
                    values[e] = digit(byte, n);
                    e += 1;
                }
            }
        }
        [1; 16]
    }
}

impl GridBlock for BlockTq2_0 {
    const UNIT: f32 = 1.0;
    #[inline(always)]
    fn d_bits(&self) -> [u8; 2] {
        self.d
    }
    fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16] {
        for (e, v) in values.iter_mut().enumerate() {
            let (half, l, m) = (e / 128, (e / 32) % 4, e % 32);
            *v = ((self.qs[32 * half + m] >> (2 * l)) & 3) as i8 - 1;
        }
        [1; 16]
    }
}

/// Q3_K decodes as a grid block too: its quants `q - 4 * !hbit` (-4..=3) times its signed 6-bit
/// group scales, so that its products of many tokens take the grid formats' decoded rows.
impl GridBlock for super::BlockQ3K {
    const UNIT: f32 = 1.0;
    #[inline(always)]
    fn d_bits(&self) -> [u8; 2] {
        self.d
    }
    fn decode(&self, values: &mut [i8; QK_K]) -> [i32; 16] {
        *values = crate::reference::decode::q3k(self);
        super::q3k_scales(&self.scales).map(i32::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::as_blocks;
    use crate::testing::{random_blocks, Rng};
    use crate::GgmlType;

    /// A chunk's scales, 4-value entries and sign bits, read alone, are what the whole
    /// block's scales and pieces say.
    fn check_chunk_accessors<B: SignedGridBlock>(ty: GgmlType) {
        let bytes = random_blocks(&mut Rng::new(0xc4c5 + u64::from(ty.id())), ty, 64);
        for block in as_blocks::<B>(&bytes) {
            let scales = block.scales();
            for c in 0..8 {
                let (low, high) = block.chunk_scales(c);
                assert_eq!(
                    (low, high),
                    (scales[2 * c], scales[2 * c + 1]),
                    "{ty} chunk {c}"
                );
                let pieces: Vec<(u64, u8)> = (4 * c..4 * c + 4).map(|k| block.piece(k)).collect();
                if let Some(quads) = block.quads(c) {
                    for (k, &(magnitudes, _)) in pieces.iter().enumerate() {
                        let pair = u64::from(quads[2 * k]) | (u64::from(quads[2 * k + 1]) << 32);
                        assert_eq!(pair, magnitudes, "{ty} chunk {c} piece {k}");
                    }
                }
                if let Some((entries, negative)) = block.shifted_entries(c) {
                    for (k, &piece) in pieces.iter().enumerate() {
                        let values = shifted(entries[k], negative & (8 << (4 * k)) != 0);
                        assert_eq!(
                            piece,
                            magnitudes_and_signs(values),
                            "{ty} chunk {c} piece {k}"
                        );
                    }
                }
                if let Some(bits) = block.sign_bits(c) {
                    let signs = pieces.iter().map(|&(_, s)| s).collect::<Vec<_>>();
                    assert_eq!(bits.to_le_bytes().to_vec(), signs, "{ty} chunk {c}");
                }
            }
        }
    }

    #[test]
    fn chunk_accessors_agree_with_the_block_s_scales_and_pieces() {
        check_chunk_accessors::<BlockIq2Xxs>(GgmlType::IQ2_XXS);
        check_chunk_accessors::<BlockIq2Xs>(GgmlType::IQ2_XS);
        check_chunk_accessors::<BlockIq2S>(GgmlType::IQ2_S);
        check_chunk_accessors::<BlockIq3Xxs>(GgmlType::IQ3_XXS);
        check_chunk_accessors::<BlockIq3S>(GgmlType::IQ3_S);
        check_chunk_accessors::<BlockIq1S>(GgmlType::IQ1_S);
        check_chunk_accessors::<BlockIq1M>(GgmlType::IQ1_M);
    }

    #[test]
    fn ksign_ones_are_the_masks_of_the_sign_patterns() {
        for (i, &ones) in KSIGN_ONES.iter().enumerate() {
            let signs = KSIGNS[i];
            assert_eq!(signs.count_ones() % 2, 0, "{i}");
            assert_eq!(ones, SIGN_MASKS[usize::from(signs)] | ONES, "{i}");
        }
    }
}
