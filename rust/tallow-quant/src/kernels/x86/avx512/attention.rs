//! The attention tile kernel in AVX-512 intrinsics, for heads of 64 and 128 values and tiles
//! of up to 64 positions (others take the FMA kernel, `super::super::attention`).
//!
//! Per group of 16 positions it forms each query's 16 dot products as 16 vectors of partial
//! sums and reduces them with one transposing tree into a vector with one score per lane;
//! then it updates the online softmax state once for the tile, with vector exponentials.
//! The work for a query depends only on the query and the tile's visible positions.
//!
//! [`rows`] takes the query heads that share a KV head together (up to 4 and 2 at a time):
//! each key and value vector is loaded once for all of them, and each head keeps its query
//! and its weighted sum in registers; a head's arithmetic does not depend on the others.
//! [`rows_pages`] is the same kernel reading the pages of the KV pool directly, f16, bf16,
//! Q8_0 or Q4_0, each value widened in registers to the f32 the widened copy would hold.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::kernels::attention::{plain_scale, weight, KvBlock, IN_PLACE_PAGE, WEIGHT_CUTOFF};
use crate::GgmlType;
use half::{bf16, f16};

/// Lanes of a vector.
const LANES: usize = 16;
/// Groups of 16 positions in the largest tile this kernel takes.
const GROUPS: usize = 4;

/// Whether the kernel takes a head of `head_dim` values and tiles of `positions` rows.
fn fits(head_dim: usize, positions: usize) -> bool {
    head_dim.is_multiple_of(LANES) && head_dim > 0 && positions <= GROUPS * LANES
}

/// f16 keys or values to f32, 16 at a time (`src` and `out` of one length).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn widen(src: &[f16], out: &mut [f32]) {
    assert_eq!(src.len(), out.len());
    let (src16, src_tail) = src.as_chunks::<LANES>();
    let (out16, out_tail) = out.as_chunks_mut::<LANES>();
    for (s, o) in src16.iter().zip(out16) {
        let halves = _mm256_loadu_si256(s.as_ptr().cast());
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_cvtph_ps(halves));
    }
    for (s, o) in src_tail.iter().zip(out_tail) {
        *o = s.to_f32();
    }
}

/// The 16 horizontal sums of `v`, sum `j` in lane `j`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sums16(v: &[__m512; LANES]) -> __m512 {
    // Pairs: per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3].
    let pairs: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    // Quads: per 128-bit lane, the lane's partial sums of four vectors.
    let quads: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (
            _mm512_castps_pd(pairs[2 * i]),
            _mm512_castps_pd(pairs[2 * i + 1]),
        );
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    // Across 128-bit lanes: even and odd lanes added, twice.
    let halve = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    halve(halve(quads[0], quads[1]), halve(quads[2], quads[3]))
}

/// `exp(x)` in every lane, as `crate::exp` computes it (up to the order of rounding).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp16(x: __m512) -> __m512 {
    use crate::kernels::exp::{EXP_LN2_HI, EXP_LN2_LO, EXP_MAX, EXP_MIN, EXP_POLY, EXP_ROUND};
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN)),
        _mm512_set1_ps(EXP_MAX),
    );
    let round = _mm512_set1_ps(EXP_ROUND);
    let n = _mm512_sub_ps(
        _mm512_add_ps(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            round,
        ),
        round,
    );
    let r = _mm512_add_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_LO)),
    );
    let mut y = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    y = _mm512_add_ps(
        _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(y, _mm512_castsi512_ps(bits))
}

/// [`super::weight`] in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn weight16(x: __m512) -> __m512 {
    let kept = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(WEIGHT_CUTOFF));
    _mm512_maskz_mov_ps(kept, exp16(x))
}

/// Runs [`rows_kernel`] over the query rows of `q` and their `states`, as many at a time as
/// the head size allows (4 for 64, 2 for 128); `hd` must be 64 or 128 and the tiles must
/// hold `n` positions.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn row_blocks<T: Tile>(
    hd: usize,
    mut states: &mut [f32],
    mut q: &[f32],
    keys: T,
    values: T,
    n: usize,
) {
    macro_rules! take {
        ($r:literal, $v:literal) => {
            while q.len() >= $r * hd {
                let (s, s_rest) = states.split_at_mut($r * (hd + 2));
                let (x, x_rest) = q.split_at($r * hd);
                rows_kernel::<$r, $v, T>(s, x, keys, values, n);
                (states, q) = (s_rest, x_rest);
            }
        };
    }
    if hd == 64 {
        take!(4, 4);
        take!(3, 4);
        take!(2, 4);
        take!(1, 4);
    } else {
        take!(2, 8);
        take!(1, 8);
    }
}

