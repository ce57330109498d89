//! Run-time selection of SIMD kernels.
//!
//! One binary runs on any CPU of its architecture: kernels are compiled with
//! `#[target_feature]` per instruction set, and the best set the CPU has is picked once, on
//! first use. Each set has one table of kernels, a row per format and a row of float kernels
//! (attention, activations), built once with the gaps filled from the next set down and
//! finally the scalar reference (see [`table`]).
//!
//! The tree is by instruction set, as ggml-cpu's `arch/<isa>/`: [`scalar`], `x86::avx2`,
//! `x86::avx512` (VNNI being a variant of it) and `neon`, each listing its own kernels;
//! loops written once over a vector width sit beside the sets that compile them
//! (`x86::packed`, `x86::attention`), and portable loops that each set compiles with its
//! features in [`attention::loops`] and [`activations`].

pub(crate) mod activations;
pub(crate) mod attention;
pub(crate) mod exp;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;
mod table;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

pub(crate) use table::{RawFloatRow, RawRow};
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use x86::avx2::pdep_vec_dot;

use table::{RawDequantize, RawQuantize};

/// A dot-product kernel: weight row bytes and activation row bytes, both whole blocks of the
/// same count. It may rely on CPU features, so it is only handed out by [`Isa::kernels`] for
/// an instruction set the running CPU has.
pub(crate) type RawVecDot = unsafe fn(w: &[u8], a: &[u8]) -> f32;

/// A dot-product kernel that is safe to call on this CPU.
#[derive(Clone, Copy)]
pub(crate) struct VecDot(RawVecDot);

impl VecDot {
    #[inline]
    pub(crate) fn call(self, w: &[u8], a: &[u8]) -> f32 {
        // SAFETY: only built by the kernel table of a set the CPU has.
        unsafe { (self.0)(w, a) }
    }
}

/// A tile kernel: one weight row (`w`) against the activation rows `a` of 1 to 8 tokens of
/// one token group, writing one output per token to `out`. Equal bit for bit to the
/// [`VecDot`] kernel of the same instruction set and format, token by token. Handed out by
/// [`Isa::kernels`] only, for an instruction set the running CPU has.
pub(crate) type RawTile = unsafe fn(w: &[u8], a: TileActs, scales: &TileScales, out: &mut [f32]);

/// Tokens in a group of [`TileScales`].
pub(crate) const TILE_LANES: usize = 8;

/// Tokens a packed kernel takes at once: up to two groups of [`TileScales`]. The unpacked
/// steps of a pass serve every token of the tile, so AVX2's Q3_K, Q4_K and Q6_K kernels, whose
/// unpacking is a larger part of a step than elsewhere, take all 16 in one pass; the others
/// (on AVX-512 every format, whose sums of 8 tokens fill its registers) take a group at a
/// time ([`each_scale_group`]).
pub(crate) const PACKED_TILE: usize = 2 * TILE_LANES;

/// The activation rows of a tile's tokens (1 to [`TILE_LANES`] for a tile kernel, 1 to
/// [`PACKED_TILE`] for a packed one), one after the other in one
/// buffer as [`crate::QuantizedActs`] holds them: a kernel finds token `t`'s block `b` at a
/// fixed distance from token 0's, where a table of rows cost a load per token in its
/// innermost loop.
#[derive(Clone, Copy)]
pub(crate) struct TileActs<'a> {
    bytes: &'a [u8],
    row_bytes: usize,
    rows: usize,
}

impl<'a> TileActs<'a> {
    /// The `rows` rows of `row_bytes` bytes that make up `bytes`.
    pub(crate) fn new(bytes: &'a [u8], row_bytes: usize, rows: usize) -> Self {
        assert!(
            (1..=PACKED_TILE).contains(&rows) && bytes.len() == rows * row_bytes,
            "a tile has 1 to {PACKED_TILE} whole rows of activations"
        );
        TileActs {
            bytes,
            row_bytes,
            rows,
        }
    }

    /// The number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// The first `rows` tokens (of at least one more) and the rest.
    pub(crate) fn split_at(&self, rows: usize) -> (Self, Self) {
        assert!(rows > 0 && rows < self.rows, "two non-empty parts");
        let (first, rest) = self.bytes.split_at(rows * self.row_bytes);
        (
            TileActs::new(first, self.row_bytes, rows),
            TileActs::new(rest, self.row_bytes, self.rows - rows),
        )
    }

