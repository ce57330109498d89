//! The attention kernels of the running CPU's set against the portable loops and the
//! definitions.

use super::AttentionKernels;
use super::{loops, weight, KvBlock, WEIGHT_CUTOFF};
use crate::testing::Rng;
use crate::Isa;

/// The attention kernels of every set the CPU has, with the set's name.
fn every_set() -> Vec<(Isa, AttentionKernels)> {
    Isa::ALL
        .into_iter()
        .filter_map(|isa| Some((isa, isa.float_kernels()?.attention)))
        .collect()
}

#[test]
fn a_weight_is_exp_down_to_the_cutoff_and_zero_below_it_or_for_nan() {
    assert_eq!(weight(0.0), 1.0);
    let near = WEIGHT_CUTOFF + 0.5;
    assert!((f64::from(weight(near)) / f64::from(near).exp() - 1.0).abs() < 1e-6);
    assert_eq!(weight(WEIGHT_CUTOFF - 0.5), 0.0);
    assert_eq!(weight(f32::NEG_INFINITY), 0.0);
    assert_eq!(weight(f32::NAN), 0.0);
}

/// Every set's kernels agree with the portable loops (the ones a CPU without AVX2 runs, and
/// any head size or page size the SIMD kernel does not take).
#[test]
fn every_sets_kernels_agree_with_the_portable_loops() {
    for (isa, kernel) in every_set() {
        agrees_with_the_portable_loops(isa, kernel);
    }
}

fn agrees_with_the_portable_loops(isa: Isa, kernel: AttentionKernels) {
    let mut rng = Rng::new(11);
    for hd in [64, 128, 40, 48, 256] {
        for n in (1..=20).chain([31, 32, 33, 47, 48, 63, 64, 70]) {
            let q: Vec<f32> = (0..hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let keys: Vec<f32> = (0..n * hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let values: Vec<f32> = (0..n * hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let mut start = vec![0f32; hd + 2];
            start[0] = 0.5;
            start[1] = 2.0;
            start[2..]
                .iter_mut()
                .for_each(|v| *v = rng.range(-2.0, 2.0));
            let (mut a, mut b) = (start.clone(), start.clone());
            kernel.page(&mut a, &q, &keys, &values, &mut vec![0.0; n]);
            loops::page(&mut b, &q, &keys, &values, &mut vec![0.0; n]);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "{isa:?} hd {hd} n {n}"
                );
            }
        }
    }
}

/// Every set's f16 widening equals `half`'s for every f16 value.
#[test]
fn widening_matches_half_for_every_value() {
    use half::f16;
    let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for (isa, kernel) in every_set() {
        widens_as_half(isa, kernel, &src);
    }
}

fn widens_as_half(isa: Isa, kernel: AttentionKernels, src: &[half::f16]) {
    let mut out = vec![0f32; src.len()];
    kernel.read(KvBlock::F16(src), 1, &mut out);
    for (s, o) in src.iter().zip(&out) {
        let want = s.to_f32();
        assert!(
            want.to_bits() == o.to_bits() || (want.is_nan() && o.is_nan()),
            "{isa:?} {s}"
        );
    }
}

/// Several query rows in one call give each row the bits it gets alone, on every set.
#[test]
fn rows_together_equal_rows_alone() {
    for (isa, kernel) in every_set() {
        rows_together_equal_rows_alone_on(isa, kernel);
    }
}

fn rows_together_equal_rows_alone_on(isa: Isa, kernel: AttentionKernels) {
    let mut rng = Rng::new(12);
    for (hd, rows) in [
        (64, 3),
        (64, 4),
        (64, 7),
        (128, 2),
        (128, 3),
        (40, 2),
        (256, 5),
        (24, 6),
    ] {
        for n in [1, 5, 16, 17, 40, 64] {
            let q: Vec<f32> = (0..rows * hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let keys: Vec<f32> = (0..n * hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let values: Vec<f32> = (0..n * hd).map(|_| rng.range(-2.0, 2.0)).collect();
            let start: Vec<f32> = (0..rows * (hd + 2)).map(|_| rng.range(-2.0, 2.0)).collect();
            let mut together = start.clone();
            kernel.page(&mut together, &q, &keys, &values, &mut vec![0.0; n]);
            for r in 0..rows {
                let mut alone = start[r * (hd + 2)..(r + 1) * (hd + 2)].to_vec();
                let q = &q[r * hd..(r + 1) * hd];
                kernel.page(&mut alone, q, &keys, &values, &mut vec![0.0; n]);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let got = &together[r * (hd + 2)..(r + 1) * (hd + 2)];
                assert_eq!(
                    bits(got),
                    bits(&alone),
                    "{isa:?} hd {hd} rows {rows} n {n} row {r}"
                );
            }
        }
    }
}
