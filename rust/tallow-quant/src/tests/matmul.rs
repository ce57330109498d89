//! `matmul` and `QuantizedActs`: results equal per-row `vec_dot`, on the serial and the
//! parallel path, and every bad size is an error, never a panic.

use proptest::prelude::*;

use crate::kernels::reference_kernel;
use crate::testing::Rng;
use crate::testing::{dequantized, magnitude, random_blocks};
use crate::{
    matmul, matmul_with, quantize_row, vec_dot, ActsBuffer, GgmlType, Isa, QuantError,
    QuantizedActs,
};

/// Activations for weights of type `ty`, in buffers that live as long as the test process.
fn acts_for(ty: GgmlType, x: &[f32], n_tokens: usize, cols: usize) -> QuantizedActs<'static> {
    let buffer = Box::leak(Box::new(ActsBuffer::new()));
    buffer
        .quantize(ty.vec_dot_type(), x, n_tokens, cols)
        .unwrap()
}

/// Checks `out` against one `vec_dot` per (token, row): the same kernel, so equal bits.
fn assert_matches_vec_dot(
    ty: GgmlType,
    weight: &[u8],
    rows: usize,
    cols: usize,
    acts: &QuantizedActs<'_>,
    out: &[f32],
) {
    let row_bytes = weight.len() / rows.max(1);
    for t in 0..acts.n_tokens() {
        for r in 0..rows {
            let w = &weight[r * row_bytes..(r + 1) * row_bytes];
            let expected = vec_dot(ty, w, acts.token(t).unwrap(), cols).unwrap();
            assert_eq!(
                out[t * rows + r].to_bits(),
                expected.to_bits(),
                "{ty} token {t} row {r}"
            );
        }
    }
}

#[test]
fn matmul_equals_vec_dot_per_row_serial_and_parallel() {
    let mut rng = Rng::new(11);
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    // (rows, cols, tokens): small ones run serially; the last two pass the parallel
    // threshold, one with more tokens than a token block.
    for (rows, cols, n_tokens) in [(1, 256, 1), (37, 512, 3), (1000, 1024, 1), (300, 512, 17)] {
        for ty in types {
            let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
            let x = rng.activations(n_tokens * cols);
            let acts = acts_for(ty, &x, n_tokens, cols);
            let mut out = vec![f32::NAN; n_tokens * rows];
            matmul(ty, &weight, rows, cols, &acts, &mut out).unwrap();
            assert_matches_vec_dot(ty, &weight, rows, cols, &acts, &out);
        }
    }
}

#[test]
fn quantized_acts_match_quantize_row() {
    let mut rng = Rng::new(12);
    let mut buffer = ActsBuffer::new();
    // 40 tokens x 2048 columns takes the parallel path.
    for (ty, n_tokens, cols) in [(GgmlType::Q8_K, 40, 2048), (GgmlType::Q8_0, 3, 64)] {
        let x = rng.activations(n_tokens * cols);
        let acts = buffer.quantize(ty, &x, n_tokens, cols).unwrap();
        assert_eq!(
            (acts.ty(), acts.n_tokens(), acts.cols()),
            (ty, n_tokens, cols)
        );
        for t in 0..n_tokens {
            let mut row = vec![0u8; cols / ty.block_len() * ty.block_bytes()];
            quantize_row(ty, &x[t * cols..(t + 1) * cols], &mut row).unwrap();
            assert_eq!(acts.token(t).unwrap(), &row[..], "{ty} token {t}");
        }
        assert_eq!(acts.token(n_tokens), None);
    }
}