    /// Every token's blocks, one token after the other, and the number of blocks a token
    /// has. Panics unless a row is whole blocks.
    pub(crate) fn blocks<A: crate::blocks::Block>(&self) -> (&'a [A], usize) {
        let blocks = self.row_bytes / size_of::<A>();
        assert!(
            blocks * size_of::<A>() == self.row_bytes,
            "rows of whole blocks"
        );
        (crate::blocks::as_blocks::<A>(self.bytes), blocks)
    }
}

/// The activation block scales of a group of [`TILE_LANES`] tokens, converted to f32 once per
/// product: `d[TILE_LANES * b + lane]` is `d` of block `b` of the group's token `lane` (and
/// `s` likewise the block sums: Q8_1's `s`, or Q8_0's and Q8_K's integer `sum(q)`), 0 for
/// lanes past the last token. A tile covers the tokens `0..a.len()` of the group. A packed
/// tile of more than [`TILE_LANES`] tokens has two groups, one after the other.
pub(crate) struct TileScales<'a> {
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
    /// For Q8_K (else empty), `pairs[TILE_LANES * b + lane]`: the sums of block `b`'s
    /// sub-blocks of 32 columns in pairs, [`SubBlockPairs`].
    pub(crate) pairs: &'a [SubBlockPairs],
}

/// A Q8_K block's sums of its 8 sub-blocks of 32 columns, in pairs: entry `j` holds the sums
/// of sub-blocks `2j` (low i16) and `2j + 1` (high i16), each within 32 * 127. Taken once at
/// quantization, where each row group's kernel took them from the block's 16 group sums for
/// every token of every block.
pub(crate) type SubBlockPairs = [i32; 4];

impl<'a> TileScales<'a> {
    /// Panics unless the scales are the groups of `tokens` tokens (1 to [`PACKED_TILE`]) of
    /// `blocks` blocks.
    #[inline]
    pub(crate) fn check(&self, blocks: usize, tokens: usize) {
        let len = blocks * TILE_LANES * tokens.div_ceil(TILE_LANES);
        assert!(
            self.d.len() == len
                && self.s.len() == len
                && (self.pairs.is_empty() || self.pairs.len() == len)
                && (1..=PACKED_TILE).contains(&tokens),
            "tile scales do not fit the operands"
        );
    }

    /// The first group of two, and the second.
    fn split_groups(&self) -> (Self, Self) {
        let half = self.d.len() / 2;
        let pairs = |r: std::ops::Range<usize>| self.pairs.get(r).unwrap_or_default();
        (
            TileScales {
                d: &self.d[..half],
                s: &self.s[..half],
                pairs: pairs(0..half),
            },
            TileScales {
                d: &self.d[half..],
                s: &self.s[half..],
                pairs: pairs(half..self.d.len()),
            },
        )
    }
}

/// A packed tile as calls of one group of [`TileScales`] each (the first [`TILE_LANES`]
/// tokens, then the rest), for the kernels that take a group at a time: the first call finds
/// the weights at `source`, the second in the cache.
pub(crate) fn each_scale_group(
    source: WeightsAt,
    a: TileActs,
    scales: &TileScales,
    out: &mut [&mut [f32]],
    mut kernel: impl FnMut(WeightsAt, TileActs, &TileScales, &mut [&mut [f32]]),
) {
    if a.len() <= TILE_LANES {
        return kernel(source, a, scales, out);
    }
    let (first, rest) = a.split_at(TILE_LANES);
    let (first_scales, rest_scales) = scales.split_groups();
    let (first_out, rest_out) = out.split_at_mut(TILE_LANES);
    kernel(source, first, &first_scales, first_out);
    kernel(WeightsAt::Cache, rest, &rest_scales, rest_out);
}

/// A tile kernel that is safe to call on this CPU.
#[derive(Clone, Copy)]
pub(crate) struct Tile(RawTile);

impl Tile {
    #[inline]
    pub(crate) fn call(self, w: &[u8], a: TileActs, scales: &TileScales, out: &mut [f32]) {
        // SAFETY: only built by the kernel table of a set the CPU has; the
        // kernels check their operands' lengths.
        unsafe { (self.0)(w, a, scales, out) }
    }
}