/// The query rows `q` (`rows * head_dim`) with their states (`rows * (head_dim + 2)`), all
/// seeing the same `scores.len()` positions; see `super::Kernels::page`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn rows(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let n = scores.len();
    let hd = keys.len() / n.max(1);
    if (hd == 64 || hd == 128) && fits(hd, n) {
        assert!(keys.len() == n * hd && values.len() == n * hd);
        let (keys, values) = (
            Contiguous { data: keys, hd },
            Contiguous { data: values, hd },
        );
        row_blocks(hd, states, q, keys, values, n);
        return;
    }
    // Other heads (and tiles) go through the FMA kernel, several rows at a time.
    let scale = plain_scale(hd);
    super::super::attention::avx512::rows_with(states, q, keys, values, scores, scale, None)
}

/// Whether [`rows_pages`] reads pages of `page_size` positions of `head_dim` values stored as
/// `element` directly for `rows` query rows at a time. An f16 value widens in the load; the
/// other types take a few operations a vector, which pay where the kernel reads each page
/// once (one pass of [`row_blocks`], 4 rows of 64 values or 2 of 128: decoding) and cost more
/// than a widened copy's loads where it reads the page again for more rows.
pub(crate) fn reads_pages(
    element: GgmlType,
    head_dim: usize,
    page_size: usize,
    rows: usize,
) -> bool {
    let element_read = match element {
        GgmlType::F16 => true,
        GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::Q4_0 => rows <= 256 / head_dim,
        _ => false,
    };
    // A page's positions are one group of lanes.
    const { assert!(IN_PLACE_PAGE == LANES) };
    element_read && (head_dim == 64 || head_dim == 128) && page_size == IN_PLACE_PAGE
}

/// [`rows`] reading the keys and values of `n` positions (at most 64) straight from pages of
/// the KV pool, 16 positions per page (`keys[p]`, `values[p]`: page `p`'s block of this KV
/// head, at least its visible positions; all of one dtype [`reads_pages`] takes): no widened
/// copy. The same arithmetic as [`rows`] on the widened values (every widening is exact:
/// f16 or bf16 to f32, and a small integer times its block's scale).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn rows_pages(
    states: &mut [f32],
    q: &[f32],
    keys: &[KvBlock<'_>],
    values: &[KvBlock<'_>],
    n: usize,
    hd: usize,
) {
    assert!(
        (hd == 64 || hd == 128)
            && n <= GROUPS * LANES
            && q.len().is_multiple_of(hd)
            && states.len() == q.len() / hd * (hd + 2)
    );
    let pages = n.div_ceil(LANES);
    assert!(keys.len() == pages && values.len() == pages);
    match keys[0] {
        KvBlock::F16(_) => {
            let of = |b| match b {
                KvBlock::F16(b) => Some(b),
                _ => None,
            };
            let (k, v) = (pages_of(keys, n, hd, of), pages_of(values, n, hd, of));
            let (k, v) = (F16Pages { pages: &k, hd }, F16Pages { pages: &v, hd });
            row_blocks(hd, states, q, k, v, n);
        }
        KvBlock::Bf16(_) => {
            let of = |b| match b {
                KvBlock::Bf16(b) => Some(b),
                _ => None,
            };
            let (k, v) = (pages_of(keys, n, hd, of), pages_of(values, n, hd, of));
            let (k, v) = (Bf16Pages { pages: &k, hd }, Bf16Pages { pages: &v, hd });
            row_blocks(hd, states, q, k, v, n);
        }
        KvBlock::Quantized(ty, _) => {
            let row = hd / ty.block_len() * ty.block_bytes();
            let bytes = |b| match b {
                KvBlock::Quantized(_, b) => Some(b),
                _ => None,
            };
            let (k, v) = (
                pages_of(keys, n, row, bytes),
                pages_of(values, n, row, bytes),
            );
            match ty {
                GgmlType::Q8_0 => {
                    let (k, v) = (Q8Pages { pages: &k, row }, Q8Pages { pages: &v, row });
                    row_blocks(hd, states, q, k, v, n);
                }
                GgmlType::Q4_0 => {
                    let (k, v) = (Q4Pages { pages: &k, row }, Q4Pages { pages: &v, row });
                    row_blocks(hd, states, q, k, v, n);
                }
                _ => panic!("no kernel reads {} pages in place", ty.name()),
            }
        }
        other => panic!("no kernel reads {other:?} pages in place"),
    }
}

/// The pages of a tile of `n` positions as `of` finds them in each block (`None` for a block
/// of another dtype), each checked to hold its visible rows of `row` elements.
fn pages_of<'a, T>(
    blocks: &[KvBlock<'a>],
    n: usize,
    row: usize,
    of: fn(KvBlock<'a>) -> Option<&'a [T]>,
) -> [&'a [T]; GROUPS] {
    std::array::from_fn(|p| match blocks.get(p) {
        Some(&block) => {
            let b = of(block).expect("the pages of a tile are of one dtype");
            assert!(b.len() >= LANES.min(n - p * LANES) * row);
            b
        }
        None => &[],
    })
}

/// The positions of a tile as the kernels read them.
trait Tile: Copy {
    /// Values `16 c..16 c + 16` of position `j`, as f32. Callers check the bounds.
    unsafe fn vector(self, j: usize, c: usize) -> __m512;
}

/// Positions of `hd` f32 values one after the other.
#[derive(Clone, Copy)]
struct Contiguous<'a> {
    data: &'a [f32],
    hd: usize,
}

impl Tile for Contiguous<'_> {
    #[inline(always)]
    unsafe fn vector(self, j: usize, c: usize) -> __m512 {
        _mm512_loadu_ps(self.data.as_ptr().add(j * self.hd + c * LANES))
    }
}

