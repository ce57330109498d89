//! Scalar conversions between f32 and the 16-bit float formats, with ggml's rounding.

/// IEEE half (stored little-endian) to f32. Exact for every input; NaN payloads are kept
/// as-is (not quieted), like numpy's conversion.
#[inline]
pub(crate) fn f16_to_f32(bits: [u8; 2]) -> f32 {
    let h = u32::from(u16::from_le_bytes(bits));
    let sign = (h & 0x8000) << 16;
    let exp_mant = h & 0x7fff;
    let magnitude = if exp_mant >= 0x7c00 {
        // Inf and NaN: all-ones exponent, mantissa widened.
        0x7f80_0000 | ((exp_mant & 0x3ff) << 13)
    } else {
        // Placing the half's exponent and mantissa in an f32 leaves the exponent biased by 15
        // instead of 127; multiplying by 2^112 fixes the bias exactly, subnormals included.
        (f32::from_bits(exp_mant << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(sign | magnitude)
}

/// f32 to IEEE half bytes, rounding to nearest even (`GGML_FP32_TO_FP16`).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// bfloat16 (stored little-endian) to f32: the upper half of the f32 bits.
#[inline]
pub(crate) fn bf16_to_f32(bits: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(bits)) << 16)
}

/// f32 to bfloat16 bytes as `ggml_compute_fp32_to_bf16`: NaN is forced quiet, everything else
/// rounds to nearest even.
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let b = if u & 0x7fff_ffff > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    (b as u16).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_to_f32_matches_half_for_every_value() {
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h.to_le_bytes());
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
                // Payload kept, not quieted.
                assert_eq!(ours.to_bits() & 0x007f_ffff, u32::from(h & 0x3ff) << 13);
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        let bf = |x: f32| u16::from_le_bytes(f32_to_bf16(x));
        assert_eq!(bf(1.0), 0x3f80);
        // Exactly half way between 0x3f80 and 0x3f81: ties to the even 0x3f80.
        assert_eq!(bf(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Half way between 0x3f81 and 0x3f82: ties to the even 0x3f82.
        assert_eq!(bf(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf(f32::from_bits(0x3f80_8001)), 0x3f81);
        // A signalling NaN comes back quiet.
        assert_eq!(bf(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(f32_to_bf16(-2.5)), -2.5);
    }
}
