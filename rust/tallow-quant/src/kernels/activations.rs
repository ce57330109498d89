//! Gated activations, `gate = act(gate) * up`: the loop written once, compiled by each
//! instruction set's wrappers for its vectors.

/// `gate = act(gate) * up`, in place (`gate` and `up` of one length).
pub(crate) type RawGated = unsafe fn(&mut [f32], &[f32]);

/// The gated activations one instruction set has of its own.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawActivations {
    pub(crate) silu: Option<RawGated>,
    pub(crate) gelu_tanh: Option<RawGated>,
    pub(crate) clamped_swiglu: Option<RawGated>,
}

impl RawActivations {
    /// This set's loops, each missing one taken from `below` (`None` for the scalar set,
    /// which has them all).
    pub(crate) fn resolve(self, below: Option<ActivationKernels>) -> ActivationKernels {
        let missing = "the scalar set has every activation";
        ActivationKernels {
            silu: self.silu.or(below.map(|b| b.silu)).expect(missing),
            gelu_tanh: self
                .gelu_tanh
                .or(below.map(|b| b.gelu_tanh))
                .expect(missing),
            clamped_swiglu: self
                .clamped_swiglu
                .or(below.map(|b| b.clamped_swiglu))
                .expect(missing),
        }
    }
}

/// The gated activations of an instruction set the running CPU has (see
/// [`crate::activation_kernels`]).
#[derive(Clone, Copy)]
pub struct ActivationKernels {
    silu: RawGated,
    gelu_tanh: RawGated,
    clamped_swiglu: RawGated,
}

impl ActivationKernels {
    /// `gate = silu(gate) * up`.
    pub fn silu(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len());
        // SAFETY: only built by the kernel table of a set the CPU has.
        unsafe { (self.silu)(gate, up) }
    }

    /// `gate = gelu(gate) * up`, GELU in its tanh form.
    pub fn gelu_tanh(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len());
        // SAFETY: as above.
        unsafe { (self.gelu_tanh)(gate, up) }
    }

    /// gpt-oss's clamped SwiGLU: `gate = g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)`
    /// with `g = min(gate, 7)`.
    pub fn clamped_swiglu(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len());
        // SAFETY: as above.
        unsafe { (self.clamped_swiglu)(gate, up) }
    }
}

/// `sqrt(2 / pi)`, of GELU's tanh approximation.
const GELU_C: f32 = 0.797_884_6;

/// `gate = act(gate) * up` for SiLU (`GELU` false) or GELU-tanh, written with [`crate::exp`] so that
/// it vectorizes: `gelu(x) = x * sigmoid(2c(x + 0.044715 x^3))` is the tanh form.
#[inline(always)]
pub(crate) fn gated_loop<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = if GELU {
            2.0 * GELU_C * (x + 0.044_715 * x * x * x)
        } else {
            x
        };
        *g = x / (1.0 + crate::exp(-z)) * u;
    }
}

/// The clamp of gpt-oss's SwiGLU (the gate from above, the up projection both ways) and the
/// slope of its sigmoid; neither is in the model file.
const SWIGLU_LIMIT: f32 = 7.0;
const SWIGLU_ALPHA: f32 = 1.702;

/// [`ActivationKernels::clamped_swiglu`], written to vectorize as [`gated_loop`].
#[inline(always)]
pub(crate) fn clamped_swiglu_loop(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(SWIGLU_LIMIT);
        let u = u.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT);
        *g = x / (1.0 + crate::exp(-SWIGLU_ALPHA * x)) * (u + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use crate::Isa;

    /// Every set's loops give the scalar set's bits (the same operations, vectorized).
    #[test]
    fn every_set_gives_the_scalar_bits() {
        let n = 1000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let scalar = Isa::Scalar.float_kernels().unwrap().activations;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for isa in Isa::ALL {
            let Some(kernels) = isa.float_kernels().map(|k| k.activations) else {
                continue;
            };
            let (mut got, mut want) = (gate.clone(), gate.clone());
            kernels.silu(&mut got, &up);
            scalar.silu(&mut want, &up);
            assert_eq!(bits(&got), bits(&want), "{isa:?} silu");
            let (mut got, mut want) = (gate.clone(), gate.clone());
            kernels.gelu_tanh(&mut got, &up);
            scalar.gelu_tanh(&mut want, &up);
            assert_eq!(bits(&got), bits(&want), "{isa:?} gelu");
            let (mut got, mut want) = (gate.clone(), gate.clone());
            kernels.clamped_swiglu(&mut got, &up);
            scalar.clamped_swiglu(&mut want, &up);
            assert_eq!(bits(&got), bits(&want), "{isa:?} clamped swiglu");
        }
    }
}
