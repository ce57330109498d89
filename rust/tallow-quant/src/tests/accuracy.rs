//! The formats against their error bounds: integer dot products against float dot products
//! of the dequantized values, and quantize/dequantize round trips.

use crate::blocks::{as_blocks, BlockQ4_1, BlockQ5_1, BlockQ8_1};
use crate::fp16::f16_to_f32;
use crate::kernels::reference_kernel;
use crate::testing::Rng;
use crate::testing::{dequantized, exact_dot, magnitude, random_acts, random_blocks};
use crate::{dequantize, quantize_row, vec_dot, GgmlType, QuantError};

/// f32 rounding of the reference, relative to `sum(|w| * |a|)`.
const ROUNDING: f64 = 1e-5;

/// For Q4_1/Q5_1: the offset term uses the activation block's stored sum `s`, an f16 of
/// `d * sum(q)` computed with the unrounded `d`, so it differs from the sum of the
/// dequantized activations by up to about 2^-10 of `|m * s|` per block.
fn offset_rounding(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    let blocks_a = as_blocks::<BlockQ8_1>(a);
    let m: Vec<f32> = match ty {
        GgmlType::Q4_1 => as_blocks::<BlockQ4_1>(w)
            .iter()
            .map(|b| f16_to_f32(b.m))
            .collect(),
        GgmlType::Q5_1 => as_blocks::<BlockQ5_1>(w)
            .iter()
            .map(|b| f16_to_f32(b.m))
            .collect(),
        _ => return 0.0,
    };
    m.iter()
        .zip(blocks_a)
        .map(|(&m, a)| f64::from(m * f16_to_f32(a.s)).abs() * 2f64.powi(-10))
        .sum()
}

#[test]
fn integer_dot_matches_dot_of_dequantized_values() {
    let mut rng = Rng::new(1);
    for ty in GgmlType::WEIGHTS {
        for blocks in [1, 4, 9] {
            let n = blocks * ty.block_len().max(32);
            let w = random_blocks(&mut rng, ty, n / ty.block_len());
            let (_, a) = random_acts(&mut rng, ty, n);
            let (wf, af) = (dequantized(ty, &w), dequantized(ty.vec_dot_type(), &a));
            // SAFETY: the reference needs no CPU feature.
            let got = unsafe { reference_kernel(ty).unwrap()(&w, &a) };
            let bound = ROUNDING * magnitude(&wf, &af) + offset_rounding(ty, &w, &a);
            let err = (f64::from(got) - exact_dot(&wf, &af)).abs();
            assert!(err <= bound, "{ty} n={n}: error {err:e} > {bound:e}");
        }
    }
}

/// Largest |x| of each block of `block_len` values.
fn block_amax(x: &[f32], block_len: usize) -> Vec<f32> {
    x.chunks(block_len)
        .map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs())))
        .collect()
}

/// Against the original f32 activations, the dot product is off by at most the activation
/// quantization error: within each block |x - x_q| <= d / 2 (plus the f16 rounding of d for
/// Q8_0/Q8_1), d = amax / 127.
#[test]
fn vec_dot_is_within_activation_quantization_error() {
    let mut rng = Rng::new(2);
    for ty in GgmlType::WEIGHTS {
        let act_ty = ty.vec_dot_type();
        let per_amax = match act_ty {
            GgmlType::Q8_0 | GgmlType::Q8_1 => 0.5 / 127.0 + 2f64.powi(-11),
            GgmlType::Q8_K => 0.5 / 127.0 + 1e-6,
            _ => 0.0,
        };
        for blocks in [1, 3, 8] {
            let n = blocks * ty.block_len().max(32);
            let w = random_blocks(&mut rng, ty, n / ty.block_len());
            let (x, a) = random_acts(&mut rng, ty, n);
            let wf = dequantized(ty, &w);
            let got = vec_dot(ty, &w, &a, n).unwrap();
            let amax = block_amax(&x, act_ty.block_len().max(32));
            let quantization: f64 = wf
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    f64::from(w.abs()) * f64::from(amax[i / act_ty.block_len().max(32)]) * per_amax
                })
                .sum();
            let bound = quantization + ROUNDING * magnitude(&wf, &x) + offset_rounding(ty, &w, &a);
            let err = (f64::from(got) - exact_dot(&wf, &x)).abs();
            assert!(err <= bound, "{ty} n={n}: error {err:e} > {bound:e}");
        }
    }
}

