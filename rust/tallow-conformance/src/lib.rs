//! One conformance suite for every backend, as llama.cpp's `test-backend-ops` runs each op of
//! each backend against the CPU: every operation of the seam ([`tallow_backend::Step`]) on
//! random inputs of awkward shapes, in every weight format and KV page type the backend
//! says it runs ([`tallow_backend::Capabilities`]), against scalar references computed in
//! f64 ([`mod@reference`]) within stated tolerances.
//!
//! A backend's crate runs the suite from one test file: it names the backend's variants (the
//! kernels it chooses between, each of which must pass) and its products' rounding bound in
//! an implementation of [`Subject`], and [`suite!`] writes one test per check.
//!
//! | check | reference | tolerance |
//! | --- | --- | --- |
//! | products, logits | f64 sums of the dequantized weights | [`Subject::products_bound`] of the magnitude `Σ|w·x|` |
//! | formats it does not run | refused by name, in its capabilities and at upload | exact |
//! | read rate | measured; the probe's buffers given back | 1 MB/s to 1 PB/s |
//! | embedding | dequantized rows, scaled | 1e-6 relative |
//! | norms, bias, add, gated activations | f64 formulas | [`ROWS_TOLERANCE`] |
//! | RoPE | `Rope::angles` (f32, as every backend takes them), rotation in f64 | [`ROPE_TOLERANCE`] |
//! | attention | f64 softmax over K/V rounded to the page type | [`attention_tolerance`] |
//! | mixture-of-experts blocks | each token's experts one by one, f64 | three times the products' bound |
//! | greedy tokens | the host's argmax of the logits the same step returns | exact |
//! | drawn tokens (temperature, top-k, top-p, min-p) | the host's `draw_rows` of the logits the same step returns | exact |

mod checks;
mod harness;
pub mod reference;

pub use checks::*;
pub use harness::{assert_close, random, widen};

use tallow_backend::Backend;
use tallow_quant::GgmlType;

/// Which of a backend's kernels a check runs: each check runs on every variant of its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Products of weights and activations (matrix products and the LM head).
    Products,
    /// Operations that reduce along a row: norms, attention, the greedy argmax.
    Reductions,
    /// Everything else (embedding, element-wise operations, RoPE).
    Other,
}

/// A backend under test.
pub trait Subject {
    /// The backend.
    type Backend: Backend;

    /// The backend in each variant that runs other kernels for `family` (options, number
    /// formats, reductions), made one at a time as the iterator is read: a check holds each
    /// only while it runs (some devices keep threads of their own busy).
    fn variants(family: Family) -> impl Iterator<Item = Self::Backend>;

    /// The backend with buffers of at most `bytes`, where it splits larger matrices and
    /// logits into parts; `None` where it has no such limit.
    fn capped(bytes: u64) -> Option<Self::Backend>;

    /// The variant in messages.
    fn describe(backend: &Self::Backend) -> String;

    /// The bound of the rounding error of `backend`'s products of `ty` weights, relative to
    /// their magnitude `Σ|w·x|`.
    fn products_bound(backend: &Self::Backend, ty: GgmlType) -> f64;
}

/// Largest difference from the f64 references of norms, bias, residual adds and gated
/// activations, on values of magnitude about one.
pub const ROWS_TOLERANCE: f64 = 2e-5;

/// Largest difference of rotated values from the reference's.
pub const ROPE_TOLERANCE: f64 = 1e-5;

/// One test per check of the suite for the [`Subject`] `$subject`.
#[macro_export]
macro_rules! suite {
    ($subject:ty) => {
        #[test]
        fn products_match_the_dequantized_weights_in_every_format() {
            $crate::products_match_the_dequantized_weights::<$subject>();
        }

        #[test]
        fn formats_it_does_not_run_are_refused_by_name() {
            $crate::formats_it_does_not_run_are_refused_by_name::<$subject>();
        }

        #[test]
        fn read_rate_is_measured_and_leaves_no_memory_behind() {
            $crate::read_rate_is_measured_and_leaves_no_memory_behind::<$subject>();
        }

        #[test]
        fn matrices_past_the_buffer_limit_are_split_by_rows() {
            $crate::matrices_past_the_buffer_limit_are_split::<$subject>();
        }

        #[test]
        fn embeddings_are_the_dequantized_rows_in_every_format() {
            $crate::embeddings_are_the_dequantized_rows::<$subject>();
        }

        #[test]
        fn row_operations_match_the_reference() {
            $crate::row_operations_match_the_reference::<$subject>();
        }

        #[test]
        fn rope_matches_the_reference() {
            $crate::rope_matches_the_reference::<$subject>();
        }

        #[test]
        fn logits_are_soft_capped_products() {
            $crate::logits_are_soft_capped_products::<$subject>();
        }

        #[test]
        fn greedy_tokens_are_the_argmax_of_the_logits() {
            $crate::greedy_tokens_are_the_argmax_of_the_logits::<$subject>();
        }

        #[test]
        fn drawn_tokens_are_the_host_draws() {
            $crate::drawn_tokens_are_the_host_draws::<$subject>();
        }

        #[test]
        fn chosen_tokens_logits_are_columns_of_the_logits() {
            $crate::chosen_tokens_logits_are_columns_of_the_logits::<$subject>();
        }

        #[test]
        fn output_rows_are_the_planned_rows() {
            $crate::output_rows_are_the_planned_rows::<$subject>();
        }

        #[test]
        fn experts_match_the_reference() {
            $crate::experts_match_the_reference::<$subject>();
        }

        #[test]
        fn paged_attention_matches_the_reference_for_every_kv_type() {
            $crate::paged_attention_matches_the_reference::<$subject>();
        }
    };
}
