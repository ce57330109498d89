//! llama.cpp's file types (`llama-quantize`'s `--type`, the `general.file_type` of a GGUF):
//! the format each matrix of a model gets, chosen as `llama-quantize` chooses it without an
//! importance matrix, so that a conversion to Q4_K_M holds the tensors llama.cpp's would.
//!
//! A mixture keeps more bits where quantization hurts most: the output layer (and the
//! embedding it is tied to) in Q6_K, and for the `_M` types the value projections and
//! feed-forward down projections of the first and last eighth of the layers and of every
//! third layer between.

use tallow_gguf::GgmlType;

/// A file type: one format for every matrix, or one of llama.cpp's K-quant mixtures.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// Every file type with its name, its number in `general.file_type` (llama.cpp's
/// `LLAMA_FTYPE_MOSTLY_*`) and the format of the matrices the mixture does not change.
const FILE_TYPES: [(FileType, &str, u32, GgmlType); 19] = [
    (FileType::F32, "F32", 0, GgmlType::F32),
    (FileType::F16, "F16", 1, GgmlType::F16),
    (FileType::BF16, "BF16", 32, GgmlType::BF16),
    (FileType::Q4_0, "Q4_0", 2, GgmlType::Q4_0),
    (FileType::Q4_1, "Q4_1", 3, GgmlType::Q4_1),
    (FileType::Q5_0, "Q5_0", 8, GgmlType::Q5_0),
    (FileType::Q5_1, "Q5_1", 9, GgmlType::Q5_1),
    (FileType::Q8_0, "Q8_0", 7, GgmlType::Q8_0),
    (FileType::Q2_K, "Q2_K", 10, GgmlType::Q2_K),
    (FileType::Q3_K_S, "Q3_K_S", 11, GgmlType::Q3_K),
    (FileType::Q3_K_M, "Q3_K_M", 12, GgmlType::Q3_K),
    (FileType::Q3_K_L, "Q3_K_L", 13, GgmlType::Q3_K),
    (FileType::Q4_K_S, "Q4_K_S", 14, GgmlType::Q4_K),
    (FileType::Q4_K_M, "Q4_K_M", 15, GgmlType::Q4_K),
    (FileType::Q5_K_S, "Q5_K_S", 16, GgmlType::Q5_K),
    (FileType::Q5_K_M, "Q5_K_M", 17, GgmlType::Q5_K),
    (FileType::Q6_K, "Q6_K", 18, GgmlType::Q6_K),
    (FileType::IQ4_NL, "IQ4_NL", 25, GgmlType::IQ4_NL),
    (FileType::IQ4_XS, "IQ4_XS", 30, GgmlType::IQ4_XS),
];

/// Names `llama-quantize` also takes for a mixture.
const ALIASES: [(&str, FileType); 3] = [
    ("Q3_K", FileType::Q3_K_M),
    ("Q4_K", FileType::Q4_K_M),
    ("Q5_K", FileType::Q5_K_M),
];

/// What of the model the mixtures look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub n_layer: usize,
    /// Query heads per key/value head.
    pub n_gqa: u64,
    /// Experts of a mixture of experts (0 for a dense model).
    pub n_expert: u64,
    /// No `output.weight`: the output layer is the token embedding.
    pub tied_embeddings: bool,
    /// A Llama of 80 layers with grouped-query attention: llama.cpp's 70B, whose small value
    /// projections get more bits.
    pub is_70b: bool,
}

/// The kinds of tensor the mixtures tell apart (llama.cpp's `tensor_category`), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Output,
    TokenEmbd,
    /// Value projections, alone or fused with Q and K.
    AttnV,
    AttnK,
    AttnOutput,
    FfnDown,
    Other,
}

impl Role {
    fn of(name: &str) -> Role {
        if name == "output.weight" {
            Role::Output
        } else if name == "token_embd.weight" {
            Role::TokenEmbd
        } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
            .iter()
            .any(|s| name.contains(s))
        {
            Role::AttnV
        } else if name.contains("attn_k.weight") {
            Role::AttnK
        } else if name.contains("attn_output.weight") {
            Role::AttnOutput
        } else if name.contains("ffn_down") {
            Role::FfnDown
        } else {
            Role::Other
        }
    }
}