/// Largest |x - dequantize(quantize(x))| allowed for one element of a block.
fn round_trip_bound(ty: GgmlType, block: &[f32], x: f32) -> f32 {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (min, max) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let f16_eps = 2f32.powi(-11);
    // Rounding within the grid, plus the f16 rounding of the scale times the largest quant,
    // plus that of the stored minimum.
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => x.abs() * f16_eps,
        GgmlType::BF16 => x.abs() * 2f32.powi(-8),
        GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 127.0 * (0.501 + 127.0 * f16_eps),
        GgmlType::Q8_K => amax / 127.0 * 0.501,
        // The element of largest magnitude maps just past the top quant and is clamped:
        // a full step of error on that side.
        GgmlType::Q4_0 => amax / 8.0 * (1.001 + 8.0 * f16_eps),
        GgmlType::Q5_0 => amax / 16.0 * (1.001 + 16.0 * f16_eps),
        GgmlType::Q4_1 => {
            let d = (max - min) / 15.0;
            d * (0.501 + 15.0 * f16_eps) + min.abs() * f16_eps
        }
        GgmlType::Q5_1 => {
            let d = (max - min) / 31.0;
            d * (0.501 + 31.0 * f16_eps) + min.abs() * f16_eps
        }
        _ => unreachable!("{ty} has no quantize_row"),
    }
}

#[test]
fn quantize_then_dequantize_stays_within_the_format_error() {
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ];
    let mut rng = Rng::new(3);
    for ty in types {
        for _ in 0..20 {
            let n = 2 * 256;
            let x = rng.activations(n);
            let mut q = vec![0u8; n / ty.block_len() * ty.block_bytes()];
            quantize_row(ty, &x, &mut q).unwrap();
            let y = dequantized(ty, &q);
            let block_len = ty.block_len().max(32);
            let mut worst = 0f32;
            for (b, (xs, ys)) in x.chunks(block_len).zip(y.chunks(block_len)).enumerate() {
                for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                    let bound = round_trip_bound(ty, xs, x);
                    assert!(
                        (x - y).abs() <= bound,
                        "{ty} block {b} element {i}: {x} came back as {y} (bound {bound})"
                    );
                    worst = worst.max((x - y).abs());
                }
            }
            if ty != GgmlType::F32 {
                assert!(worst > 0.0, "{ty} lost nothing: the test data is too easy");
            }
        }
    }
}

#[test]
fn q8_0_rounds_half_away_from_zero_and_q8_k_half_to_even() {
    // With amax = 127 the scale is exactly 1, so x * (1 / d) lands on exact halves.
    let mut x = [0f32; 256];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    let mut q8_0 = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &x[..32], &mut q8_0).unwrap();
    assert_eq!(&q8_0[2..6], &[127, 3, (-3i8) as u8, 4]);

    // Q8_K scales by -127 / max = -1 and rounds ties to even: -2.5 -> -2, 2.5 -> 2, -3.5 -> -4.
    let mut q8_k = [0u8; 292];
    quantize_row(GgmlType::Q8_K, &x, &mut q8_k).unwrap();
    assert_eq!(f32::from_le_bytes(q8_k[0..4].try_into().unwrap()), -1.0);
    assert_eq!(
        &q8_k[4..8],
        &[(-127i8) as u8, (-2i8) as u8, 2, (-4i8) as u8]
    );
    // The first group's sum: -127 - 2 + 2 - 4.
    assert_eq!(i16::from_le_bytes([q8_k[260], q8_k[261]]), -131);
}

