//! `PackedMatrix`: products equal the scalar reference to within rounding on every packed
//! kernel, a token's outputs do not depend on the tokens beside it, rows unpack to their
//! exact bytes, and bad operands are errors.

use crate::testing::Rng;
use crate::testing::{dequantized, extreme_blocks, magnitude, random_blocks};
use crate::{
    matmul_with, ActsBuffer, GgmlType, Isa, PackedMatrix, QuantError, QuantizedActs, WeightSource,
    PACKED_FORMATS,
};

const PACKABLE: [GgmlType; 11] = PACKED_FORMATS;
const RELATIVE_TOLERANCE: f64 = 1e-5;

/// `cols` columns of 32-column formats: as many blocks of a 256-column format.
fn columns(ty: GgmlType, cols: usize) -> usize {
    cols / 32 * ty.block_len()
}

/// The instruction sets of this CPU with a packed kernel for `ty`.
fn packing_isas(ty: GgmlType) -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| PackedMatrix::can_pack_with(isa, ty, 16, ty.block_len()))
        .collect()
}

/// Asserts that `got`, a product of the weight rows `weight` (`ty`) with `acts`, equals the
/// scalar reference's `want` (token-major) to within rounding: relative to each output's
/// `sum(|w| * |a|)`.
fn assert_within_rounding(
    ty: GgmlType,
    weight: &[u8],
    acts: &QuantizedActs<'_>,
    got: &[f32],
    want: &[f32],
    context: &str,
) {
    let w = dequantized(ty, weight);
    let n_tokens = acts.n_tokens();
    let rows = got.len() / n_tokens;
    let cols = w.len() / rows;
    for t in 0..n_tokens {
        let a = dequantized(ty.vec_dot_type(), acts.token(t).unwrap());
        for r in 0..rows {
            let mag = magnitude(&w[r * cols..(r + 1) * cols], &a);
            let (got, want) = (got[t * rows + r], want[t * rows + r]);
            let diff = (f64::from(got) - f64::from(want)).abs();
            assert!(
                diff <= RELATIVE_TOLERANCE * mag,
                "{context} token {t} row {r}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn packed_products_match_the_scalar_reference() {
    // The scalar reference kernels here are the row-major ones (`matmul_with`), which share
    // no code with the packed kernels.
    let mut rng = Rng::new(21);
    let mut buffer = ActsBuffer::new();
    // (rows, cols, tokens): serial and parallel, tiles of every width, a partial last tile,
    // and one tile of two groups of tile scales over more weights than a run of groups.
    let shapes = [
        (16, 32, 1),
        (48, 96, 3),
        (32, 576, 8),
        (64, 160, 13),
        (1024, 1024, 1),
        (512, 576, 17),
        (1024, 1024, 12),
    ];
    let mut checked = 0;
    for ty in PACKABLE {
        for isa in packing_isas(ty) {
            for (rows, cols, n_tokens) in shapes {
                let cols = columns(ty, cols);
                let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
                let x = rng.activations(n_tokens * cols);
                let acts = buffer
                    .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
                    .unwrap();
                let mut expected = vec![0f32; n_tokens * rows];
                matmul_with(Isa::Scalar, ty, &weight, rows, cols, &acts, &mut expected).unwrap();
                let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
                    .unwrap()
                    .expect("packable");
                assert_eq!(packed.size_bytes(), weight.len());
                let mut out = vec![f32::NAN; n_tokens * rows];
                packed.matmul(&acts, &mut out).unwrap();

                let context = format!("{isa:?} {ty} {rows}x{cols}");
                assert_within_rounding(ty, &weight, &acts, &out, &expected, &context);
                checked += 1;
            }
        }
    }
    // Every packable format on the scalar kernels, and on x86 with AVX2, AVX2's too.
    let isas = if Isa::Avx2.is_available() { 2 } else { 1 };
    assert!(checked >= PACKABLE.len() * isas * shapes.len());
    if Isa::Avx512Vnni.is_available() {
        assert_eq!(checked, PACKABLE.len() * 4 * shapes.len());
    }
}

/// Every quant at its largest (or at 0x80 bytes), against activations at their largest of
/// one sign and of mixed signs, over more tokens than a tile: the integer sums the kernels
/// add as i16 before widening them stay exact.
#[test]
fn extreme_values_do_not_saturate_packed_products() {
    let mut rng = Rng::new(23);
    let mut buffer = ActsBuffer::new();
    let (rows, n_tokens) = (32, 9);
    for ty in PACKABLE {
        let cols = columns(ty, 512);
        let signs: [fn(usize) -> f32; 2] = [|_| 1.0, |i| if i % 3 == 0 { -1.0 } else { 1.0 }];
        for fill in [0xffu8, 0x80] {
            let weight = extreme_blocks(&mut rng, ty, rows * cols / ty.block_len(), fill);
            for sign in signs {
                let x: Vec<f32> = (0..n_tokens * cols).map(sign).collect();
                let acts = buffer
                    .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
                    .unwrap();
                let mut expected = vec![0f32; n_tokens * rows];
                matmul_with(Isa::Scalar, ty, &weight, rows, cols, &acts, &mut expected).unwrap();
                for isa in packing_isas(ty) {
                    let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
                        .unwrap()
                        .expect("packable");
                    let mut out = vec![f32::NAN; n_tokens * rows];
                    packed.matmul(&acts, &mut out).unwrap();
                    let context = format!("{isa:?} {ty} fill {fill:#x}");
                    assert_within_rounding(ty, &weight, &acts, &out, &expected, &context);
                }
            }
        }
    }
}

#[test]
fn a_tokens_outputs_do_not_depend_on_its_neighbours() {
    let mut rng = Rng::new(22);
    let (rows, n_tokens) = (64, 11);
    for ty in PACKABLE {
        let cols = columns(ty, 256);
        for isa in packing_isas(ty) {
            let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
            let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
                .unwrap()
                .unwrap();
            let x = rng.activations(n_tokens * cols);
            let mut all = vec![0f32; n_tokens * rows];
            let mut buffer = ActsBuffer::new();
            let acts = buffer
                .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
                .unwrap();
            packed.matmul(&acts, &mut all).unwrap();
            for t in 0..n_tokens {
                let mut one = vec![0f32; rows];
                let mut buffer = ActsBuffer::new();
                let x = &x[t * cols..(t + 1) * cols];
                let acts = buffer.quantize(ty.vec_dot_type(), x, 1, cols).unwrap();
                packed.matmul(&acts, &mut one).unwrap();
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&one),
                    bits(&all[t * rows..(t + 1) * rows]),
                    "{isa:?} {ty} token {t}"
                );
            }
        }
    }
}

/// Every instruction set's packed kernels compute the same integer sums and then the same f32
/// operations in the same order: their outputs are equal bit for bit.
#[test]
fn packed_kernels_agree_bit_for_bit_across_instruction_sets() {
    let mut rng = Rng::new(24);
    let rows = 48;
    for ty in PACKABLE {
        let cols = columns(ty, 576);
        let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
        // Within one group of tile scales, two (whole or not), and several tiles.
        for n_tokens in [1, 5, 8, 13, 16, 19, 40] {
            let x = rng.activations(n_tokens * cols);
            let mut buffer = ActsBuffer::new();
            let acts = buffer
                .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
                .unwrap();
            let outputs: Vec<(Isa, Vec<u32>)> = packing_isas(ty)
                .into_iter()
                .map(|isa| {
                    let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
                        .unwrap()
                        .unwrap();
                    let mut out = vec![0f32; n_tokens * rows];
                    packed.matmul(&acts, &mut out).unwrap();
                    (isa, out.iter().map(|v| v.to_bits()).collect())
                })
                .collect();
            for (isa, out) in &outputs[1..] {
                assert!(
                    out == &outputs[0].1,
                    "{ty}, {n_tokens} tokens: {isa:?} differs from {:?}",
                    outputs[0].0
                );
            }
        }
    }
}

#[test]
fn packed_rows_dequantize_to_the_original_rows() {
    let mut rng = Rng::new(23);
    let rows = 32;
    for ty in PACKABLE {
        let cols = columns(ty, 96);
        for isa in packing_isas(ty) {
            let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
            let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
                .unwrap()
                .unwrap();
            let expected = dequantized(ty, &weight);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                packed.dequantize_row(r, &mut row).unwrap();
                let want = &expected[r * cols..(r + 1) * cols];
                assert!(
                    row.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {ty} row {r}"
                );
            }
            assert!(packed.dequantize_row(rows, &mut row).is_err());
            assert!(packed.dequantize_row(0, &mut row[1..]).is_err());
        }
    }
}

