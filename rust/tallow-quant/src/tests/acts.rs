//! The activation quantizers of every instruction set give the scalar quantizer's bytes, on
//! random rows and on the cases where rounding or scaling is delicate.

use crate::reference::quantize::quantizer;
use crate::testing::Rng;
use crate::{GgmlType, Isa};

/// Rows of 64 values that test rounding and scaling: random magnitudes, values that scale to
/// exact halves, zeros, subnormals, one huge value, infinities and NaN.
fn hard_rows(rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    for exponent in [-140, -126, -60, -10, 0, 10, 60, 120] {
        let scale = 2f32.powi(exponent);
        rows.push((0..64).map(|_| rng.range(-1.0, 1.0) * scale).collect());
    }
    // With amax 127, the scale is 1: every k + 0.5 is a tie.
    let mut halves: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) + 0.5).collect();
    halves[0] = 127.0;
    halves[32] = -127.0;
    rows.push(halves);
    // Just below and above the halves.
    for nudge in [f32::next_down, f32::next_up] {
        let mut row: Vec<f32> = (0..64).map(|i| nudge((i % 100) as f32 + 0.5)).collect();
        row[0] = 127.0;
        row[32] = 127.0;
        rows.push(row);
    }
    rows.push(vec![0.0; 64]);
    rows.push(vec![-0.0; 64]);
    let mut mixed = vec![1.0f32; 64];
    mixed[3] = f32::INFINITY;
    mixed[40] = f32::NAN;
    rows.push(mixed);
    let mut huge = vec![1e-3f32; 64];
    huge[7] = f32::MAX;
    huge[50] = -f32::MAX;
    rows.push(huge);
    rows
}

#[test]
fn every_quantizer_gives_the_scalar_bytes() {
    let mut rng = Rng::new(31);
    let mut rows = hard_rows(&mut rng);
    for _ in 0..200 {
        rows.push(rng.activations(64));
    }
    // Q8_K's blocks of 256: four hard rows side by side, random rows, and a tie for the
    // largest magnitude between signs (the first one sets the scale's sign).
    let mut long: Vec<Vec<f32>> = rows.chunks_exact(4).map(|r| r.concat()).collect();
    long.extend((0..50).map(|_| rng.activations(256)));
    let mut tie: Vec<f32> = (0..256).map(|i| (i % 7) as f32 * 0.25).collect();
    (tie[9], tie[200]) = (-5.0, 5.0);
    long.push(tie);
    // Rows of many Q8_0/Q8_1 blocks, which the quantizers take several at a time: the hard
    // blocks at every place of a group, with the blocks left over after the last group.
    let hard = hard_rows(&mut rng).concat();
    let mut wide: Vec<Vec<f32>> = (0..hard.len() / 32)
        .map(|shift| {
            hard[32 * shift..]
                .iter()
                .chain(&hard[..32 * shift])
                .copied()
                .collect()
        })
        .collect();
    wide.extend((0..20).map(|_| rng.activations(576)));
    wide.extend(rows.iter().cloned());
    let mut checked = 0;
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            let rows = if ty == GgmlType::Q8_K { &long } else { &wide };
            let kernel = isa.kernels(ty).quantize.unwrap();
            for (i, x) in rows.iter().enumerate() {
                let bytes = x.len() / ty.block_len() * ty.block_bytes();
                let (mut want, mut got) = (vec![0u8; bytes], vec![0u8; bytes]);
                quantizer(ty).unwrap()(x, &mut want);
                kernel.call(x, &mut got);
                assert_eq!(got, want, "{isa:?} {ty} row {i}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 2 * wide.len() + long.len());
}

#[test]
fn quant_sums_equal_one_chain_of_adds() {
    let mut rng = Rng::new(5);
    let mut blocks: Vec<[i8; 32]> = vec![[-128; 32], [127; 32], [0; 32]];
    blocks.extend((0..100).map(|_| std::array::from_fn(|_| rng.range(-128.0, 128.0) as i8)));
    for qs in &blocks {
        let want: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(crate::acts::quant_sum(qs), want, "{qs:?}");
    }
}