/// Rows of a format whose blocks cost more to decode than to multiply by one token (the
/// codebook formats, Q3_K), decoded once for many tokens: `decode` writes up to
/// [`PACK_ROWS`] rows as one packed group of the decoded layout (`x86::packed::Decoded`,
/// [`DECODED_BLOCK_BYTES`] a block), and `kernel` multiplies such groups by up to
/// [`TILE_LANES`] tokens, as a [`RawPacked`] kernel, with the bits of the format's `vec_dot`.
#[derive(Clone, Copy)]
pub(crate) struct RawDecoding {
    pub(crate) decode: unsafe fn(w: &[u8], rows: usize, out: &mut [u8]),
    pub(crate) kernel: RawPacked,
}

/// Bytes of a block of a decoded group (see [`RawDecoding`]): the 16 rows' f32 scales, then
/// 68 words of 64 bytes (4 of group scales, 64 of values).
pub(crate) const DECODED_BLOCK_BYTES: usize = 64 + 68 * 64;

/// A [`RawDecoding`] of a set the CPU has.
#[derive(Clone, Copy)]
pub(crate) struct Decoding(RawDecoding);

impl Decoding {
    /// Bytes of a decoded group of rows of `blocks` blocks.
    #[inline]
    pub(crate) fn group_bytes(self, blocks: usize) -> usize {
        blocks * DECODED_BLOCK_BYTES
    }

    /// Decodes the `rows` weight rows `w` (1 to [`PACK_ROWS`] of them, whole blocks) into the
    /// decoded group `out` ([`Decoding::group_bytes`] of them); the lanes of rows past `rows`
    /// keep what they held.
    #[inline]
    pub(crate) fn decode(self, w: &[u8], rows: usize, out: &mut [u8]) {
        // SAFETY: only built by the kernel table of a set the CPU has; the kernel checks the
        // row count and that the slices hold a decoded block per block.
        unsafe { (self.0.decode)(w, rows, out) }
    }

    /// The packed kernel of the decoded groups.
    #[inline]
    pub(crate) fn kernel(self) -> Packed {
        // Of the same set as the decoding.
        Packed(self.0.kernel)
    }
}

/// A row kernel: `out.len()` contiguous weight rows of equal length (`w`) against the
/// activation row `a` of one token, one output per row. Equal bit for bit to the [`VecDot`]
/// kernel of the same instruction set and format, row by row. Handed out by
/// [`Isa::kernels`] only, for an instruction set the running CPU has.
pub(crate) type RawRows = unsafe fn(w: &[u8], a: &[u8], out: &mut [f32]);

/// Weight rows a row kernel takes through each activation block at once.
#[cfg(target_arch = "x86_64")]
pub(crate) const ROW_TILE: usize = 4;

/// A row kernel that is safe to call on this CPU.
#[derive(Clone, Copy)]
pub(crate) struct Rows(RawRows);

impl Rows {
    #[inline]
    pub(crate) fn call(self, w: &[u8], a: &[u8], out: &mut [f32]) {
        // SAFETY: only built by the kernel table of a set the CPU has; the
        // kernels check their operands' lengths.
        unsafe { (self.0)(w, a, out) }
    }
}

/// A packed kernel: the bytes of consecutive groups of [`PACK_ROWS`] packed weight rows (see
/// `crate::packed`) against the activation rows `a` of 1 to [`PACKED_TILE`] consecutive
/// tokens, with their groups' [`TileScales`] (which must include the block sums), writing to `out[t]` the
/// outputs of token `t` (`PACK_ROWS` per group). A token's outputs do not depend on the other
/// tokens of the tile. `source` says where the groups' bytes are. Handed out by
/// [`Isa::kernels`] only, for a set the running CPU has.
pub(crate) type RawPacked = unsafe fn(
    groups: &[u8],
    source: WeightsAt,
    a: TileActs,
    scales: &TileScales,
    out: &mut [&mut [f32]],
);

/// Where a packed kernel's weights are when it is called: whether it should ask for them
/// ahead of its loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum WeightsAt {
    /// In memory, read once by this call: the first tile of tokens to take them.
    Memory,
    /// In the cache already: a later tile of the same groups, or rows decoded just before.
    Cache,
}

impl WeightsAt {
    /// Where tile `tile` of a product over the same groups finds them: the first reads them
    /// from memory, the others from the cache.
    pub(crate) const fn of_tile(tile: usize) -> Self {
        match tile {
            0 => WeightsAt::Memory,
            _ => WeightsAt::Cache,
        }
    }
}