#[test]
fn unpackable_shapes_and_formats_are_left_unpacked() {
    for isa in Isa::ALL {
        for ty in [GgmlType::Q5_1, GgmlType::F32] {
            assert!(
                !PackedMatrix::can_pack_with(isa, ty, 256, 256),
                "{isa:?} {ty}"
            );
        }
        for ty in PACKABLE {
            // Rows must come in whole groups of 16.
            let cols = 2 * ty.block_len();
            assert!(!PackedMatrix::can_pack_with(isa, ty, 24, cols));
            let weight = vec![0u8; 24 * 2 * ty.block_bytes()];
            assert!(PackedMatrix::pack_with(isa, ty, &weight, 24, cols)
                .unwrap()
                .is_none());
        }
    }
    // A weight of the wrong size is an error, not a packing refusal.
    assert!(matches!(
        PackedMatrix::pack(GgmlType::Q4_1, &[0u8; 20], 16, 32),
        Err(QuantError::SizeMismatch { .. })
    ));
}

#[test]
fn several_matrices_in_one_loop_equal_each_alone() {
    let mut rng = Rng::new(24);
    let ty = GgmlType::Q4_1;
    let Some(&isa) = packing_isas(ty).last() else {
        return;
    };
    let cols = 576;
    // Serial (one token) and parallel (many tokens), with matrices of unequal sizes.
    for n_tokens in [1, 40] {
        let shapes = [576, 192, 48];
        let packed: Vec<PackedMatrix> = shapes
            .iter()
            .map(|&rows| {
                let w = random_blocks(&mut rng, ty, rows * cols / 32);
                PackedMatrix::pack_with(isa, ty, &w, rows, cols)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let x = rng.activations(n_tokens * cols);
        let mut buffer = ActsBuffer::new();
        let acts = buffer.quantize(GgmlType::Q8_1, &x, n_tokens, cols).unwrap();
        let mut outs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|r| vec![f32::NAN; r * n_tokens])
            .collect();
        let [a, b, c] = &mut outs[..] else {
            unreachable!()
        };
        PackedMatrix::matmul_many([&packed[0], &packed[1], &packed[2]], &acts, [a, b, c]).unwrap();
        for (m, out) in packed.iter().zip(&outs) {
            let mut alone = vec![0f32; out.len()];
            m.matmul(&acts, &mut alone).unwrap();
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(out),
                bits(&alone),
                "{} rows, {n_tokens} tokens",
                m.rows()
            );
        }
    }
}