#[test]
fn quantize_into_caller_buffers_checks_their_lengths() {
    let x = vec![0.5f32; 96];
    let len = QuantizedActs::buffer_len(GgmlType::Q8_1, 3, 32).unwrap();
    // 3 rows of one 36-byte block; d and s for one group of 8 lanes.
    assert_eq!((len.bytes, len.scales), (3 * 36, 2 * 8));
    // One token has them too: the packed kernels read them.
    assert_eq!(
        QuantizedActs::buffer_len(GgmlType::Q8_1, 1, 32)
            .unwrap()
            .scales,
        2 * 8
    );
    // Q8_K (for the K-quants' packed kernels) too, with four words of sub-block pairs per
    // lane; Q8_0 without tokens has none.
    assert_eq!(
        QuantizedActs::buffer_len(GgmlType::Q8_K, 3, 256)
            .unwrap()
            .scales,
        (2 + 4) * 8
    );
    assert_eq!(
        QuantizedActs::buffer_len(GgmlType::Q8_0, 0, 256)
            .unwrap()
            .scales,
        0
    );

    let (mut bytes, mut scales) = (vec![0u8; len.bytes + 5], vec![0f32; len.scales]);
    let acts = QuantizedActs::quantize(GgmlType::Q8_1, &x, 3, 32, &mut bytes, &mut scales).unwrap();
    assert_eq!(acts.n_tokens(), 3);
    let mut short = vec![0u8; len.bytes - 1];
    assert_eq!(
        QuantizedActs::quantize(GgmlType::Q8_1, &x, 3, 32, &mut short, &mut scales).unwrap_err(),
        QuantError::BufferTooSmall {
            what: "activation bytes",
            needed: len.bytes,
            actual: len.bytes - 1
        }
    );
    assert_eq!(
        QuantizedActs::quantize(GgmlType::Q8_1, &x, 3, 32, &mut bytes, &mut []).unwrap_err(),
        QuantError::BufferTooSmall {
            what: "activation scales",
            needed: len.scales,
            actual: 0
        }
    );
    assert!(matches!(
        QuantizedActs::quantize(GgmlType::Q8_0, &x, 4, 32, &mut bytes, &mut scales),
        Err(QuantError::SizeMismatch {
            what: "activation elements",
            ..
        })
    ));
    assert_eq!(
        ActsBuffer::new()
            .quantize(GgmlType::Q4_K, &x[..0], 0, 256)
            .unwrap_err(),
        QuantError::Unsupported {
            op: "activation quantization",
            ty: GgmlType::Q4_K
        }
    );
}

#[test]
fn matmul_rejects_bad_operands() {
    let ty = GgmlType::Q4_0;
    let (rows, cols) = (4, 64);
    let weight = vec![0u8; rows * 2 * 18];
    let acts = acts_for(ty, &[0.25; 128], 2, cols);
    let mut out = vec![0f32; 2 * rows];

    let err = |ty, weight: &[u8], rows, cols, acts: &QuantizedActs<'_>, out: &mut [f32]| {
        matmul(ty, weight, rows, cols, acts, out).unwrap_err()
    };
    assert!(matches!(
        err(ty, &weight[1..], rows, cols, &acts, &mut out),
        QuantError::SizeMismatch {
            what: "weight bytes",
            ..
        }
    ));
    assert!(matches!(
        err(ty, &weight, rows, cols, &acts, &mut out[1..]),
        QuantError::SizeMismatch {
            what: "output elements",
            ..
        }
    ));
    assert!(matches!(
        err(ty, &weight, rows, 32, &acts, &mut out),
        QuantError::SizeMismatch {
            what: "activation columns",
            expected: 32,
            actual: 64
        }
    ));
    let odd = acts_for(GgmlType::F32, &[0.0; 66], 2, 33);
    assert!(matches!(
        err(GgmlType::F16, &weight, rows, 33, &odd, &mut out),
        QuantError::SizeMismatch {
            what: "weight bytes",
            ..
        }
    ));
    assert_eq!(
        err(GgmlType::Q4_1, &weight, rows, cols, &acts, &mut out),
        QuantError::ActivationType {
            weights: GgmlType::Q4_1,
            expected: GgmlType::Q8_1,
            actual: GgmlType::Q8_0
        }
    );
    let k_acts = acts_for(GgmlType::Q4_K, &[0.0; 256], 1, 256);
    assert!(matches!(
        err(GgmlType::Q8_K, &[0; 292], 1, 256, &k_acts, &mut [0.0]),
        QuantError::Unsupported {
            op: "vec_dot",
            ty: GgmlType::Q8_K
        }
    ));
    assert!(matches!(
        err(ty, &[], usize::MAX, cols, &acts, &mut out),
        QuantError::SizeOverflow { .. }
    ));
    // The right sizes work, and no tokens or no rows is an empty product.
    matmul(ty, &weight, rows, cols, &acts, &mut out).unwrap();
    matmul(ty, &[], 0, cols, &acts, &mut []).unwrap();
}