/// Weight rows interleaved in one packed group: one per i32 lane of a 512-bit vector (two
/// 256-bit vectors for AVX2).
pub(crate) const PACK_ROWS: usize = 16;

/// A packed kernel that is safe to call on this CPU.
#[derive(Clone, Copy)]
pub(crate) struct Packed(RawPacked);

impl Packed {
    #[inline]
    pub(crate) fn call(
        self,
        groups: &[u8],
        source: WeightsAt,
        a: TileActs,
        scales: &TileScales,
        out: &mut [&mut [f32]],
    ) {
        // SAFETY: only built by the kernel table of a set the CPU has; the
        // kernels check their operands' lengths.
        unsafe { (self.0)(groups, source, a, scales, out) }
    }
}

/// The environment variable that caps the instruction set tallow uses (`scalar`, `neon`,
/// `avx2`, `avx512`, `avx512vnni`): to measure or test a lesser CPU's kernels on a better one.
pub const ISA_ENV: &str = "TALLOW_ISA";

/// The instruction sets tallow has kernels for, best last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable scalar code.
    Scalar,
    /// AArch64 Advanced SIMD.
    Neon,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F and BW.
    Avx512,
    /// AVX-512 F and BW with VNNI (`vpdpbusd`).
    Avx512Vnni,
}

impl Isa {
    /// Every instruction set, worst first.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Neon,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ];

    /// The best instruction set of the running CPU (detected once, then cached).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .rev()
                .find(|isa| isa.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// The name [`ISA_ENV`] takes for this set.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// The best set [`ISA_ENV`] allows (read once; an unknown name is reported on stderr and
    /// caps nothing).
    fn cap() -> Isa {
        static CAP: OnceLock<Isa> = OnceLock::new();
        *CAP.get_or_init(|| {
            let Ok(name) = std::env::var(ISA_ENV) else {
                return Isa::Avx512Vnni;
            };
            let name = name.trim().to_ascii_lowercase();
            Isa::ALL
                .into_iter()
                .find(|isa| isa.name() == name)
                .unwrap_or_else(|| {
                    let known: Vec<&str> = Isa::ALL.iter().map(|isa| isa.name()).collect();
                    eprintln!(
                        "tallow: ignoring {ISA_ENV}={name:?}: not one of {}",
                        known.join(", ")
                    );
                    Isa::Avx512Vnni
                })
        })
    }

    /// Whether the running CPU can execute this set's kernels, and [`ISA_ENV`] allows it.
    pub fn is_available(self) -> bool {
        self <= Isa::cap() && self.in_hardware()
    }

    fn in_hardware(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.in_hardware()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => Isa::Avx512.in_hardware() && is_x86_feature_detected!("avx512vnni"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// An activation quantizer: the same bytes as the scalar quantizer of its format. Handed out
/// by [`Isa::kernels`] only, for a set the running CPU has.
#[derive(Clone, Copy)]
pub(crate) struct Quantizer(RawQuantize);

impl Quantizer {
    #[inline]
    pub(crate) fn call(self, x: &[f32], dst: &mut [u8]) {
        // SAFETY: only built by the kernel table of a set the CPU has.
        unsafe { (self.0)(x, dst) }
    }
}

/// A dequantizer: whole blocks of its format to f32, the same bits as the scalar reference.
/// Handed out by [`Isa::kernels`] only, for a set the running CPU has.
#[derive(Clone, Copy)]
pub(crate) struct Dequantizer(RawDequantize);

impl Dequantizer {
    #[inline]
    pub(crate) fn call(self, src: &[u8], dst: &mut [f32]) {
        // SAFETY: only built by the kernel table of a set the CPU has.
        unsafe { (self.0)(src, dst) }
    }
}

/// The attention kernels of the best instruction set of the running CPU.
pub fn attention_kernels() -> attention::AttentionKernels {
    float_kernels().attention
}

/// The gated activations of the best instruction set of the running CPU.
pub fn activation_kernels() -> activations::ActivationKernels {
    float_kernels().activations
}

fn float_kernels() -> table::FloatKernels {
    Isa::detected()
        .float_kernels()
        .expect("the detected set is available")
}

/// The scalar reference dot product of weights of type `ty` (`None` for the activation-only
/// types): what every SIMD kernel is tested against.
#[cfg(test)]
pub(crate) fn reference_kernel(ty: crate::GgmlType) -> Option<RawVecDot> {
    scalar::row(ty).vec_dot
}