#[test]
fn chosen_rows_equal_the_whole_products_rows() {
    let mut rng = Rng::new(31);
    for ty in PACKABLE {
        let cols = columns(ty, 256);
        let rows = 96;
        let w = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
        for isa in packing_isas(ty) {
            let packed = PackedMatrix::pack_with(isa, ty, &w, rows, cols)
                .unwrap()
                .unwrap();
            // One token, a tile and a part, and two tiles and a part; rows listed out of order,
            // twice, and several from one group.
            for n_tokens in [1, 9, 17] {
                let x = rng.activations(n_tokens * cols);
                let mut buffer = ActsBuffer::new();
                let acts = buffer
                    .quantize(ty.vec_dot_type(), &x, n_tokens, cols)
                    .unwrap();
                let mut whole = vec![0f32; rows * n_tokens];
                packed.matmul(&acts, &mut whole).unwrap();
                let chosen = [95u32, 3, 17, 3, 0, 16, 64];
                let mut out = vec![f32::NAN; chosen.len() * n_tokens];
                packed.matmul_rows(&chosen, &acts, &mut out).unwrap();
                for t in 0..n_tokens {
                    for (i, &r) in chosen.iter().enumerate() {
                        assert_eq!(
                            out[t * chosen.len() + i].to_bits(),
                            whole[t * rows + r as usize].to_bits(),
                            "{ty:?} on {isa:?}: token {t}, row {r}"
                        );
                    }
                }
                let err = packed.matmul_rows(&[96], &acts, &mut out[..n_tokens]);
                assert!(
                    matches!(err, Err(QuantError::SizeMismatch { .. })),
                    "{err:?}"
                );
            }
        }
    }
}