/// The layer of a `blk.N.` tensor.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third
/// layer between.
fn more_bits(layer: usize, n_layer: usize) -> bool {
    layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2
}

impl FileType {
    /// The file type called `name` (`"Q4_K_M"`, `"q8_0"`: any case; `Q4_K` is Q4_K_M as for
    /// `llama-quantize`).
    pub fn named(name: &str) -> Option<FileType> {
        FILE_TYPES
            .iter()
            .map(|&(ty, n, ..)| (n, ty))
            .chain(ALIASES)
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, ty)| ty)
    }

    /// Every file type's name, for messages.
    pub fn names() -> Vec<&'static str> {
        FILE_TYPES.iter().map(|&(_, n, ..)| n).collect()
    }

    fn entry(self) -> &'static (FileType, &'static str, u32, GgmlType) {
        FILE_TYPES
            .iter()
            .find(|e| e.0 == self)
            .expect("every file type is listed")
    }

    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Its number in `general.file_type`.
    pub fn id(self) -> u32 {
        self.entry().2
    }

    /// The format of the matrices the mixture leaves alone.
    pub fn base(self) -> GgmlType {
        self.entry().3
    }

    /// The format of the matrix `name` whose rows are `ncols` long, in a model of `model`'s
    /// shape (vectors are not asked about: they keep their precision).
    pub fn matrix_type(self, name: &str, ncols: u64, model: &ModelShape) -> GgmlType {
        let base = self.base();
        if matches!(base, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return base;
        }
        fallback(self.mixed(name, ncols, model), ncols)
    }

    /// llama.cpp's `llama_tensor_get_type_impl` for these file types.
    fn mixed(self, name: &str, ncols: u64, model: &ModelShape) -> GgmlType {
        use FileType as F;
        use GgmlType as T;
        let base = self.base();
        let role = Role::of(name);
        let layer = layer_of(name).unwrap_or(0);
        let n_layer = model.n_layer;
        let experts8 = model.n_expert == 8;
        if role == Role::Output || (role == Role::TokenEmbd && model.tied_embeddings) {
            return if !ncols.is_multiple_of(base.block_len() as u64) {
                T::Q8_0
            } else if base != T::Q8_0 {
                T::Q6_K
            } else {
                base
            };
        }
        match role {
            Role::AttnV => {
                // Each layer has one value projection, so the layer counts them in order.
                let ty = match self {
                    F::Q2_K if model.n_gqa >= 4 => T::Q4_K,
                    F::Q2_K => T::Q3_K,
                    F::Q3_K_M if layer < 2 => T::Q5_K,
                    F::Q3_K_M => T::Q4_K,
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if more_bits(layer, n_layer) => T::Q6_K,
                    F::Q4_K_S if layer < 4 => T::Q5_K,
                    F::IQ4_NL | F::IQ4_XS if model.n_gqa >= 4 => T::Q5_K,
                    _ => base,
                };
                if experts8 {
                    T::Q8_0
                } else if model.is_70b && matches!(ty, T::Q3_K | T::Q4_K) {
                    T::Q5_K
                } else {
                    ty
                }
            }
            Role::AttnK if experts8 => T::Q8_0,
            Role::FfnDown => match self {
                F::Q2_K => T::Q3_K,
                F::Q3_K_M if layer < n_layer / 16 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if more_bits(layer, n_layer) => T::Q6_K,
                F::Q4_K_S | F::IQ4_NL | F::IQ4_XS if layer < n_layer / 8 => T::Q5_K,
                _ => base,
            },
            Role::AttnOutput if experts8 => match self {
                F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M => T::Q5_K,
                F::IQ4_NL | F::IQ4_XS => T::Q5_K,
                _ => base,
            },
            Role::AttnOutput => match self {
                F::Q2_K => T::Q3_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                _ => base,
            },
            _ => base,
        }
    }
}

