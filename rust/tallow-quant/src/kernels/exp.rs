//! The exponential the attention and activation kernels share, in scalar form (vector
//! versions use the same constants).

/// `exp(x)`, as Cephes' single-precision polynomial (relative error about 1e-7), written
/// so that loops over it vectorize; `x` is clamped to [-87, 88], so `exp(-inf)` is a value
/// under 2^-125 rather than 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let rounded = x * std::f32::consts::LOG2_E + EXP_ROUND;
    let n = rounded - EXP_ROUND;
    let r = x - n * EXP_LN2_HI + n * EXP_LN2_LO;
    let mut y = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        y = y * r + c;
    }
    y = y * (r * r) + r + 1.0;
    // The integer `n` (within -126..=127) is the difference of the bits of `rounded` and of
    // 1.5 * 2^23, which share their exponent: integer arithmetic that vectorizes, where a
    // float-to-int cast (saturating, NaN to 0) left part of each vector to scalar code.
    let n_bits = rounded.to_bits().wrapping_sub(EXP_ROUND.to_bits());
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// The constants of [`exp`], shared with the vector versions: the clamp, the rounding constant
/// (adding and subtracting 1.5 * 2^23 rounds to the nearest integer), ln 2 in two parts
/// (`x - n ln 2` = `x - n * HI + n * LO`) and the polynomial of `(e^r - 1 - r) / r^2`,
/// highest degree first.
pub(crate) const EXP_MIN: f32 = -87.0;
pub(crate) const EXP_MAX: f32 = 88.0;
pub(crate) const EXP_ROUND: f32 = 12_582_912.0;
pub(crate) const EXP_LN2_HI: f32 = 0.693_359_4;
pub(crate) const EXP_LN2_LO: f32 = 2.121_944_4e-4;
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn exp_is_close_to_std() {
        let mut worst = 0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let (got, want) = (f64::from(exp(x)), f64::from(x).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
        assert!(exp(f32::INFINITY).is_finite());
        assert_eq!(exp(0.0), 1.0);
    }
}
