//! What the kernels ask of the running x86 CPU beyond its instruction sets, asked once.

use std::arch::x86_64::__cpuid;
use std::sync::OnceLock;

/// The running CPU's family where AMD made it: bits 8-11 of leaf 1's EAX, plus the extended
/// family (bits 20-27) where those read 0xF (0x17 Zen and Zen 2, 0x19 Zen 3 and Zen 4, 0x1A
/// Zen 5).
pub(super) fn amd_family() -> Option<u32> {
    static FAMILY: OnceLock<Option<u32>> = OnceLock::new();
    *FAMILY.get_or_init(|| {
        // Leaf 0: the maker's name in EBX, EDX, ECX.
        let id = __cpuid(0);
        if [id.ebx, id.edx, id.ecx] != [0x6874_7541, 0x6974_6e65, 0x444d_4163] {
            return None;
        }
        let eax = __cpuid(1).eax;
        Some(match (eax >> 8) & 0xF {
            0xF => 0xF + ((eax >> 20) & 0xFF),
            base => base,
        })
    })
}

/// Whether BMI2's `pdep` is fast here: a few cycles on Intel's cores and on AMD's from Zen 3
/// on; AMD's earlier cores run it in microcode, up to hundreds of cycles each.
pub(super) fn fast_pdep() -> bool {
    is_x86_feature_detected!("bmi2") && amd_family().is_none_or(|family| family >= 0x19)
}
