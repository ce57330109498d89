//! The operands of the packed kernels (the layout is described in `crate::packed`), checked
//! and viewed as blocks, for every instruction set's kernels.

use std::mem::MaybeUninit;

use crate::blocks::Block;
use crate::kernels::{SubBlockPairs, TileActs, TileScales, PACK_ROWS, TILE_LANES};

/// A fixed number of bytes, viewed in place: a packed block's f16 fields or its words.
pub(super) trait Bytes: 'static {
    const LEN: usize;
    fn view(bytes: &[u8]) -> &Self;
}

impl<const N: usize> Bytes for [u8; N] {
    const LEN: usize = N;
    #[inline]
    fn view(bytes: &[u8]) -> &Self {
        bytes.try_into().unwrap()
    }
}

/// The operands of a packed kernel of `T` tokens over consecutive groups, checked: the
/// groups' bytes (per block, its f16 fields `S` then its words `Q`), the activation blocks of
/// the tokens (`blocks` per token, one token after the other), the f32 block scales and sums
/// of the token groups (per group of [`TILE_LANES`] tokens, one array of lanes per block),
/// and the number of blocks per row.
pub(super) struct Operands<'a, A: Block, S: Bytes, Q: Bytes, const T: usize> {
    groups: &'a [u8],
    blocks: usize,
    acts: &'a [A],
    d: &'a [[f32; TILE_LANES]],
    s: &'a [[f32; TILE_LANES]],
    pairs: &'a [SubBlockPairs],
    layout: std::marker::PhantomData<(&'a S, &'a Q)>,
}

impl<'a, A: Block, S: Bytes, Q: Bytes, const T: usize> Operands<'a, A, S, Q, T> {
    #[inline]
    pub(super) fn new(
        groups: &'a [u8],
        a: TileActs<'a>,
        scales: &TileScales<'a>,
        out: &[&mut [f32]],
    ) -> Self {
        let (acts, blocks) = a.blocks::<A>();
        assert!(a.len() == T);
        let group_bytes = blocks * (S::LEN + Q::LEN);
        assert!(group_bytes > 0 && groups.len().is_multiple_of(group_bytes));
        let rows = groups.len() / group_bytes * PACK_ROWS;
        assert!(out.len() == T && out.iter().all(|o| o.len() == rows));
        scales.check(blocks, T);
        assert!(
            scales.s.len() == scales.d.len(),
            "packed kernels need block sums"
        );
        Operands {
            groups,
            blocks,
            acts,
            d: scales.d.as_chunks::<TILE_LANES>().0,
            s: scales.s.as_chunks::<TILE_LANES>().0,
            pairs: scales.pairs,
            layout: std::marker::PhantomData,
        }
    }

    /// Groups of rows.
    #[inline(always)]
    pub(super) fn groups(&self) -> usize {
        self.groups.len() / (self.blocks * (S::LEN + Q::LEN))
    }

    /// Blocks of a row.
    #[inline(always)]
    pub(super) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Block `b` of group `g`: its scale bytes and quant bytes.
    #[inline(always)]
    pub(super) fn block(&self, g: usize, b: usize) -> (&'a S, &'a Q) {
        let len = S::LEN + Q::LEN;
        let at = (g * self.blocks + b) * len;
        split_block(&self.groups[at..at + len])
    }

    /// Block `b` of every token.
    #[inline(always)]
    pub(super) fn column(&self, b: usize) -> Column<'a, A, T> {
        assert!(b < self.blocks);
        Column {
            from: &self.acts[b..],
            blocks: self.blocks,
        }
    }

    /// Where token `t`'s block `b` has its scales: the array of its group and block, and
    /// its lane there.
    #[inline(always)]
    fn lane(&self, b: usize, t: usize) -> (usize, usize) {
        (t / TILE_LANES * self.blocks + b, t % TILE_LANES)
    }

    /// Block `b` of token `t`: its f32 block scale and sum.
    #[inline(always)]
    pub(super) fn scales(&self, b: usize, t: usize) -> (f32, f32) {
        let (i, lane) = self.lane(b, t);
        (self.d[i][lane], self.s[i][lane])
    }

    /// Where the sub-block pairs of block `b` of token `t` are.
    #[inline(always)]
    pub(super) fn pairs(&self, b: usize, t: usize) -> PairsAt<'a> {
        let (i, lane) = self.lane(b, t);
        PairsAt {
            pairs: self.pairs,
            at: i * TILE_LANES + lane,
        }
    }

    /// Each group, as the iterator of its blocks' scale bytes and quant bytes, in order.
    #[inline]
    pub(super) fn each_group(
        &self,
    ) -> impl Iterator<Item = impl Iterator<Item = (&'a S, &'a Q)> + Clone> + 'a {
        self.groups
            .chunks_exact(self.blocks * (S::LEN + Q::LEN))
            .map(|group| group.chunks_exact(S::LEN + Q::LEN).map(split_block::<S, Q>))
    }
}