const PROP_TYPES: [GgmlType; 4] = [
    GgmlType::F16,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q6_K,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Arbitrary (often wrong) sizes: `matmul` returns an error or the right products, and
    /// never panics.
    #[test]
    fn matmul_never_panics_and_is_right_when_it_succeeds(
        type_index in 0..PROP_TYPES.len(),
        rows in 0usize..24,
        blocks in 0usize..4,
        n_tokens in 0usize..4,
        weight_delta in -1isize..=1,
        out_delta in -1isize..=1,
        cols_delta in -1isize..=1,
        seed in any::<u64>(),
    ) {
        let ty = PROP_TYPES[type_index];
        let cols = blocks * ty.block_len().max(32);
        let mut rng = Rng::new(seed);
        let x = rng.activations(n_tokens * cols);
        let acts = acts_for(ty, &x, n_tokens, cols);
        let mut weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
        weight.resize(weight.len().saturating_add_signed(weight_delta), 0);
        let mut out = vec![0f32; (n_tokens * rows).saturating_add_signed(out_delta)];
        let claimed_cols = cols.saturating_add_signed(cols_delta);

        let sizes_right = claimed_cols == cols
            && weight.len() == rows * (cols / ty.block_len()) * ty.block_bytes()
            && out.len() == n_tokens * rows;
        match matmul(ty, &weight, rows, claimed_cols, &acts, &mut out) {
            Ok(()) => {
                prop_assert!(sizes_right);
                assert_matches_vec_dot(ty, &weight, rows, cols, &acts, &out);
            }
            Err(_) => prop_assert!(!sizes_right),
        }
    }
}

/// `matmul_with`: the detected set is `matmul` itself, `Isa::Scalar` is the scalar reference
/// row by row (bit for bit, on the serial and the parallel path), every available set agrees
/// with it within rounding, and a set the CPU lacks is an error.
#[test]
fn matmul_with_picks_the_kernels_of_the_given_isa() {
    let mut rng = Rng::new(13);
    for (rows, cols, n_tokens) in [(9, 256, 2), (600, 512, 3)] {
        for ty in [
            GgmlType::F16,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_K,
        ] {
            let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
            let x = rng.activations(n_tokens * cols);
            let acts = acts_for(ty, &x, n_tokens, cols);
            let run = |isa: Isa| {
                let mut out = vec![f32::NAN; n_tokens * rows];
                matmul_with(isa, ty, &weight, rows, cols, &acts, &mut out).map(|()| out)
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut best = vec![f32::NAN; n_tokens * rows];
            matmul(ty, &weight, rows, cols, &acts, &mut best).unwrap();
            assert_eq!(bits(&run(Isa::detected()).unwrap()), bits(&best), "{ty}");

            let scalar = run(Isa::Scalar).unwrap();
            let reference = reference_kernel(ty).unwrap();
            let row_bytes = weight.len() / rows;
            for t in 0..n_tokens {
                for r in 0..rows {
                    let w = &weight[r * row_bytes..(r + 1) * row_bytes];
                    // SAFETY: the scalar reference needs no CPU feature.
                    let expected = unsafe { reference(w, acts.token(t).unwrap()) };
                    assert_eq!(scalar[t * rows + r].to_bits(), expected.to_bits(), "{ty}");
                }
            }
            for isa in Isa::ALL {
                if !isa.is_available() {
                    assert!(matches!(
                        run(isa),
                        Err(QuantError::Unsupported { ty: got, .. }) if got == ty
                    ));
                    continue;
                }
                // The kernels differ from the reference only in the order of their f32
                // additions: the tolerance of the kernel tests, relative to sum(|w| * |a|).
                let out = run(isa).unwrap();
                for t in 0..n_tokens {
                    let a = dequantized(ty.vec_dot_type(), acts.token(t).unwrap());
                    for r in 0..rows {
                        let w = dequantized(ty, &weight[r * row_bytes..(r + 1) * row_bytes]);
                        let tolerance = 1e-5 * magnitude(&w, &a);
                        let (got, want) = (out[t * rows + r], scalar[t * rows + r]);
                        assert!(
                            (f64::from(got) - f64::from(want)).abs() <= tolerance,
                            "{isa:?} {ty} token {t} row {r}: {got} vs scalar {want}"
                        );
                    }
                }
            }
        }
    }
    // Scalar and SIMD reject the same bad operands.
    let acts = acts_for(GgmlType::Q4_0, &[0.0; 32], 1, 32);
    assert!(matches!(
        matmul_with(
            Isa::Scalar,
            GgmlType::Q4_1,
            &[0; 20],
            1,
            32,
            &acts,
            &mut [0.0]
        ),
        Err(QuantError::ActivationType { .. })
    ));
}

/// The tile kernels (several tokens per weight row), and the rows decoded once for more tokens
/// than a tile (the codebook formats, Q3_K), against per-token products of the same
/// instruction set, bit for bit, and against the scalar reference within rounding: random
/// shapes with rows not a multiple of anything, odd block counts (the AVX-512 tail) and
/// 2..=37 tokens (full and short token groups), on every set this CPU has, AVX2 included.
#[test]
fn tiled_matmul_equals_per_token_matmul_and_scalar() {
    let mut rng = Rng::new(21);
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni]
        .into_iter()
        .filter(|isa| isa.is_available())
        .collect();
    for case in 0..24 {
        let rows = 1 + (rng.next_u64() % 45) as usize;
        let cols = 32 * (1 + (rng.next_u64() % 13) as usize);
        let n_tokens = 2 + case % 36;
        let n_tokens = if case == 23 { 37 } else { n_tokens };
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
            GgmlType::IQ1_S,
            GgmlType::IQ1_M,
            GgmlType::TQ1_0,
            GgmlType::TQ2_0,
            GgmlType::Q3_K,
        ] {
            // Super-blocks of 256: one to three.
            let cols = match ty.block_len() {
                256 => 256 * (1 + cols / 32 % 3),
                _ => cols,
            };
            let weight = random_blocks(&mut rng, ty, rows * cols / ty.block_len());
            let x = rng.activations(n_tokens * cols);
            let acts = acts_for(ty, &x, n_tokens, cols);
            let mut scalar = vec![f32::NAN; n_tokens * rows];
            matmul_with(Isa::Scalar, ty, &weight, rows, cols, &acts, &mut scalar).unwrap();
            for &isa in &isas {
                // Q5_0 has a tile on AVX2 only so far; elsewhere the tokens go one by one.
                // Q3_K has no tile: its rows are decoded once for more tokens than a tile.
                let k = isa.kernels(ty);
                match ty {
                    GgmlType::Q3_K => assert!(k.decoding.is_some(), "{isa:?} decodes {ty}"),
                    GgmlType::Q5_0 if isa != Isa::Avx2 => {}
                    _ => assert!(k.tile.is_some(), "{isa:?} has a {ty} tile"),
                }
                let mut out = vec![f32::NAN; n_tokens * rows];
                matmul_with(isa, ty, &weight, rows, cols, &acts, &mut out).unwrap();
                let row_bytes = weight.len() / rows;
                for t in 0..n_tokens {
                    let one = acts_for(ty, &x[t * cols..(t + 1) * cols], 1, cols);
                    let mut single = vec![f32::NAN; rows];
                    matmul_with(isa, ty, &weight, rows, cols, &one, &mut single).unwrap();
                    let a = dequantized(ty.vec_dot_type(), acts.token(t).unwrap());
                    for r in 0..rows {
                        let got = out[t * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            single[r].to_bits(),
                            "{isa:?} {ty} {rows}x{cols} token {t}/{n_tokens} row {r}"
                        );
                        let w = dequantized(ty, &weight[r * row_bytes..(r + 1) * row_bytes]);
                        let want = scalar[t * rows + r];
                        assert!(
                            (f64::from(got) - f64::from(want)).abs() <= 1e-5 * magnitude(&w, &a),
                            "{isa:?} {ty} token {t} row {r}: {got} vs scalar {want}"
                        );
                    }
                }
            }
        }
    }
}

