//! Dequantization against hashes of `gguf.quants.dequantize`'s output (the Python port of
//! ggml's `dequantize_row_*`) on the same seeded random blocks, so the Rust tests keep the
//! oracle's verdict without Python. tests/test_quant.py checks the same thing through the
//! Python binding on fresh data.

use crate::testing::f16_fields;
use crate::testing::Rng;
use crate::{GgmlType, Isa};

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

/// Values for the quantizer hashes: 256-value blocks of eight kinds in turn (signed,
/// non-negative, zeros, one constant, signed with outliers, tiny (below ggml's 1e-15 group
/// threshold), non-positive, sparse), each `r * 2^(e - 23)` for integers `|r| < 2^23`, so
/// that scripts/ggml_quantize_hashes.py builds the same floats.
fn golden_values(blocks: usize) -> Vec<f32> {
    let mut rng = Rng::new(0x9017_0a17);
    let centred = |rng: &mut Rng| ((rng.next_u64() >> 40) as i64 - (1 << 23)) as f32;
    let pow2 = |n: i32| f32::from_bits(((127 + n) as u32) << 23);
    let mut values = Vec::with_capacity(blocks * 256);
    for block in 0..blocks {
        let kind = block % 8;
        let e = if kind == 5 { -80 } else { -12 } + (rng.next_u64() % 15) as i32;
        let scale = pow2(e - 23);
        let constant = centred(&mut rng) * scale;
        for i in 0..256 {
            let v = centred(&mut rng) * scale;
            values.push(match kind {
                1 => v.abs(),
                2 => 0.0,
                3 => constant,
                4 if i % 37 == 0 => v * 64.0,
                6 => -v.abs(),
                7 if i % 11 != 0 => 0.0,
                _ => v,
            });
        }
    }
    values
}

/// FNV-1a of ggml's `ggml_quantize_chunk` output (no importance matrix: the
/// `quantize_row_*_ref` functions) on `golden_values(64)`, one row of 256 per block, from
/// scripts/ggml_quantize_hashes.py against libggml-base of llama.cpp 11434.
const GGML_QUANTIZE_HASHES: [(GgmlType, u64); 7] = [
    (GgmlType::Q2_K, 0xf055_866e_68b4_b6c7),
    (GgmlType::Q3_K, 0xb106_c8c7_0e9d_24ea),
    (GgmlType::Q4_K, 0xc472_d838_cab3_39c1),
    (GgmlType::Q5_K, 0x3ac9_c28a_518b_2bf3),
    (GgmlType::Q6_K, 0x2823_7ded_8383_320b),
    (GgmlType::IQ4_NL, 0xfc6a_9c93_e00a_a1e0),
    (GgmlType::IQ4_XS, 0x7407_ea8b_62ea_83b9),
];

#[test]
fn k_and_iq4_quants_quantize_bit_identically_to_ggml() {
    let x = golden_values(64);
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
        for (ty, expected) in GGML_QUANTIZE_HASHES {
            let mut q = vec![0u8; ty.bytes_for(64 * 256).unwrap() as usize];
            isa.kernels(ty).quantize.unwrap().call(&x, &mut q);
            let hash = fnv1a(q);
            assert_eq!(
                hash, expected,
                "{isa:?} {ty}: quantized bytes differ from ggml's"
            );
        }
    }
}