/// A packed block's bytes as its scale bytes and quant bytes.
#[inline(always)]
fn split_block<S: Bytes, Q: Bytes>(block: &[u8]) -> (&S, &Q) {
    let (scales, quants) = block.split_at(S::LEN);
    (S::view(scales), Q::view(quants))
}

/// Block `b` of the tokens of a tile, found `blocks` blocks apart from `from`, token 0's.
#[derive(Clone, Copy)]
pub(super) struct Column<'a, A, const T: usize> {
    from: &'a [A],
    blocks: usize,
}

impl<'a, A, const T: usize> Column<'a, A, T> {
    /// Token `t`'s block.
    #[inline(always)]
    pub(super) fn token(&self, t: usize) -> &'a A {
        assert!(t < T);
        // SAFETY: `from` holds more than `(T - 1) * blocks` blocks: it starts at block
        // `b < blocks` of `T * blocks` (`Operands::column`) or holds `T` with `blocks` 1
        // (`Panels::column`); and `t < T`.
        unsafe { self.from.get_unchecked(t * self.blocks) }
    }
}

/// The activation blocks of two columns of a tile, each column's blocks side by side: one
/// column is copied in while the other serves.
pub(super) struct Panels<A, const T: usize> {
    panels: [MaybeUninit<Panel<A, T>>; 2],
    /// The column each panel holds, `usize::MAX` for none.
    holds: [usize; 2],
}

/// A column's blocks of `T` tokens, one after the other.
#[repr(C, align(64))]
struct Panel<A, const T: usize>([A; T]);

impl<A: Block, const T: usize> Panels<A, T> {
    #[inline(always)]
    pub(super) fn new() -> Self {
        Panels {
            panels: [const { MaybeUninit::uninit() }; 2],
            holds: [usize::MAX; 2],
        }
    }

    /// Copies column `b` (`column`) into its panel.
    #[inline(always)]
    pub(super) fn fill(&mut self, b: usize, column: Column<'_, A, T>) {
        let to = self.panels[b % 2].as_mut_ptr().cast::<A>();
        for t in 0..T {
            // SAFETY: `to` is the first of the panel's `T` blocks, and `t < T`.
            unsafe { copy_block(column.token(t), to.add(t)) };
        }
        self.holds[b % 2] = b;
    }

    /// Column `b`, from its panel. Panics unless it was the last filled there.
    #[inline(always)]
    pub(super) fn column(&self, b: usize) -> Column<'_, A, T> {
        assert!(self.holds[b % 2] == b, "column {b} is not in its panel");
        // SAFETY: filled with column `b`'s blocks (`fill`, checked above).
        let panel = unsafe { self.panels[b % 2].assume_init_ref() };
        Column {
            from: &panel.0,
            blocks: 1,
        }
    }
}

/// Copies a block as vector moves: a copy of more than 256 bytes in one is a call to `memcpy`
/// (a tenth of a tile's time at 16 calls a column).
///
/// # Safety
/// `to` must be valid for writing one `A`.
#[inline(always)]
unsafe fn copy_block<A: Block>(from: &A, to: *mut A) {
    const HEAD: usize = 256;
    let (from, to) = ((from as *const A).cast::<u8>(), to.cast::<u8>());
    let len = size_of::<A>();
    // SAFETY: both hold `len` bytes (`A` has alignment 1: any pointer to one is aligned).
    unsafe {
        std::ptr::copy_nonoverlapping(from, to, len.min(HEAD));
        if len > HEAD {
            std::ptr::copy_nonoverlapping(from.add(HEAD), to.add(HEAD), len - HEAD);
        }
    }
}

/// Where a token's [`SubBlockPairs`] are: looked up by the formats that take them alone
/// (Q4_K and Q5_K, whose activations are Q8_K, which has them).
#[derive(Clone, Copy)]
pub(super) struct PairsAt<'a> {
    pairs: &'a [SubBlockPairs],
    at: usize,
}

impl<'a> PairsAt<'a> {
    #[inline(always)]
    pub(super) fn get(self) -> &'a SubBlockPairs {
        &self.pairs[self.at]
    }
}

/// Activation bytes `4j..4j + 4` of a block `y` as one i32, the four bytes a step of a packed
/// block multiplies in each row's lane (broadcast to every lane by the kernels).
#[inline]
pub(super) fn act_quad(y: &[i8; 32], j: usize) -> i32 {
    let bytes: [i8; 4] = y[4 * j..4 * j + 4].try_into().unwrap();
    i32::from_le_bytes(bytes.map(|b| b as u8))
}
