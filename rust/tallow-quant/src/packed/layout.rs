//! Where each byte of a GGUF block goes in a packed group of [`PACK_ROWS`] rows.
//!
//! A packed block holds, for the 16 rows of its group, the block's f16 fields (`d`, then `m`
//! or `dmin`: 32 bytes each, one f16 per row) and then its *words*: each run of four bytes of
//! the block that the kernels read together, 64 bytes per word (four per row, row `r` at
//! bytes `4r..4r + 4`). A word is the GGUF bytes unchanged, except where a [`Recode`] says
//! otherwise or the block's bytes are first regrouped ([`Regroup`]), so that a packed matrix
//! is exactly as large as the GGUF one and unpacking restores the block exactly.
//!
//! The words of each format, in packed order (the kernels index them by these numbers):
//!
//! | format | words |
//! |---|---|
//! | Q4_0, Q4_1 | 0..4: `qs` (word `c`: columns `4c..4c + 4` in the low nibbles, `16 + 4c..` in the high ones) |
//! | Q5_0 | 0..4: `qs` as Q4_0; 4: `qh`, [`Recode::Spread`] |
//! | Q8_0 | 0..8: `qs` as `q + 128` ([`Recode::Unsigned`]) |
//! | Q4_K | 0..3: `scales`; 3..35: `qs` (word `3 + 8p + c`: step `c` of sub-block `2p` in the low nibbles, of `2p + 1` in the high ones) |
//! | Q5_K | 0..3: `scales`; 3..11: `qh` (word `3 + c`: bit `s` of byte `i` is the fifth bit of column `4c + i` of sub-block `s`); 11..43: `qs` as Q4_K |
//! | Q2_K | 0..4: `scales`; 4..20: `qs` (word `4 + 8n + c`: step `c` of sub-blocks `4n..4n + 4`, two bits each) |
//! | Q3_K | [`Regroup::ThreeBits`]: 0..3: `scales`; 3..27: the 3-bit quants, three words per sub-block `s` (word `3 + 3s + k`) |
//! | Q6_K | [`Regroup::SixBits`]: 0..4: `scales`; 4..52: the 6-bit quants, three words per group `g` of 16 columns (word `4 + 3g + j`) |
//! | IQ4_NL | 0..4: `qs` as Q4_0 |
//! | IQ4_XS | 0: `scales_l`; 1..33: `qs` (word `1 + 4s + c`: as Q4_0's word `c` for sub-block `s`) |
//!
//! IQ4_XS's `scales_h` (two bytes a row) goes with the f16 fields, after `d`.
//!
//! A *step* is four consecutive columns of a row; sub-blocks are runs of 32 columns.

use super::PACK_ROWS;
use crate::GgmlType;

/// Bytes of the largest block with a layout (Q6_K's): room for one unpacked block.
pub(crate) const MAX_BLOCK_BYTES: usize = 210;

/// How a block's bytes are rearranged before its words are taken from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Regroup {
    /// Q6_K's quants, split in the GGUF block between 4 low bits (`ql`) and 2 high bits
    /// (`qh`), stored whole: the first 192 bytes become 16 groups of 12 bytes, one group per
    /// 16 columns, whose byte `4j + i` (`j < 3`) holds the 6-bit quant of the group's column
    /// `4j + i` in its low bits and bits `2j, 2j + 1` of column `12 + i`'s in its top two.
    /// A step of 4 columns is then one mask of a word (or, for the group's fourth step, three
    /// shifts and masks) instead of two words' bits put together. The scales and `d` stay
    /// where they are.
    SixBits,
    /// Q3_K's quants `q` (the value plus 4), split in the GGUF block between 2 low bits
    /// (`qs`) and a high bit (`hmask`), stored whole: the first 96 bytes become 8 groups of
    /// 12 bytes, one group per sub-block of 32 columns (8 steps of 4). Byte `i` of the
    /// group's word 0 holds steps 0 and 1's quants of column `i` (bits 0-2 and 3-5) and step
    /// 2's low two bits (6-7); word 1 the same of steps 3, 4 and 5; word 2 steps 6 and 7's
    /// quants and the high bits of steps 2 (bit 6) and 5 (bit 7). Six steps are then one or
    /// two masks of a word, the other two a few. The scales and `d` stay where they are.
    ThreeBits,
}

