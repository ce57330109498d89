//! The GGML block layouts (ggml-common.h), as plain byte structs.
//!
//! Every block is a `repr(C)` struct of byte arrays: alignment 1, no padding, and any bit
//! pattern valid. That lets a `&[u8]` straight from a memory-mapped file be viewed as a slice
//! of blocks without copying and without alignment requirements. Multi-byte fields (f16, f32,
//! i16) are stored little-endian, as in GGUF files.

/// Elements in a K-quant super-block (`QK_K`).
pub(crate) const QK_K: usize = 256;

/// A block type laid out as ggml lays it out.
///
/// # Safety
/// Implementors must be `repr(C)` structs made only of `u8`/`i8` arrays, so that any byte
/// sequence of their size is a valid value.
pub(crate) unsafe trait Block: Sized {}

/// Views the whole blocks at the start of `bytes` as blocks; a trailing partial block is left
/// out (callers validate lengths before they get here).
#[inline]
pub(crate) fn as_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    let n = bytes.len() / size_of::<B>();
    // SAFETY: `B` has alignment 1, accepts any bit pattern (trait contract), and the first
    // `n * size_of::<B>()` bytes lie inside `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n) }
}

/// Mutable counterpart of [`as_blocks`].
#[inline]
pub(crate) fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let n = bytes.len() / size_of::<B>();
    // SAFETY: as in `as_blocks`; the borrow of `bytes` is exclusive and carried over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

macro_rules! block {
    ($(#[$doc:meta])* $name:ident = $ty:ident { $($field:ident: $fty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name {
            $(pub $field: $fty),*
        }

        // SAFETY: a repr(C) struct of byte arrays; the size is checked right here.
        unsafe impl Block for $name {}

        const _: () = assert!(
            size_of::<$name>() == crate::GgmlType::$ty.block_bytes() && align_of::<$name>() == 1
        );
    };
}

mod grid;
mod grids;

pub use grid::codebook_words;
pub(crate) use grid::*;
// The one codebook a kernel reads itself (IQ2_XS's, four chunks at a time).
#[cfg(target_arch = "x86_64")]
pub(crate) use grids::{IQ1S_GRID, IQ2XS_GRID};

block! {
    /// 32 weights `d * (q - 8)`, q in 0..16. Byte j holds element j (low nibble) and j+16.
    BlockQ4_0 = Q4_0 { d: [u8; 2], qs: [u8; 16] }
}
block! {
    /// 32 weights `d * q + m`, q in 0..16, nibbles as in Q4_0.
    BlockQ4_1 = Q4_1 { d: [u8; 2], m: [u8; 2], qs: [u8; 16] }
}
block! {
    /// 32 weights `d * (q - 16)`, q in 0..32: low 4 bits as in Q4_0, bit 4 of element j is
    /// bit j of `qh`.
    BlockQ5_0 = Q5_0 { d: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
}
block! {
    /// 32 weights `d * q + m`, q in 0..32, bits as in Q5_0.
    BlockQ5_1 = Q5_1 { d: [u8; 2], m: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
}
block! {
    /// 32 values `d * q`.
    BlockQ8_0 = Q8_0 { d: [u8; 2], qs: [i8; 32] }
}
block! {
    /// 32 activations `d * q`; `s` is `d * sum(q)`, which folds the offset of Q4_1/Q5_1
    /// weights into one multiply per block.
    BlockQ8_1 = Q8_1 { d: [u8; 2], s: [u8; 2], qs: [i8; 32] }
}
block! {
    /// 256 weights in 16 groups of 16: `d * sc * q - dmin * m`, q in 0..4, with the 4-bit
    /// `sc` (low nibble) and `m` (high nibble) of `scales[group]`. Byte l of the 32-byte half
    /// h holds elements 128h + 32j + l at bits 2j..2j+2.
    BlockQ2K = Q2_K { scales: [u8; 16], qs: [u8; 64], d: [u8; 2], dmin: [u8; 2] }
}
block! {
    /// 256 weights in 16 groups of 16: `d * (sc - 32) * (q - 4 * !hbit)`, q in 0..4 packed as
    /// in Q2_K; the high bit of element e is bit e / 32 of `hmask[e % 32]`; the 6-bit scales
    /// are packed in 12 bytes (see [`q3k_scales`]).
    BlockQ3K = Q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: [u8; 2] }
}
block! {
    /// 256 weights in 8 groups of 32: `d * sc * q - dmin * m`, q in 0..16, with 6-bit `sc`
    /// and `m` packed in 12 bytes (see [`k4_scales_mins`]). Bytes 32j..32j+32 hold group 2j in
    /// their low nibbles and group 2j+1 in their high nibbles.
    BlockQ4K = Q4_K { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qs: [u8; 128] }
}
block! {
    /// As Q4_K with a fifth bit: bit g of `qh[l]` is the high bit of element l of group g.
    BlockQ5K = Q5_K { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
}
block! {
    /// 256 weights in 16 groups of 16: `d * sc * (q - 32)`, q in 0..64. In half h (128
    /// elements), element 32k + l takes its low 4 bits from `ql[64h + l + 32(k & 1)]` (low
    /// nibble for k < 2, high for k >= 2) and its top 2 bits from bits 2k..2k+2 of
    /// `qh[32h + l]`.
    BlockQ6K = Q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: [u8; 2] }
}
block! {
    /// 256 activations `d * q` (d is an f32); `bsums[g]` is the sum of the 16 quants of group
    /// g, which K-quant kernels use to apply per-group offsets without touching the quants.
    BlockQ8K = Q8_K { d: [u8; 4], qs: [i8; 256], bsums: [u8; 32] }
}

block! {
    /// 32 weights `d * IQ4_VALUES[q]`, nibbles as in Q4_0.
    BlockIq4Nl = IQ4_NL { d: [u8; 2], qs: [u8; 16] }
}
block! {
    /// 256 weights in 8 groups of 32: `d * (ls - 32) * IQ4_VALUES[q]`, the 6-bit `ls` of group
    /// g taking its low 4 bits from `scales_l[g / 2]` (low nibble for even g) and its top 2
    /// bits from bits 2g..2g+2 of `scales_h`; each group's 16 bytes of `qs` hold its nibbles
    /// as in Q4_0.
    BlockIq4Xs = IQ4_XS { d: [u8; 2], scales_h: [u8; 2], scales_l: [u8; 4], qs: [u8; 128] }
}
block! {
    /// 32 weights `2^(e - 128) * MXFP4_VALUES[q]` (OCP MX FP4: an E8M0 shared exponent and
    /// E2M1 elements, here doubled to integers), nibbles as in Q4_0.
    BlockMxfp4 = MXFP4 { e: [u8; 1], qs: [u8; 16] }
}

/// The 16 values of IQ4_NL and IQ4_XS quants (`kvalues_iq4nl`).
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 16 E2M1 values of MXFP4 quants, times 2 (`kvalues_mxfp4`).
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: half of an E8M0 scale, as MXFP4's doubled values want it (exact, the two
/// smallest as subnormals).
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = match e {
        0 | 1 => 0x0020_0000 << e,
        _ => u32::from(e - 1) << 23,
    };
    f32::from_bits(bits)
}

