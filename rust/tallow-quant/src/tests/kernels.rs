//! Every SIMD kernel against the scalar reference, on random blocks.

use crate::kernels::{reference_kernel, Isa, RawVecDot};
use crate::testing::Rng;
use crate::testing::{dequantized, extreme_blocks, magnitude, random_acts, random_blocks};
use crate::GgmlType;

/// Allowed |simd - reference| relative to `sum(|w| * |a|)`: the kernels differ from the
/// reference only in the order of their f32 additions.
const RELATIVE_TOLERANCE: f64 = 1e-5;

/// The formats the default models use, which must have a SIMD kernel on every instruction
/// set.
const MANDATORY: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Element counts with odd and even block counts, so two-block loops meet their tail, and
/// float rows that are not a multiple of the vector width.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let blocks: &[usize] = match ty.block_len() {
        1 => &[1, 7, 8, 31, 64, 257, 1000],
        32 => &[1, 2, 3, 5, 8, 33],
        _ => &[1, 2, 3, 5],
    };
    blocks.iter().map(|b| b * ty.block_len()).collect()
}

/// Checks `kernel` against the reference on random rows of `ty`.
fn check_kernel(name: &str, ty: GgmlType, kernel: RawVecDot) {
    let reference = reference_kernel(ty).unwrap();
    let mut rng = Rng::new(0x5eed + u64::from(ty.id()));
    for n in lengths(ty) {
        for _ in 0..8 {
            let w = random_blocks(&mut rng, ty, n / ty.block_len());
            let (_, a) = random_acts(&mut rng, ty, n);
            // SAFETY: the reference needs no CPU feature; `kernel` was handed out for this CPU.
            let (expected, got) = unsafe { (reference(&w, &a), kernel(&w, &a)) };
            let mag = magnitude(&dequantized(ty, &w), &dequantized(ty.vec_dot_type(), &a));
            let tolerance = RELATIVE_TOLERANCE * mag;
            assert!(
                (f64::from(got) - f64::from(expected)).abs() <= tolerance,
                "{name} {ty} n={n}: got {got}, reference {expected} (tolerance {tolerance:e})"
            );
        }
    }
}

/// The SIMD kernels of every instruction set this CPU has, taken straight from their modules
/// (not through the dispatch, so that AVX2 is tested on AVX-512 machines too).
fn simd_kernels() -> Vec<(&'static str, GgmlType, RawVecDot)> {
    #[allow(unused_mut)]
    let mut kernels: Vec<(&'static str, GgmlType, RawVecDot)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        // Both AVX2 products of the formats with a `pdep` one: the table holds the one this
        // CPU runs faster.
        if Isa::Avx2.is_available() {
            for ty in [
                GgmlType::IQ1_S,
                GgmlType::IQ1_M,
                GgmlType::IQ2_S,
                GgmlType::IQ3_S,
            ] {
                let without = crate::kernels::pdep_vec_dot(ty, false);
                kernels.extend(without.map(|k| ("avx2, no pdep", ty, k)));
                if is_x86_feature_detected!("bmi2") {
                    let with = crate::kernels::pdep_vec_dot(ty, true);
                    kernels.extend(with.map(|k| ("avx2, pdep", ty, k)));
                }
            }
        }
        for ty in GgmlType::WEIGHTS {
            if Isa::Avx2.is_available() {
                kernels.extend(Isa::Avx2.own_row(ty).vec_dot.map(|k| ("avx2", ty, k)));
            }
            if Isa::Avx512.is_available() {
                kernels.extend(Isa::Avx512.own_row(ty).vec_dot.map(|k| ("avx512bw", ty, k)));
            }
            if Isa::Avx512Vnni.is_available() {
                kernels.extend(
                    Isa::Avx512Vnni
                        .own_row(ty)
                        .vec_dot
                        .map(|k| ("avx512vnni", ty, k)),
                );
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    for ty in GgmlType::WEIGHTS {
        if Isa::Neon.is_available() {
            kernels.extend(Isa::Neon.own_row(ty).vec_dot.map(|k| ("neon", ty, k)));
        }
    }
    kernels
}

#[test]
fn every_simd_kernel_matches_the_reference() {
    let kernels = simd_kernels();
    for &(name, ty, kernel) in &kernels {
        check_kernel(name, ty, kernel);
    }
    let tested = |isa: &str| kernels.iter().filter(|k| k.0 == isa).count();
    if Isa::Avx2.is_available() {
        assert_eq!(
            tested("avx2"),
            GgmlType::WEIGHTS.len(),
            "AVX2 has a kernel for every weight format"
        );
    }
    if Isa::Avx512Vnni.is_available() {
        assert_eq!(tested("avx512bw"), MANDATORY.len());
        assert_eq!(tested("avx512vnni"), MANDATORY.len());
    }
    if Isa::Neon.is_available() {
        assert_eq!(
            tested("neon"),
            MANDATORY.len() + 1,
            "NEON: the mandatory formats and F32"
        );
    }
    eprintln!("tested {} SIMD kernels", kernels.len());
}

#[test]
fn mandatory_formats_have_simd_kernels() {
    #[cfg(target_arch = "x86_64")]
    for ty in MANDATORY {
        assert!(Isa::Avx2.own_row(ty).vec_dot.is_some(), "avx2 {ty}");
        assert!(Isa::Avx512.own_row(ty).vec_dot.is_some(), "avx512bw {ty}");
        assert!(
            Isa::Avx512Vnni.own_row(ty).vec_dot.is_some(),
            "avx512vnni {ty}"
        );
    }
    #[cfg(target_arch = "aarch64")]
    for ty in MANDATORY {
        assert!(Isa::Neon.own_row(ty).vec_dot.is_some(), "neon {ty}");
    }
}

/// Through the dispatch, every available set gives a kernel for every weight format
/// (falling back where it has none) that agrees with the reference.
#[test]
fn dispatch_covers_every_format_on_every_available_isa() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
        for ty in GgmlType::WEIGHTS {
            let kernel = isa
                .kernels(ty)
                .vec_dot
                .unwrap_or_else(|| panic!("{isa:?} {ty}"));
            let mut rng = Rng::new(7);
            let n = 2 * ty.block_len().max(32);
            let w = random_blocks(&mut rng, ty, n / ty.block_len());
            let (_, a) = random_acts(&mut rng, ty, n);
            // SAFETY: the reference needs no CPU feature.
            let expected = unsafe { reference_kernel(ty).unwrap()(&w, &a) };
            let mag = magnitude(&dequantized(ty, &w), &dequantized(ty.vec_dot_type(), &a));
            let diff = f64::from(kernel.call(&w, &a) - expected).abs();
            assert!(diff <= RELATIVE_TOLERANCE * mag, "{isa:?} {ty}");
        }
        for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
            assert!(
                isa.kernels(ty).vec_dot.is_none(),
                "{ty} is not a weight format"
            );
        }
    }
}