#[test]
fn packing_together_equals_packing_alone() {
    let mut rng = Rng::new(25);
    let Some(&isa) = packing_isas(GgmlType::Q8_0).last() else {
        return;
    };
    // (type, rows, cols): a Q5_1 matrix and one of 24 rows stay unpacked.
    let shapes = [
        (GgmlType::Q4_1, 64, 96),
        (GgmlType::Q5_1, 16, 256),
        (GgmlType::Q8_0, 32, 64),
        (GgmlType::Q4_0, 24, 64),
        (GgmlType::Q4_0, 16, 32),
        (GgmlType::Q8_0, 2048, 2048),
    ];
    let weights: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows, cols)| random_blocks(&mut rng, ty, rows * cols / ty.block_len()))
        .collect();
    let sources: Vec<WeightSource<'_>> = shapes
        .iter()
        .zip(&weights)
        .map(|(&(ty, rows, cols), bytes)| WeightSource {
            ty,
            bytes,
            rows,
            cols,
        })
        .collect();
    // Progress comes in order, source by source, in consecutive ranges that end with the
    // source (a source of more than a few MiB in more than one step).
    let mut released: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let together =
        PackedMatrix::pack_many_with(isa, &sources, |i, bytes| released.push((i, bytes))).unwrap();
    let mut covered = vec![0; sources.len()];
    for (i, bytes) in &released {
        assert_eq!(bytes.start, covered[*i], "source {i}");
        assert!(bytes.end > bytes.start);
        covered[*i] = bytes.end;
    }
    let lens: Vec<usize> = sources.iter().map(|s| s.bytes.len()).collect();
    assert_eq!(covered, [lens[0], 0, lens[2], 0, lens[4], lens[5]]);
    assert!(released.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(released.iter().filter(|(i, _)| *i == 5).count() > 1);
    for (s, packed) in sources.iter().zip(&together) {
        let alone = PackedMatrix::pack_with(isa, s.ty, s.bytes, s.rows, s.cols).unwrap();
        assert_eq!(packed.is_some(), alone.is_some(), "{}", s.ty);
        let (Some(packed), Some(alone)) = (packed, alone) else {
            continue;
        };
        let (mut a, mut b) = (vec![0f32; s.cols], vec![0f32; s.cols]);
        for r in 0..s.rows {
            packed.dequantize_row(r, &mut a).unwrap();
            alone.dequantize_row(r, &mut b).unwrap();
            assert_eq!(a, b, "{} row {r}", s.ty);
        }
    }
    // A source whose bytes do not match its shape is an error.
    let bad = WeightSource {
        ty: GgmlType::Q4_1,
        bytes: &weights[0][1..],
        rows: 64,
        cols: 96,
    };
    assert!(PackedMatrix::pack_many_with(isa, &[bad], |_, _| {}).is_err());
}