/// A format whose blocks fit rows of `ncols`: llama.cpp's `tensor_type_fallback` (a
/// 256-element K-quant becomes a 32-element format of about as many bits; F16 where even
/// that does not fit).
fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols.is_multiple_of(ty.block_len() as u64) {
        return ty;
    }
    let smaller = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        other => other,
    };
    if ncols.is_multiple_of(smaller.block_len() as u64) {
        smaller
    } else {
        GgmlType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(n_layer: usize) -> ModelShape {
        ModelShape {
            n_layer,
            n_gqa: 4,
            n_expert: 0,
            tied_embeddings: false,
            is_70b: false,
        }
    }

    #[test]
    fn names_and_aliases() {
        assert_eq!(FileType::named("q4_k_m"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::named("Q4_K"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::named("bf16"), Some(FileType::BF16));
        assert_eq!(FileType::named("Q4_K_X"), None);
        assert_eq!(FileType::Q4_K_M.id(), 15);
        for name in FileType::names() {
            assert_eq!(FileType::named(name).unwrap().name(), name);
        }
    }

    #[test]
    fn q4_k_m_gives_more_bits_to_an_eighth_at_each_end_and_every_third_layer() {
        // 32 layers: 0..4 and 28..32, and 4 + 3k + 2 between.
        let want: Vec<usize> = (0..4).chain((6..28).step_by(3)).chain(28..32).collect();
        let model = dense(32);
        for role in ["attn_v", "ffn_down"] {
            let got: Vec<usize> = (0..32)
                .filter(|l| {
                    let name = format!("blk.{l}.{role}.weight");
                    FileType::Q4_K_M.matrix_type(&name, 4096, &model) == GgmlType::Q6_K
                })
                .collect();
            assert_eq!(got, want, "{role}");
        }
        let q = FileType::Q4_K_M.matrix_type("blk.5.attn_q.weight", 4096, &model);
        assert_eq!(q, GgmlType::Q4_K);
    }

    #[test]
    fn the_output_layer_and_a_tied_embedding_keep_six_bits() {
        let mut model = dense(2);
        for ft in [FileType::Q4_0, FileType::Q3_K_S, FileType::Q5_K_M] {
            assert_eq!(ft.matrix_type("output.weight", 512, &model), GgmlType::Q6_K);
            assert_ne!(
                ft.matrix_type("token_embd.weight", 512, &model),
                GgmlType::Q6_K
            );
        }
        model.tied_embeddings = true;
        let embd = FileType::Q4_K_S.matrix_type("token_embd.weight", 512, &model);
        assert_eq!(embd, GgmlType::Q6_K);
        // Q8_0 stays Q8_0; rows that are no whole number of Q6_K blocks take Q8_0.
        assert_eq!(
            FileType::Q8_0.matrix_type("output.weight", 512, &model),
            GgmlType::Q8_0
        );
        assert_eq!(
            FileType::Q4_K_M.matrix_type("output.weight", 576, &model),
            GgmlType::Q8_0
        );
    }

    #[test]
    fn rows_that_no_block_fits_fall_back() {
        let model = dense(2);
        let at = |ft: FileType, ncols| ft.matrix_type("blk.1.attn_q.weight", ncols, &model);
        assert_eq!(at(FileType::Q4_K_M, 64), GgmlType::Q5_0);
        assert_eq!(at(FileType::Q5_K_S, 64), GgmlType::Q5_1);
        assert_eq!(at(FileType::Q6_K, 64), GgmlType::Q8_0);
        assert_eq!(at(FileType::Q3_K_S, 64), GgmlType::Q4_0);
        assert_eq!(at(FileType::Q4_K_M, 48), GgmlType::F16);
        assert_eq!(at(FileType::Q4_0, 48), GgmlType::F16);
        assert_eq!(at(FileType::F16, 48), GgmlType::F16);
    }

    #[test]
    fn eight_experts_keep_attention_values_and_keys_in_eight_bits() {
        let mut model = dense(32);
        model.n_expert = 8;
        for name in ["blk.3.attn_v.weight", "blk.3.attn_k.weight"] {
            let ty = FileType::Q4_K_M.matrix_type(name, 4096, &model);
            assert_eq!(ty, GgmlType::Q8_0, "{name}");
        }
        let out = FileType::Q4_K_M.matrix_type("blk.3.attn_output.weight", 4096, &model);
        assert_eq!(out, GgmlType::Q5_K);
    }
}