/// A block of 32 weights `scale * VALUES[q]`, its nibbles `qs` as in Q4_0 (IQ4_NL, MXFP4).
pub(crate) trait LookupBlock: Block {
    /// The 16 values the nibbles index.
    const VALUES: [i8; 16];
    fn qs(&self) -> &[u8; 16];
    fn scale(&self) -> f32;
}

impl LookupBlock for BlockIq4Nl {
    const VALUES: [i8; 16] = IQ4_VALUES;
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    fn scale(&self) -> f32 {
        crate::fp16::f16_to_f32(self.d)
    }
}

impl LookupBlock for BlockMxfp4 {
    const VALUES: [i8; 16] = MXFP4_VALUES;
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    fn scale(&self) -> f32 {
        e8m0_half(self.e[0])
    }
}

impl BlockIq4Xs {
    /// The eight group scales, minus 32.
    #[inline]
    pub(crate) fn scales(&self) -> [i32; 8] {
        let high = u16::from_le_bytes(self.scales_h);
        std::array::from_fn(|g| {
            let low = (self.scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
            let top = ((high >> (2 * g)) & 3) as u8;
            i32::from(low | (top << 4)) - 32
        })
    }
}

impl BlockQ8K {
    #[inline]
    pub(crate) fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    #[inline]
    pub(crate) fn bsum(&self, group: usize) -> i32 {
        i32::from(i16::from_le_bytes([
            self.bsums[2 * group],
            self.bsums[2 * group + 1],
        ]))
    }

    /// `sum(weight(g) * bsum(g))` over the 16 groups of 16: how SIMD kernels apply per-group
    /// offsets (mins, the -32 of Q6_K) once per group instead of once per element.
    #[inline]
    pub(crate) fn weighted_bsums(&self, weight: impl Fn(usize) -> i32) -> i32 {
        (0..QK_K / 16).map(|g| weight(g) * self.bsum(g)).sum()
    }
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block (`get_scale_min_k4`):
/// bytes 0..4 hold scales 0..4 in their low 6 bits and the top 2 bits of scales 4..8; bytes
/// 4..8 do the same for the mins; bytes 8..12 hold the low 4 bits of scales 4..8 (low nibble)
/// and mins 4..8 (high nibble).
#[inline]
pub(crate) fn k4_scales_mins(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..4 {
        scales[j] = packed[j] & 63;
        mins[j] = packed[j + 4] & 63;
        scales[j + 4] = (packed[j + 8] & 0xf) | ((packed[j] >> 6) << 4);
        mins[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (scales, mins)
}

/// The sixteen signed scales (already minus 32) of a Q3_K block: group g takes its low 4 bits
/// from byte g % 8 (low nibble for g < 8, high nibble after) and its top 2 bits from bits
/// 2(g / 4)..2(g / 4)+2 of byte 8 + g % 4.
#[inline]
pub(crate) fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut scales = [0i8; 16];
    for (g, s) in scales.iter_mut().enumerate() {
        let low = (packed[g % 8] >> (4 * (g / 8))) & 0xf;
        let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    scales
}