#[test]
fn q8_1_stores_the_scaled_sum_of_its_quants() {
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
    let mut b = [0u8; 36];
    quantize_row(GgmlType::Q8_1, &x, &mut b).unwrap();
    let d = 21.0f32 / 127.0;
    let qs: Vec<i32> = b[4..].iter().map(|&q| i32::from(q as i8)).collect();
    assert_eq!(qs[31], 127);
    let sum: i32 = qs.iter().sum();
    assert_eq!(
        f16_to_f32([b[2], b[3]]),
        half::f16::from_f32(sum as f32 * d).to_f32()
    );
}

#[test]
fn dequantize_decodes_hand_built_blocks() {
    // Q4_0: d = 0.5, byte j = (j & 0xf) | 0xf0: elements 0..16 are 0.5 * (j - 8), elements
    // 16..32 are 0.5 * 7.
    let mut block = vec![0u8; 18];
    block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
    for j in 0..16 {
        block[2 + j] = j as u8 | 0xf0;
    }
    let y = dequantized(GgmlType::Q4_0, &block);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
        assert_eq!(y[j + 16], 3.5);
    }

    // Q4_K: d = 1, dmin = 0.25, scales 1..=8 and mins 0..8 for the eight groups, all
    // nibbles 3 (low) and 5 (high): group g holds sc_g * q - 0.25 * m_g.
    let mut block = vec![0u8; 144];
    block[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    block[2..4].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
    let (sc, m): ([u8; 8], [u8; 8]) = ([1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7]);
    for j in 0..4 {
        block[4 + j] = sc[j];
        block[8 + j] = m[j];
        block[12 + j] = sc[j + 4] | (m[j + 4] << 4);
    }
    block[16..].fill(0x53);
    let y = dequantized(GgmlType::Q4_K, &block);
    for g in 0..8 {
        let q = if g % 2 == 0 { 3.0 } else { 5.0 };
        let expected = f32::from(sc[g]) * q - 0.25 * f32::from(m[g]);
        assert!(
            y[32 * g..32 * g + 32].iter().all(|&v| v == expected),
            "group {g}"
        );
    }
}

#[test]
fn entry_points_reject_bad_sizes() {
    let mut out = [0f32; 64];
    assert_eq!(
        dequantize(GgmlType::Q4_0, &[0; 19], &mut out[..32]),
        Err(QuantError::PartialBlock {
            what: "dequantize source",
            ty: GgmlType::Q4_0,
            len: 19,
            block_bytes: 18
        })
    );
    assert!(matches!(
        dequantize(GgmlType::Q4_0, &[0; 18], &mut out[..31]),
        Err(QuantError::SizeMismatch {
            expected: 32,
            actual: 31,
            ..
        })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0.0; 33], &mut [0; 34]),
        Err(QuantError::NotWholeBlocks {
            len: 33,
            block_len: 32,
            ..
        })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut [0; 35]),
        Err(QuantError::SizeMismatch {
            expected: 34,
            actual: 35,
            ..
        })
    ));
    assert_eq!(
        quantize_row(GgmlType::IQ2_XXS, &[0.0; 256], &mut [0; 66]),
        Err(QuantError::Unsupported {
            op: "quantize_row",
            ty: GgmlType::IQ2_XXS
        })
    );
    assert!(matches!(
        vec_dot(GgmlType::Q4_0, &[0; 18], &[0; 36], 32),
        Err(QuantError::SizeMismatch {
            expected: 34,
            actual: 36,
            ..
        })
    ));
    assert!(matches!(
        vec_dot(GgmlType::Q4_0, &[0; 17], &[0; 34], 32),
        Err(QuantError::SizeMismatch {
            expected: 18,
            actual: 17,
            ..
        })
    ));
    assert!(matches!(
        vec_dot(GgmlType::Q8_K, &[0; 292], &[0; 292], 256),
        Err(QuantError::Unsupported { op: "vec_dot", .. })
    ));
    assert_eq!(vec_dot(GgmlType::Q4_0, &[], &[], 0), Ok(0.0));
}