#[test]
fn bad_operands_are_errors() {
    let Some(&isa) = packing_isas(GgmlType::Q4_1).last() else {
        return;
    };
    let ty = GgmlType::Q4_1;
    let (rows, cols) = (16, 64);
    let weight = vec![0u8; rows * cols / 32 * ty.block_bytes()];
    let packed = PackedMatrix::pack_with(isa, ty, &weight, rows, cols)
        .unwrap()
        .unwrap();
    let x = vec![0.25f32; 2 * cols];
    let mut buffer = ActsBuffer::new();
    let wrong_type = buffer.quantize(GgmlType::Q8_0, &x, 2, cols).unwrap();
    assert!(matches!(
        packed.matmul(&wrong_type, &mut [0.0; 2 * 16]),
        Err(QuantError::ActivationType { .. })
    ));
    let mut buffer = ActsBuffer::new();
    let narrow = buffer.quantize(GgmlType::Q8_1, &x, 4, 32).unwrap();
    assert!(matches!(
        packed.matmul(&narrow, &mut [0.0; 4 * 16]),
        Err(QuantError::SizeMismatch { .. })
    ));
    let mut buffer = ActsBuffer::new();
    let acts = buffer.quantize(GgmlType::Q8_1, &x, 2, cols).unwrap();
    assert!(matches!(
        packed.matmul(&acts, &mut [0.0; 16]),
        Err(QuantError::SizeMismatch { .. })
    ));
    let mut out = [f32::NAN; 2 * 16];
    packed.matmul(&acts, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 0.0), "zero weights give zeros");
}

/// Every group of `ranges` exactly once, in any order.
fn assert_each_group_once(mut ranges: Vec<std::ops::Range<usize>>, total: usize, what: &str) {
    ranges.sort_by_key(|r| r.start);
    let mut next = 0;
    for r in &ranges {
        assert_eq!(r.start, next, "{what}");
        assert!(r.end > r.start, "{what}");
        next = r.end;
    }
    assert_eq!(next, total, "{what}");
}

#[test]
fn stealing_ranges_give_each_thread_its_range_in_order_then_the_rest() {
    use crate::packed::chunks::{StealingRanges, MAX_RANGES};
    for threads in [1, 2, 3, 8, 64] {
        // Past `MAX_RANGES` threads, threads share ranges.
        let count = threads.min(MAX_RANGES);
        for total in [0, 1, 2, 5, 36, 60, 96, 3072, 100_000] {
            let what = format!("{total} groups, {threads} threads");
            // Thread 1 (of more than one) claims alone: its own range from its front in
            // halves of what is left, then the others' from their backs.
            let worker = 1 % threads;
            let chunks = StealingRanges::new(total, threads);
            let ranges: Vec<_> = std::iter::from_fn(|| chunks.claim(worker)).collect();
            let (start, end) = (total * worker / count, total * (worker + 1) / count);
            let own = ranges
                .iter()
                .take_while(|r| r.start >= start && r.end <= end);
            let mut next = start;
            for r in own {
                assert_eq!(r.start, next, "{what}: its own range in order");
                assert_eq!(
                    r.len(),
                    (end - next).div_ceil(2),
                    "{what}: half of what is left"
                );
                next = r.end;
            }
            assert_eq!(next, end, "{what}: its own range first");
            assert_each_group_once(ranges, total, &what);
            assert_eq!(chunks.claim(0), None);
            // Every range's first thread claims in turn: where each range has groups, each
            // gets its front first.
            if total >= count {
                let chunks = StealingRanges::new(total, threads);
                for w in 0..count {
                    let first = chunks.claim(w).expect("a range of its own");
                    assert_eq!(first.start, total * w / count, "{what}: thread {w}");
                }
            }
        }
    }
}

#[test]
fn stealing_ranges_hand_out_each_group_once_to_racing_threads() {
    use crate::packed::chunks::StealingRanges;
    for threads in [2, 3, 8, 40] {
        for total in [1, 7, 96, 5000] {
            for _ in 0..20 {
                let chunks = StealingRanges::new(total, threads);
                let ranges: Vec<_> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..threads)
                        .map(|w| {
                            let chunks = &chunks;
                            scope.spawn(move || {
                                std::iter::from_fn(|| chunks.claim(w)).collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .flat_map(|h| h.join().unwrap())
                        .collect()
                });
                assert_each_group_once(
                    ranges,
                    total,
                    &format!("{total} groups, {threads} threads"),
                );
            }
        }
    }
}
