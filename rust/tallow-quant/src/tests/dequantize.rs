//! The SIMD dequantizers (Q8_0 and Q4_0, the KV cache's formats) give the scalar reference's
//! bits, on random blocks and on blocks whose scale is zero, subnormal or the largest f16.

use crate::fp16::f32_to_f16;
use crate::reference::dequantize::dequantize as reference;
use crate::testing::{random_blocks, Rng};
use crate::{GgmlType, Isa};

#[test]
fn every_dequantizer_gives_the_reference_bits() {
    let mut rng = Rng::new(7);
    let mut checked = 0;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        let mut bytes = random_blocks(&mut rng, ty, 64);
        for (block, scale) in bytes
            .chunks_exact_mut(ty.block_bytes())
            .zip([0.0, -0.0, 6e-8, -3e-5, 65504.0, -65504.0])
        {
            block[..2].copy_from_slice(&f32_to_f16(scale));
        }
        let mut want = vec![0f32; 64 * 32];
        reference(ty, &bytes, &mut want);
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
            let Some(kernel) = isa.kernels(ty).dequantize else {
                continue;
            };
            let mut got = vec![f32::NAN; 64 * 32];
            kernel.call(&bytes, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa:?} {ty}");
            checked += 1;
        }
    }
    assert!(
        checked >= 2 || !Isa::Avx2.is_available(),
        "the AVX2 dequantizers are tested"
    );
}
