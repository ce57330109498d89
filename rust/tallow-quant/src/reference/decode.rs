//! Unpacking of weight blocks into their integer quants, shared by the reference dequantizer
//! and the reference dot products.

use crate::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, QK_K};

/// The 32 nibbles of a Q4_0/Q4_1 block in element order (0..16).
#[inline]
pub(crate) fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = byte & 0xf;
        q[j + 16] = byte >> 4;
    }
    q
}

/// The 32 values of a block of nibbles that index `values` (IQ4_NL, MXFP4, a group of
/// IQ4_XS), in element order.
#[inline]
pub(crate) fn looked_up(qs: &[u8; 16], values: &[i8; 16]) -> [i8; 32] {
    nibbles(qs).map(|q| values[usize::from(q)])
}

/// The 32 five-bit quants of a Q5_0/Q5_1 block in element order (0..32).
#[inline]
pub(crate) fn five_bits(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let high = u32::from_le_bytes(qh);
    let mut q = nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((high >> j) & 1) as u8) << 4;
    }
    q
}

/// The 256 two-bit quants of a Q2_K block (0..4).
pub(crate) fn q2k(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (half, shift, l) = (e / 128, (e / 32) % 4, e % 32);
        *v = (b.qs[32 * half + l] >> (2 * shift)) & 3;
    }
    q
}

/// The 256 three-bit quants of a Q3_K block, offset applied (-4..4).
pub(crate) fn q3k(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (half, shift, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((b.qs[32 * half + l] >> (2 * shift)) & 3) as i8;
        let high_set = (b.hmask[l] >> (e / 32)) & 1 == 1;
        *v = if high_set { low } else { low - 4 };
    }
    q
}

/// The 256 four-bit quants of a Q4_K block (0..16).
pub(crate) fn q4k(b: &BlockQ4K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (group, l) = (e / 32, e % 32);
        *v = (b.qs[32 * (group / 2) + l] >> (4 * (group % 2))) & 0xf;
    }
    q
}

/// The 256 five-bit quants of a Q5_K block (0..32).
pub(crate) fn q5k(b: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (group, l) = (e / 32, e % 32);
        let low = (b.qs[32 * (group / 2) + l] >> (4 * (group % 2))) & 0xf;
        let high = (b.qh[l] >> group) & 1;
        *v = low | (high << 4);
    }
    q
}

/// The 256 six-bit quants of a Q6_K block, offset applied (-32..32).
pub(crate) fn q6k(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (half, k, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (b.ql[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xf;
        let high = (b.qh[32 * half + l] >> (2 * k)) & 3;
        *v = (low | (high << 4)) as i8 - 32;
    }
    q
}