/// Pages of 16 positions of `hd` f16 values.
#[derive(Clone, Copy)]
struct F16Pages<'a> {
    pages: &'a [&'a [f16]],
    hd: usize,
}

impl Tile for F16Pages<'_> {
    #[inline(always)]
    unsafe fn vector(self, j: usize, c: usize) -> __m512 {
        let page = self.pages.get_unchecked(j / LANES);
        let at = (j % LANES) * self.hd + c * LANES;
        _mm512_cvtph_ps(_mm256_loadu_si256(page.as_ptr().add(at).cast()))
    }
}

/// Pages of 16 positions of `hd` bf16 values.
#[derive(Clone, Copy)]
struct Bf16Pages<'a> {
    pages: &'a [&'a [bf16]],
    hd: usize,
}

impl Tile for Bf16Pages<'_> {
    #[inline(always)]
    unsafe fn vector(self, j: usize, c: usize) -> __m512 {
        let page = self.pages.get_unchecked(j / LANES);
        let at = (j % LANES) * self.hd + c * LANES;
        // A bf16 is the top half of the f32 it stands for.
        let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(page.as_ptr().add(at).cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
    }
}

/// Bytes of a Q8_0 block: an f16 scale, 32 signed bytes.
const Q8_0_BLOCK: usize = GgmlType::Q8_0.block_bytes();
/// Bytes of a Q4_0 block: an f16 scale, 16 bytes of nibbles (value `i` the low nibble of byte
/// `i`, value `i + 16` the high one, each minus 8).
const Q4_0_BLOCK: usize = GgmlType::Q4_0.block_bytes();

/// The f16 scale at the start of the block at `at`, as a vector of f32.
#[inline(always)]
unsafe fn block_scale(at: *const u8) -> __m512 {
    let bits = at.cast::<u16>().read_unaligned();
    let d = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)));
    _mm512_broadcastss_ps(d)
}

/// Pages of 16 positions, each a row of Q8_0 blocks (`row` bytes).
#[derive(Clone, Copy)]
struct Q8Pages<'a> {
    pages: &'a [&'a [u8]],
    row: usize,
}

impl Tile for Q8Pages<'_> {
    #[inline(always)]
    unsafe fn vector(self, j: usize, c: usize) -> __m512 {
        let page = self.pages.get_unchecked(j / LANES);
        // Vector `c` is half `c % 2` of block `c / 2`.
        let block = page
            .as_ptr()
            .add((j % LANES) * self.row + c / 2 * Q8_0_BLOCK);
        let q = _mm_loadu_si128(block.add(2 + c % 2 * LANES).cast());
        _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
            block_scale(block),
        )
    }
}

/// Pages of 16 positions, each a row of Q4_0 blocks (`row` bytes).
#[derive(Clone, Copy)]
struct Q4Pages<'a> {
    pages: &'a [&'a [u8]],
    row: usize,
}

impl Tile for Q4Pages<'_> {
    #[inline(always)]
    unsafe fn vector(self, j: usize, c: usize) -> __m512 {
        let page = self.pages.get_unchecked(j / LANES);
        // Vector `c` is the low (`c` even) or high nibbles of block `c / 2`.
        let block = page
            .as_ptr()
            .add((j % LANES) * self.row + c / 2 * Q4_0_BLOCK);
        let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(block.add(2).cast()));
        let shift = _mm512_set1_epi32((c % 2 * 4) as i32);
        let nibbles = _mm512_and_si512(_mm512_srlv_epi32(bytes, shift), _mm512_set1_epi32(15));
        let q = _mm512_sub_epi32(nibbles, _mm512_set1_epi32(8));
        _mm512_mul_ps(_mm512_cvtepi32_ps(q), block_scale(block))
    }
}