/// Bytes of a Q3_K block's quants (`hmask` and `qs`).
const Q3_QUANT_BYTES: usize = 96;

/// Where column `col`'s low 2 bits (byte, shift) and high bit (byte, shift) are in a GGUF
/// Q3_K block.
fn q3_bits(col: usize) -> ((usize, usize), (usize, usize)) {
    let (half, quarter, l) = (col / 128, col % 128 / 32, col % 32);
    ((32 + 32 * half + l, 2 * quarter), (l, 4 * half + quarter))
}

/// Column `col`'s 3-bit quant in a GGUF Q3_K block.
fn q3_quant(block: &[u8], col: usize) -> u8 {
    let ((lo, lo_shift), (hi, hi_shift)) = q3_bits(col);
    (block[lo] >> lo_shift) & 3 | ((block[hi] >> hi_shift) & 1) << 2
}

/// Column `col`'s 3-bit quant in a regrouped Q3_K block, as the kernels read it.
fn q3_regrouped_quant(regrouped: &[u8], col: usize) -> u8 {
    let (s, c, i) = (col / 32, col % 32 / 4, col % 4);
    let word = |k: usize| regrouped[12 * s + 4 * k + i];
    match c {
        0 | 3 | 6 => word(c / 3) & 7,
        1 | 4 | 7 => (word(c / 3) >> 3) & 7,
        _ => (word(c / 3) >> 6) | ((word(2) >> (6 + c / 3)) & 1) << 2,
    }
}

/// Bytes of a Q6_K block's quants (`ql` and `qh`).
const Q6_QUANT_BYTES: usize = 192;

/// Where column `col`'s low 4 bits (byte, shift) and top 2 bits (byte, shift) are in a GGUF
/// Q6_K block.
fn q6_bits(col: usize) -> ((usize, usize), (usize, usize)) {
    let (half, quarter, l) = (col / 128, col % 128 / 32, col % 32);
    (
        (64 * half + 32 * (quarter % 2) + l, 4 * (quarter / 2)),
        (128 + 32 * half + l, 2 * quarter),
    )
}

impl Regroup {
    /// Writes the GGUF block `block` regrouped to `out`.
    fn regroup(self, block: &[u8], out: &mut [u8]) {
        match self {
            Regroup::ThreeBits => {
                out.copy_from_slice(block);
                let groups = out[..Q3_QUANT_BYTES].chunks_exact_mut(12);
                for (s, group) in groups.enumerate() {
                    let q = |c: usize, i: usize| q3_quant(block, 32 * s + 4 * c + i);
                    for i in 0..4 {
                        group[i] = q(0, i) | q(1, i) << 3 | (q(2, i) & 3) << 6;
                        group[4 + i] = q(3, i) | q(4, i) << 3 | (q(5, i) & 3) << 6;
                        group[8 + i] =
                            q(6, i) | q(7, i) << 3 | (q(2, i) >> 2) << 6 | (q(5, i) >> 2) << 7;
                    }
                }
            }
            Regroup::SixBits => {
                out.copy_from_slice(block);
                let mut q = [0u8; 256];
                for (col, q) in q.iter_mut().enumerate() {
                    let ((lo, lo_shift), (hi, hi_shift)) = q6_bits(col);
                    *q = (block[lo] >> lo_shift) & 0xf | ((block[hi] >> hi_shift) & 3) << 4;
                }
                let quants = out[..Q6_QUANT_BYTES].chunks_exact_mut(12);
                for (group, out) in q.chunks_exact(16).zip(quants) {
                    for (k, out) in out.iter_mut().enumerate() {
                        let top = (group[12 + k % 4] >> (2 * (k / 4))) & 3;
                        *out = group[k] | top << 6;
                    }
                }
            }
        }
    }

