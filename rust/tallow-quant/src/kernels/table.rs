//! One table of kernels per instruction set: a row per tensor type holding every kernel of
//! that type (dot product, tile, rows, packed, activation quantizer, dequantizer), and one
//! row of float kernels (attention over KV pages, gated activations), with the fallbacks to
//! lesser sets resolved once, when the table is built (as ggml's per-type trait rows). Each
//! set's module lists its own kernels in its `row` and `float_row` functions; this module
//! combines them.
//!
//! Fallbacks, down the chain AVX-512 VNNI → AVX-512 → AVX2 → scalar (NEON → scalar):
//! - The row-major kernels of a type (dot product, tile, rows) come as a set, since a set's
//!   tile and row kernels equal its dot product bit for bit: where a set has no dot product
//!   for a type, all three come from the next set down.
//! - Packed kernels of every set give the same bits, so a missing one comes from the next
//!   set down, but never from the scalar packed kernel: a SIMD set's row-major kernels outrun
//!   it (NEON keeps its row-major kernels).
//! - An activation quantizer, and a dequantizer, come from the next set down, finally the
//!   scalar one (the dequantizers: `crate::dequantize` falls back to the reference).
//! - A float kernel comes from the next set down, finally the scalar one, which has them all.

use std::sync::OnceLock;

use super::activations::{ActivationKernels, RawActivations};
use super::attention::{AttentionKernels, RawAttention};
use super::{
    Decoding, Dequantizer, Isa, Packed, Quantizer, RawDecoding, RawPacked, RawRows, RawTile,
    RawVecDot, Rows, Tile, VecDot,
};
use crate::GgmlType;

/// An activation quantizer: one row of f32 values (whole blocks) to its blocks' bytes.
pub(crate) type RawQuantize = unsafe fn(x: &[f32], dst: &mut [u8]);

/// A dequantizer: whole blocks' bytes to their f32 values.
pub(crate) type RawDequantize = unsafe fn(src: &[u8], dst: &mut [f32]);

/// The kernels one instruction set has of its own for one type.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawRow {
    pub(crate) vec_dot: Option<RawVecDot>,
    pub(crate) tile: Option<RawTile>,
    pub(crate) rows: Option<RawRows>,
    pub(crate) decoding: Option<RawDecoding>,
    pub(crate) packed: Option<RawPacked>,
    pub(crate) quantize: Option<RawQuantize>,
    pub(crate) dequantize: Option<RawDequantize>,
}

/// The kernels of one type on an instruction set the CPU has, fallbacks included; all `None`
/// for a set it lacks.
#[derive(Clone, Copy, Default)]
pub(crate) struct Kernels {
    /// Weights of this type against activations of `ty.vec_dot_type()` (`None` for the
    /// activation-only types Q8_1 and Q8_K).
    pub(crate) vec_dot: Option<VecDot>,
    /// Up to 8 tokens against one weight row, equal to `vec_dot` token by token.
    pub(crate) tile: Option<Tile>,
    /// Several weight rows against one token, equal to `vec_dot` row by row.
    pub(crate) rows: Option<Rows>,
    /// Rows decoded once for many tokens, equal to `vec_dot` token by token.
    pub(crate) decoding: Option<Decoding>,
    /// Weights packed in groups of `PACK_ROWS` rows (see `crate::packed`).
    pub(crate) packed: Option<Packed>,
    /// Activations of this type from f32.
    pub(crate) quantize: Option<Quantizer>,
    /// Values of this type to f32 (KV pages).
    pub(crate) dequantize: Option<Dequantizer>,
}

/// The float kernels one instruction set has of its own.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawFloatRow {
    pub(crate) attention: RawAttention,
    pub(crate) activations: RawActivations,
}

/// The float kernels of an instruction set the CPU has, fallbacks included.
#[derive(Clone, Copy)]
pub(crate) struct FloatKernels {
    pub(crate) attention: AttentionKernels,
    pub(crate) activations: ActivationKernels,
}