/// Every kernel returns +0.0 for empty rows, as `matmul` does for zero columns.
#[test]
fn empty_rows_are_positive_zero() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
        for ty in GgmlType::WEIGHTS {
            let kernel = isa.kernels(ty).vec_dot.unwrap();
            assert_eq!(kernel.call(&[], &[]).to_bits(), 0, "{isa:?} {ty}");
        }
    }
}

#[test]
fn detection_picks_the_best_available_isa() {
    let detected = Isa::detected();
    assert!(detected.is_available());
    let best = Isa::ALL.into_iter().rev().find(|isa| isa.is_available());
    assert_eq!(Some(detected), best);
    #[cfg(target_arch = "x86_64")]
    assert!(!Isa::Neon.is_available());
}

/// Extreme quants: every activation at +-127 and weights at the ends of their ranges, where
/// 16-bit intermediate sums would saturate if a kernel got its operand ranges wrong.
#[test]
fn extreme_values_do_not_saturate() {
    let mut rng = Rng::new(99);
    for &(name, ty, kernel) in &simd_kernels() {
        let n = 4 * ty.block_len().max(64);
        let x: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let act_ty = ty.vec_dot_type();
        let mut a = vec![0u8; n / act_ty.block_len() * act_ty.block_bytes()];
        crate::quantize_row(act_ty, &x, &mut a).unwrap();
        // All-ones bytes put every quant at its maximum (and every Q8_0 weight at -1; the
        // 0x80 bytes below give -128).
        for fill in [0xffu8, 0x80] {
            let w = extreme_blocks(&mut rng, ty, n / ty.block_len(), fill);
            // SAFETY: as in `check_kernel`.
            let (expected, got) =
                unsafe { (reference_kernel(ty).unwrap()(&w, &a), kernel(&w, &a)) };
            let mag = magnitude(&dequantized(ty, &w), &dequantized(act_ty, &a));
            let diff = (f64::from(got) - f64::from(expected)).abs();
            assert!(
                diff <= RELATIVE_TOLERANCE * mag,
                "{name} {ty} fill {fill:#x}: {got} vs {expected}"
            );
        }
    }
}

/// Each set's table: a dot product for every weight format; the tile and row kernels of the
/// set that gave it (never another set's, whose bits differ); packed kernels for every packable
/// format except on NEON; a quantizer for every type the scalar code quantizes; and nothing
/// at all for a set the CPU lacks.
#[test]
fn every_table_resolves_its_fallbacks() {
    for isa in Isa::ALL {
        for ty in GgmlType::ALL {
            let k = isa.kernels(ty);
            if !isa.is_available() {
                assert!(k.vec_dot.is_none() && k.packed.is_none() && k.quantize.is_none());
                continue;
            }
            assert_eq!(
                k.vec_dot.is_some(),
                GgmlType::WEIGHTS.contains(&ty),
                "{isa:?} {ty}"
            );
            let chain = std::iter::successors(Some(isa), |i| i.fallback());
            if let Some(giver) = chain.map(|i| i.own_row(ty)).find(|r| r.vec_dot.is_some()) {
                assert_eq!(k.tile.is_some(), giver.tile.is_some(), "{isa:?} {ty} tile");
                assert_eq!(k.rows.is_some(), giver.rows.is_some(), "{isa:?} {ty} rows");
            }
            let packable = crate::PACKED_FORMATS.contains(&ty) && isa != Isa::Neon;
            assert_eq!(k.packed.is_some(), packable, "{isa:?} {ty} packed");
            let quantizes = crate::reference::quantize::quantizer(ty).is_some();
            assert_eq!(k.quantize.is_some(), quantizes, "{isa:?} {ty} quantizer");
        }
    }
}