/// `R` query rows of `V` vectors each against `n` positions, as [`page`] does for one.
/// `keys` and `values` must hold `n` positions (their loads are unchecked).
// Rows and vectors index several arrays at once: plain index loops read best.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rows_kernel<const R: usize, const V: usize, T: Tile>(
    states: &mut [f32],
    q: &[f32],
    keys: T,
    values: T,
    n: usize,
) {
    let hd = V * LANES;
    // The tiles' bounds (`n` positions of `hd` values) are the callers' to check.
    assert!(n <= GROUPS * LANES && q.len() == R * hd && states.len() == R * (hd + 2));
    let scale = _mm512_set1_ps(plain_scale(hd));
    let load = |s: &[f32], at: usize| _mm512_loadu_ps(s[at..at + LANES].as_ptr());
    let groups = n.div_ceil(LANES);
    let qv: [[__m512; V]; R] =
        std::array::from_fn(|r| std::array::from_fn(|c| load(q, r * hd + c * LANES)));

    let mut s = [[_mm512_set1_ps(f32::NEG_INFINITY); GROUPS]; R];
    let mut valid = [0 as __mmask16; GROUPS];
    for g in 0..groups {
        let in_group = LANES.min(n - g * LANES);
        // Every element is written once below (zeros past the visible positions), so the
        // array is not cleared first: it is 4 KiB per group for 4 rows.
        let mut dots = [[MaybeUninit::<__m512>::uninit(); LANES]; R];
        for j in 0..LANES {
            if j >= in_group {
                for row in &mut dots {
                    row[j].write(_mm512_setzero_ps());
                }
                continue;
            }
            let kv: [__m512; V] = std::array::from_fn(|c| keys.vector(g * LANES + j, c));
            for r in 0..R {
                let mut dot = _mm512_setzero_ps();
                for c in 0..V {
                    dot = _mm512_fmadd_ps(qv[r][c], kv[c], dot);
                }
                dots[r][j].write(dot);
            }
        }
        // SAFETY: every element was initialized above; `MaybeUninit<T>` has `T`'s layout.
        let dots =
            &*(&dots as *const [[MaybeUninit<__m512>; LANES]; R]).cast::<[[__m512; LANES]; R]>();
        valid[g] = ((1u32 << in_group) - 1) as __mmask16;
        for r in 0..R {
            s[r][g] =
                _mm512_mask_blend_ps(valid[g], s[r][g], _mm512_mul_ps(sums16(&dots[r]), scale));
        }
    }

    // Written for every group up to `groups` (covering the `n` positions read below).
    let mut weights = [[MaybeUninit::<f32>::uninit(); GROUPS * LANES]; R];
    let mut alphas = [0f32; R];
    for r in 0..R {
        let mut tile_max = s[r][0];
        for s in &s[r][1..groups] {
            tile_max = _mm512_max_ps(tile_max, *s);
        }
        let tile_max = _mm512_reduce_max_ps(tile_max);
        let state = &mut states[r * (hd + 2)..][..2];
        let new_max = state[0].max(tile_max);
        alphas[r] = weight(state[0] - new_max);
        let mut sum = _mm512_setzero_ps();
        for g in 0..groups {
            let p = weight16(_mm512_sub_ps(s[r][g], _mm512_set1_ps(new_max)));
            let p = _mm512_maskz_mov_ps(valid[g], p);
            sum = _mm512_add_ps(sum, p);
            _mm512_storeu_ps(weights[r][g * LANES..].as_mut_ptr().cast(), p);
        }
        state[1] = state[1] * alphas[r] + _mm512_reduce_add_ps(sum);
        state[0] = new_max;
    }

    let mut acc: [[__m512; V]; R] = std::array::from_fn(|r| {
        let alpha = _mm512_set1_ps(alphas[r]);
        std::array::from_fn(|c| _mm512_mul_ps(load(states, r * (hd + 2) + 2 + c * LANES), alpha))
    });
    for j in 0..n {
        let vv: [__m512; V] = std::array::from_fn(|c| values.vector(j, c));
        for r in 0..R {
            // SAFETY: position `j < n <= groups * LANES` was stored above.
            let w = _mm512_set1_ps(weights[r][j].assume_init());
            for c in 0..V {
                acc[r][c] = _mm512_fmadd_ps(w, vv[c], acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..V {
            let at = r * (hd + 2) + 2 + c * LANES;
            _mm512_storeu_ps(states[at..at + LANES].as_mut_ptr(), acc[r][c]);
        }
    }
}