/// Every type's [`Kernels`] on one instruction set, indexed by `GgmlType as usize`, and its
/// [`FloatKernels`] (`None` for a set the CPU lacks).
pub(crate) struct KernelTable {
    types: [Kernels; GgmlType::ALL.len()],
    float: Option<FloatKernels>,
}

impl KernelTable {
    fn build(isa: Isa) -> Self {
        let mut table = KernelTable {
            types: [Kernels::default(); GgmlType::ALL.len()],
            float: None,
        };
        if !isa.is_available() {
            return table;
        }
        let lower = isa.fallback().map(|l| (l, l.table()));
        let (own, below) = (isa.own_float_row(), lower.and_then(|(_, t)| t.float));
        table.float = Some(FloatKernels {
            attention: own.attention.resolve(below.map(|b| b.attention)),
            activations: own.activations.resolve(below.map(|b| b.activations)),
        });
        for ty in GgmlType::ALL {
            let own = isa.own_row(ty);
            let below = lower.map(|(_, t)| t.types[ty as usize]).unwrap_or_default();
            let row_major = match own.vec_dot {
                Some(vec_dot) => Kernels {
                    vec_dot: Some(VecDot(vec_dot)),
                    tile: own.tile.map(Tile),
                    rows: own.rows.map(Rows),
                    decoding: own.decoding.map(Decoding),
                    ..Kernels::default()
                },
                // A set without a dot product of its own may still have its own decoding (a
                // decoded product gives the bits of any dot product of the format: it sums each
                // block exactly).
                None => Kernels {
                    decoding: own.decoding.map(Decoding).or(below.decoding),
                    ..below
                },
            };
            let packed_below = match lower {
                Some((Isa::Scalar, _)) | None => None,
                Some(_) => below.packed,
            };
            table.types[ty as usize] = Kernels {
                packed: own.packed.map(Packed).or(packed_below),
                quantize: own.quantize.map(Quantizer).or(below.quantize),
                dequantize: own.dequantize.map(Dequantizer).or(below.dequantize),
                ..row_major
            };
        }
        table
    }
}

impl Isa {
    /// The set whose kernels fill the gaps of this one's table.
    pub(crate) fn fallback(self) -> Option<Isa> {
        match self {
            Isa::Scalar => None,
            Isa::Neon | Isa::Avx2 => Some(Isa::Scalar),
            Isa::Avx512 => Some(Isa::Avx2),
            Isa::Avx512Vnni => Some(Isa::Avx512),
        }
    }

    /// The kernels this set has of its own for `ty` (no fallback; whether the CPU has the set
    /// is the caller's to check).
    pub(crate) fn own_row(self, ty: GgmlType) -> RawRow {
        match self {
            Isa::Scalar => super::scalar::row(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => super::x86::avx2::row(ty),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => super::x86::avx512::row(ty, false),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => super::x86::avx512::row(ty, true),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => super::neon::row(ty),
            #[allow(unreachable_patterns)]
            _ => RawRow::default(),
        }
    }

    /// The float kernels this set has of its own.
    fn own_float_row(self) -> RawFloatRow {
        match self {
            Isa::Scalar => super::scalar::float_row(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => super::x86::avx2::float_row(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => super::x86::avx512::float_row(),
            _ => RawFloatRow::default(),
        }
    }

    /// This set's table, built on first use.
    fn table(self) -> &'static KernelTable {
        static TABLES: [OnceLock<KernelTable>; Isa::ALL.len()] =
            [const { OnceLock::new() }; Isa::ALL.len()];
        TABLES[self as usize].get_or_init(|| KernelTable::build(self))
    }

    /// The kernels of this set for `ty`, fallbacks included; none where the CPU lacks the set.
    pub(crate) fn kernels(self, ty: GgmlType) -> Kernels {
        self.table().types[ty as usize]
    }

    /// The float kernels of this set, fallbacks included; `None` where the CPU lacks the set.
    pub(crate) fn float_kernels(self) -> Option<FloatKernels> {
        self.table().float
    }
}
