//! Dequantization against hashes of `gguf.quants.dequantize`'s output (the Python port of
//! ggml's `dequantize_row_*`) on the same seeded random blocks, so the Rust tests keep the
//! oracle's verdict without Python. tests/test_quant.py checks the same thing through the
//! Python binding on fresh data.

use crate::testing::f16_fields;
use crate::testing::Rng;
use crate::GgmlType;

/// `blocks` blocks of random bytes whose f16 fields hold random finite halves (any finite
/// value, subnormals included), so that no NaN reaches a float operation.
pub(crate) fn golden_blocks(ty: GgmlType, blocks: usize) -> Vec<u8> {
    let mut rng = Rng::new(0x601d + u64::from(ty.id()));
    let mut bytes = rng.bytes(blocks * ty.block_bytes());
    let fields: &[usize] = if ty == GgmlType::F16 {
        &[0]
    } else {
        f16_fields(ty)
    };
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &offset in fields {
            let mut h = rng.next_u64() as u16;
            if h & 0x7c00 == 0x7c00 {
                h ^= 0x4000;
            }
            block[offset..offset + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    bytes
}

/// FNV-1a of the little-endian f32 output of `gguf.quants.dequantize` on
/// `golden_blocks(ty, 64)` (gguf 0.19.0, numpy 2.4).
const GGUF_HASHES: [(GgmlType, u64); 13] = [
    (GgmlType::F32, 0x82bf_df6a_ed47_9acc),
    (GgmlType::F16, 0x2004_cd9e_9a35_80f4),
    (GgmlType::BF16, 0xd64b_a1d3_c82f_07dc),
    (GgmlType::Q4_0, 0xa823_bb88_4d93_c7bc),
    (GgmlType::Q4_1, 0xe7df_282f_f914_d802),
    (GgmlType::Q5_0, 0x1134_bd0a_04f5_e4ac),
    (GgmlType::Q5_1, 0xa16c_90e6_0a70_3e78),
    (GgmlType::Q8_0, 0xf997_5438_bfaf_b208),
    (GgmlType::Q2_K, 0x5a48_5b59_8f5b_4f6a),
    (GgmlType::Q3_K, 0x490d_ddce_ed3b_c2a5),
    (GgmlType::Q4_K, 0xdec9_9e02_fb6b_e234),
    (GgmlType::Q5_K, 0x59a5_199a_6df2_690c),
    (GgmlType::Q6_K, 0x571c_a25c_7820_7ae0),
];

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn dequantize_is_bit_identical_to_gguf() {
    for (ty, expected) in GGUF_HASHES {
        let out = crate::testing::dequantized(ty, &golden_blocks(ty, 64));
        assert_eq!(out.len(), 64 * ty.block_len());
        let hash = fnv1a(out.iter().flat_map(|v| v.to_le_bytes()));
        assert_eq!(
            hash, expected,
            "{ty}: dequantized output differs from gguf's"
        );
    }
}