    /// Writes the GGUF block that `regrouped` was regrouped from to `out`.
    fn restore(self, regrouped: &[u8], out: &mut [u8]) {
        match self {
            Regroup::ThreeBits => {
                out.copy_from_slice(regrouped);
                out[..Q3_QUANT_BYTES].fill(0);
                for col in 0..256 {
                    let q = q3_regrouped_quant(regrouped, col);
                    let ((lo, lo_shift), (hi, hi_shift)) = q3_bits(col);
                    out[lo] |= (q & 3) << lo_shift;
                    out[hi] |= (q >> 2) << hi_shift;
                }
            }
            Regroup::SixBits => {
                out.copy_from_slice(regrouped);
                out[..Q6_QUANT_BYTES].fill(0);
                for col in 0..256 {
                    let (g, k) = (col / 16, col % 16);
                    let q = if k < 12 {
                        regrouped[12 * g + k] & 0x3f
                    } else {
                        (0..3).fold(0, |q, j| {
                            q | (regrouped[12 * g + 4 * j + k - 12] >> 6) << (2 * j)
                        })
                    };
                    let ((lo, lo_shift), (hi, hi_shift)) = q6_bits(col);
                    out[lo] |= (q & 0xf) << lo_shift;
                    out[hi] |= (q >> 4) << hi_shift;
                }
            }
        }
    }
}

/// How a word's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recode {
    /// As in the GGUF block.
    Copy,
    /// Signed bytes `q` stored as `q + 128`, so that they multiply as unsigned bytes.
    Unsigned,
    /// Q5_0's 32 fifth bits (bit `e` of the little-endian word for column `e`) regrouped so
    /// that bit `j` of byte `i` is column `4j + i`'s: a step's four bits then sit at the same
    /// position of its four bytes, where one shift per step brings them to bit 4.
    Spread,
}

impl Recode {
    fn pack(self, bytes: [u8; 4]) -> [u8; 4] {
        match self {
            Recode::Copy => bytes,
            Recode::Unsigned => bytes.map(|b| b ^ 0x80),
            Recode::Spread => {
                let bits = u32::from_le_bytes(bytes);
                let mut out = 0u32;
                for e in 0..32 {
                    out |= ((bits >> e) & 1) << (8 * (e % 4) + e / 4);
                }
                out.to_le_bytes()
            }
        }
    }

    fn unpack(self, bytes: [u8; 4]) -> [u8; 4] {
        match self {
            Recode::Copy => bytes,
            Recode::Unsigned => bytes.map(|b| b ^ 0x80),
            Recode::Spread => {
                let bits = u32::from_le_bytes(bytes);
                let mut out = 0u32;
                for e in 0..32 {
                    out |= ((bits >> (8 * (e % 4) + e / 4)) & 1) << e;
                }
                out.to_le_bytes()
            }
        }
    }
}

/// The packed layout of one format's blocks.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Bytes of a GGUF block.
    block_bytes: usize,
    /// How the block's bytes are rearranged first, where they are.
    regroup: Option<Regroup>,
    /// Byte offsets in the (regrouped) block of its f16 fields, in packed order.
    halves: &'static [usize],
    /// Runs of words, in packed order: the byte offset in the (regrouped) block, the number
    /// of words and how they are stored.
    words: &'static [(usize, usize, Recode)],
}