/// The row kernels (one token, several weight rows per activation block) against that
/// instruction set's `vec_dot`, row by row, bit for bit: through `matmul_with` (serial and
/// parallel, rows past a row block) and called directly, with row counts that are not
/// multiples of the row tile and odd block counts (the AVX-512 tail).
#[test]
fn row_kernels_equal_vec_dot_per_row() {
    let mut rng = Rng::new(23);
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni]
        .into_iter()
        .filter(|isa| isa.is_available())
        .collect();
    for case in 0..20 {
        let rows = match case {
            0 => 1,
            1 => 131,
            2 => 1003,
            _ => 1 + (rng.next_u64() % 23) as usize,
        };
        let blocks = if case == 2 {
            33
        } else {
            1 + (rng.next_u64() % 13) as usize
        };
        let cols = 32 * blocks;
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let weight = random_blocks(&mut rng, ty, rows * blocks);
            let x = rng.activations(cols);
            let acts = acts_for(ty, &x, 1, cols);
            let a = acts.token(0).unwrap();
            let row_bytes = weight.len() / rows;
            for &isa in &isas {
                let kernel = isa.kernels(ty).vec_dot.unwrap();
                let expected: Vec<u32> = weight
                    .chunks_exact(row_bytes)
                    .map(|w| kernel.call(w, a).to_bits())
                    .collect();
                let mut out = vec![f32::NAN; rows];
                matmul_with(isa, ty, &weight, rows, cols, &acts, &mut out).unwrap();
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, expected, "{isa:?} {ty} {rows}x{cols} through matmul");
                if let Some(row_kernel) = isa.kernels(ty).rows {
                    let mut out = vec![f32::NAN; rows];
                    row_kernel.call(&weight, a, &mut out);
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, expected, "{isa:?} {ty} {rows}x{cols} row kernel");
                } else {
                    assert!(
                        isa == Isa::Avx2 || ty != GgmlType::Q4_1,
                        "{isa:?} has a {ty} row kernel"
                    );
                }
            }
        }
    }
}