impl Layout {
    /// The layout of `ty`, where it has one.
    pub(crate) fn of(ty: GgmlType) -> Option<&'static Layout> {
        use Recode::*;
        Some(match ty {
            GgmlType::Q4_0 => &Layout {
                block_bytes: 18,
                regroup: None,
                halves: &[0],
                words: &[(2, 4, Copy)],
            },
            GgmlType::Q4_1 => &Layout {
                block_bytes: 20,
                regroup: None,
                halves: &[0, 2],
                words: &[(4, 4, Copy)],
            },
            GgmlType::Q5_0 => &Layout {
                block_bytes: 22,
                regroup: None,
                halves: &[0],
                words: &[(6, 4, Copy), (2, 1, Spread)],
            },
            GgmlType::Q8_0 => &Layout {
                block_bytes: 34,
                regroup: None,
                halves: &[0],
                words: &[(2, 8, Unsigned)],
            },
            GgmlType::Q2_K => &Layout {
                block_bytes: 84,
                regroup: None,
                halves: &[80, 82],
                words: &[(0, 4, Copy), (16, 16, Copy)],
            },
            GgmlType::Q3_K => &Layout {
                block_bytes: 110,
                regroup: Some(Regroup::ThreeBits),
                halves: &[108],
                words: &[(96, 3, Copy), (0, 24, Copy)],
            },
            GgmlType::Q4_K => &Layout {
                block_bytes: 144,
                regroup: None,
                halves: &[0, 2],
                words: &[(4, 3, Copy), (16, 32, Copy)],
            },
            GgmlType::Q5_K => &Layout {
                block_bytes: 176,
                regroup: None,
                halves: &[0, 2],
                words: &[(4, 3, Copy), (16, 8, Copy), (48, 32, Copy)],
            },
            GgmlType::Q6_K => &Layout {
                block_bytes: 210,
                regroup: Some(Regroup::SixBits),
                halves: &[208],
                words: &[(192, 4, Copy), (0, 48, Copy)],
            },
            GgmlType::IQ4_NL => &Layout {
                block_bytes: 18,
                regroup: None,
                halves: &[0],
                words: &[(2, 4, Copy)],
            },
            GgmlType::IQ4_XS => &Layout {
                block_bytes: 136,
                regroup: None,
                halves: &[0, 2],
                words: &[(4, 1, Copy), (8, 32, Copy)],
            },
            _ => return None,
        })
    }

    /// Bytes of the f16 fields of a packed block (all rows).
    pub(crate) fn scale_bytes(&self) -> usize {
        self.halves.len() * 2 * PACK_ROWS
    }

    /// Bytes of a packed block (all rows): as many as the group's GGUF blocks.
    pub(crate) fn packed_block_bytes(&self) -> usize {
        self.block_bytes * PACK_ROWS
    }

    /// Each word of a GGUF block: its offset in the block, its offset in a packed block for
    /// row 0 (row `r` adds `4r`), and its recoding.
    fn each_word(&self) -> impl Iterator<Item = (usize, usize, Recode)> + '_ {
        let first = self.scale_bytes();
        self.words
            .iter()
            .flat_map(|&(at, n, recode)| (0..n).map(move |i| (at + 4 * i, recode)))
            .enumerate()
            .map(move |(w, (at, recode))| (at, first + 4 * PACK_ROWS * w, recode))
    }

    /// Packs the `PACK_ROWS` rows `src` (GGUF layout, whole blocks) into `group`.
    ///
    /// Each packed word is written whole (the 16 rows' copies, 64 bytes) from the rows'
    /// blocks, which stay in the L1 cache while their packed block is written.
    pub(crate) fn pack_group(&self, src: &[u8], group: &mut [u8]) {
        let row_bytes = src.len() / PACK_ROWS;
        let first = self.scale_bytes();
        let mut regrouped = [[0u8; MAX_BLOCK_BYTES]; PACK_ROWS];
        for (b, dst) in group
            .chunks_exact_mut(self.packed_block_bytes())
            .enumerate()
        {
            let mut blocks: [&[u8]; PACK_ROWS] = std::array::from_fn(|lane| {
                &src[lane * row_bytes + b * self.block_bytes..][..self.block_bytes]
            });
            if let Some(regroup) = self.regroup {
                for (block, out) in blocks.iter_mut().zip(&mut regrouped) {
                    let out = &mut out[..self.block_bytes];
                    regroup.regroup(block, out);
                    *block = out;
                }
            }
            let (halves, words) = dst.split_at_mut(first);
            for (&at, out) in self
                .halves
                .iter()
                .zip(halves.chunks_exact_mut(2 * PACK_ROWS))
            {
                for (block, o) in blocks.iter().zip(out.chunks_exact_mut(2)) {
                    o.copy_from_slice(&block[at..at + 2]);
                }
            }
            // The runs of words walked directly rather than through `each_word`, whose chained
            // iterator made loading a 3B model a fifth slower (0.57 against 0.46 s).
            let mut words = words.chunks_exact_mut(4 * PACK_ROWS);
            for &(at, n, recode) in self.words {
                for (i, out) in (&mut words).take(n).enumerate() {
                    let at = at + 4 * i;
                    for (block, o) in blocks.iter().zip(out.chunks_exact_mut(4)) {
                        o.copy_from_slice(&recode.pack(block[at..at + 4].try_into().unwrap()));
                    }
                }
            }
        }
    }

    /// Writes block `b` of the row in lane `lane` of `group`, in the GGUF layout, to `out`.
    pub(crate) fn unpack_block(&self, group: &[u8], b: usize, lane: usize, out: &mut [u8]) {
        let packed = self.packed_block_bytes();
        let src = &group[b * packed..(b + 1) * packed];
        let mut regrouped = [0u8; MAX_BLOCK_BYTES];
        let block = match self.regroup {
            Some(_) => &mut regrouped[..self.block_bytes],
            None => &mut *out,
        };
        for (k, &at) in self.halves.iter().enumerate() {
            let from = 2 * PACK_ROWS * k + 2 * lane;
            block[at..at + 2].copy_from_slice(&src[from..from + 2]);
        }
        for (at, from, recode) in self.each_word() {
            let word = src[from + 4 * lane..from + 4 * lane + 4]
                .try_into()
                .unwrap();
            block[at..at + 4].copy_from_slice(&recode.unpack(word));
        }
        if let Some(regroup) = self.regroup {
            regroup.restore(&regrouped[..self.block_bytes], out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_stores_each_byte_of_its_block_once() {
        for ty in GgmlType::ALL {
            let Some(layout) = Layout::of(ty) else {
                continue;
            };
            assert_eq!(layout.block_bytes, ty.block_bytes(), "{ty}");
            assert!(layout.block_bytes <= MAX_BLOCK_BYTES, "{ty}");
            let mut seen = vec![0u8; ty.block_bytes()];
            for &at in layout.halves {
                seen[at..at + 2].iter_mut().for_each(|s| *s += 1);
            }
            for (at, _, _) in layout.each_word() {
                seen[at..at + 4].iter_mut().for_each(|s| *s += 1);
            }
            assert!(seen.iter().all(|&s| s == 1), "{ty}: {seen:?}");
        }
    }

    #[test]
    fn six_bit_groups_hold_each_quant_and_restore_the_block() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut block = [0u8; 210];
        for _ in 0..64 {
            block.iter_mut().for_each(|b| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            });
            let mut regrouped = [0u8; 210];
            Regroup::SixBits.regroup(&block, &mut regrouped);
            assert_eq!(regrouped[192..], block[192..]);
            for col in 0..256 {
                let ((lo, lo_shift), (hi, hi_shift)) = q6_bits(col);
                let q = (block[lo] >> lo_shift) & 0xf | ((block[hi] >> hi_shift) & 3) << 4;
                // As the kernels read it: a mask for the first three steps of a group, the
                // top two bits of those three bytes for the fourth.
                let (g, k) = (col / 16, col % 16);
                let read = if k < 12 {
                    regrouped[12 * g + k] & 0x3f
                } else {
                    let top = |j: usize| regrouped[12 * g + 4 * j + k - 12] >> 6;
                    top(0) | top(1) << 2 | top(2) << 4
                };
                assert_eq!(read, q, "column {col}");
            }
            let mut restored = [0u8; 210];
            Regroup::SixBits.restore(&regrouped, &mut restored);
            assert_eq!(restored, block);
        }
    }

    #[test]
    fn three_bit_groups_hold_each_quant_and_restore_the_block() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut block = [0u8; 110];
        for _ in 0..64 {
            block.iter_mut().for_each(|b| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            });
            let mut regrouped = [0u8; 110];
            Regroup::ThreeBits.regroup(&block, &mut regrouped);
            assert_eq!(regrouped[96..], block[96..]);
            // The values the reference decoding gives, plus 4.
            let q3: &crate::blocks::BlockQ3K = &crate::blocks::as_blocks(&block)[0];
            let values = crate::reference::decode::q3k(q3);
            for (col, &value) in values.iter().enumerate() {
                assert_eq!(
                    q3_regrouped_quant(&regrouped, col) as i8 - 4,
                    value,
                    "{col}"
                );
            }
            let mut restored = [0u8; 110];
            Regroup::ThreeBits.restore(&regrouped, &mut restored);
            assert_eq!(restored, block);
        }
    }

    #[test]
    fn spreading_the_fifth_bits_puts_a_steps_bits_at_one_position() {
        for e in 0..32 {
            let word = Recode::Spread.pack((1u32 << e).to_le_bytes());
            // Column e is in step e / 4, byte e % 4 of the row's word.
            assert_eq!(u32::from_le_bytes(word), 1 << (8 * (e % 4) + e / 4));
            assert_eq!(Recode::Spread.unpack(word), (1u32 << e).to_le_bytes());
        }
    }
}
