//! Geometry of the pool: how many values a page holds and where each one lives.

use std::fmt;

use crate::error::{KvError, Result};

/// Element type the pool stores K and V in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE half precision (the default, as in llama.cpp).
    #[default]
    F16,
    /// Single precision.
    F32,
    /// bfloat16: f32's range with 8 bits of precision (f16 has 11 and a range of 65504),
    /// for models whose keys or values outgrow f16.
    Bf16,
    /// GGML's Q8_0: blocks of 32 values, an f16 scale and 32 signed bytes (8.5 bits a value).
    Q8_0,
    /// GGML's Q4_0: blocks of 32 values, an f16 scale and 32 nibbles (4.5 bits a value).
    Q4_0,
}

impl KvDtype {
    /// Every type, the default first.
    pub const ALL: [KvDtype; 5] = [
        KvDtype::F16,
        KvDtype::F32,
        KvDtype::Bf16,
        KvDtype::Q8_0,
        KvDtype::Q4_0,
    ];

    /// Bytes of `n` values (a whole number of blocks for the quantized types).
    pub const fn bytes_for(self, n: usize) -> usize {
        match (self, self.block_format()) {
            (KvDtype::F16 | KvDtype::Bf16, _) => 2 * n,
            (KvDtype::F32, _) => 4 * n,
            (_, Some(ty)) => n / ty.block_len() * ty.block_bytes(),
            (_, None) => panic!("the other types have a block format"),
        }
    }

    /// The GGML block format of a quantized type.
    pub const fn block_format(self) -> Option<tallow_quant::GgmlType> {
        match self {
            KvDtype::F16 | KvDtype::F32 | KvDtype::Bf16 => None,
            KvDtype::Q8_0 => Some(tallow_quant::GgmlType::Q8_0),
            KvDtype::Q4_0 => Some(tallow_quant::GgmlType::Q4_0),
        }
    }

    /// The element type of its rows as a GGML type: F16, F32, BF16 or the block format.
    pub const fn element_type(self) -> tallow_quant::GgmlType {
        match (self, self.block_format()) {
            (KvDtype::F16, _) => tallow_quant::GgmlType::F16,
            (KvDtype::F32, _) => tallow_quant::GgmlType::F32,
            (KvDtype::Bf16, _) => tallow_quant::GgmlType::BF16,
            (_, Some(ty)) => ty,
            (_, None) => panic!("the other types have a block format"),
        }
    }

    /// Its name: `f16`, `f32`, `bf16`, `q8_0` or `q4_0`.
    pub const fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// The type named `name` (see [`KvDtype::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// Keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvKind {
    /// Keys.
    Key = 0,
    /// Values.
    Value = 1,
}

/// Shape of the KV pool.
///
/// A page holds `page_size` consecutive token positions of one sequence, for the
/// `page_layers` layers of one layer group (every layer unless sliding windows split them, see
/// [`crate::LayerGroups`]) and every KV head, keys and values. The pool stores them as
/// `[page_layers][K, V][n_head_kv][page][page_size][head_dim]`: the keys (or values) of one
/// (layer, KV head) for a whole page are one contiguous `page_size * head_dim` block, and the
/// blocks of consecutive pages follow each other, so that attention over a sequence whose
/// pages were allocated in order reads each head's history as one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Transformer layers.
    pub n_layer: usize,
    /// Layers one page holds: `n_layer`, or the size of a layer group.
    pub page_layers: usize,
    /// Key/value heads per layer (after grouped-query sharing).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Token positions per page.
    pub page_size: usize,
    /// Storage type.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Tokens per page unless configured otherwise.
    pub const DEFAULT_PAGE_SIZE: usize = 16;

    /// A layout with the default page size (16) and dtype (f16).
    pub const fn new(n_layer: usize, n_head_kv: usize, head_dim: usize) -> Self {
        KvLayout {
            n_layer,
            page_layers: n_layer,
            n_head_kv,
            head_dim,
            page_size: Self::DEFAULT_PAGE_SIZE,
            dtype: KvDtype::F16,
        }
    }

    /// The same layout with another page size.
    pub const fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size;
        self
    }

    /// The same layout with pages of `page_layers` layers (one layer group's).
    pub const fn with_page_layers(mut self, page_layers: usize) -> Self {
        self.page_layers = page_layers;
        self
    }

    /// The same layout with another dtype.
    pub const fn with_dtype(mut self, dtype: KvDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Checks that every dimension is non-zero and that a page's size is addressable.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("n_layer", self.n_layer),
            ("page_layers", self.page_layers),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("page_size", self.page_size),
        ] {
            if v == 0 {
                return Err(KvError::InvalidLayout(format!("{name} must be at least 1")));
            }
        }
        if self.dtype.block_format().is_some() && !self.head_dim.is_multiple_of(32) {
            return Err(KvError::InvalidLayout(format!(
                "{} pages need heads of a multiple of 32 values, not {}",
                self.dtype.name(),
                self.head_dim
            )));
        }
        if self.page_layers > self.n_layer {
            return Err(KvError::InvalidLayout(format!(
                "a page cannot hold {} of {} layers",
                self.page_layers, self.n_layer
            )));
        }
        self.bytes_per_page().map(|_| ())
    }

    /// Values in one (layer, K or V, KV head) block of a page: `page_size * head_dim`.
    pub fn block_len(&self) -> usize {
        self.page_size * self.head_dim
    }

    /// Values of one token in one layer for K (or V): `n_head_kv * head_dim`, the row the
    /// forward pass produces.
    pub fn row_len(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Values in one page: `2 * page_layers * n_head_kv * head_dim * page_size`.
    pub fn elems_per_page(&self) -> Result<usize> {
        [
            self.page_layers,
            self.n_head_kv,
            self.head_dim,
            self.page_size,
        ]
        .into_iter()
        .try_fold(2usize, |acc, d| acc.checked_mul(d))
        .filter(|&n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| KvError::InvalidLayout(format!("page of {self:?} is too large")))
    }

    /// Bytes in one page: [`KvLayout::elems_per_page`] values of the dtype.
    pub fn bytes_per_page(&self) -> Result<usize> {
        Ok(self.dtype.bytes_for(self.elems_per_page()?))
    }

    /// Bytes of one position of one head (a row of `head_dim` values) in the dtype.
    pub fn row_bytes(&self) -> usize {
        self.dtype.bytes_for(self.head_dim)
    }

    /// Pages needed to hold `n_tokens` positions.
    pub fn pages_for_tokens(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.page_size.max(1))
    }
}

/// How much memory the pool may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvBudget {
    /// At most this many bytes (rounded down to whole pages).
    Bytes(u64),
    /// Exactly this many pages.
    Pages(usize),
}

impl fmt::Display for KvBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvBudget::Bytes(b) => write!(f, "{b} bytes"),
            KvBudget::Pages(p) => write!(f, "{p} pages"),
        }
    }
}

/// Largest number of pages a pool may have: page ids are `u32`, and one value is reserved.
pub const MAX_PAGES: usize = u32::MAX as usize - 1;

/// Number of pages the pool gets for `budget` with `layout`: whole pages only, at least one.
///
/// Errors: an invalid layout, a budget too small for one page
/// ([`KvError::BudgetTooSmall`]), or a pool past [`MAX_PAGES`] pages or `isize::MAX` bytes
/// ([`KvError::PoolTooLarge`]).
pub fn pages_for_budget(layout: &KvLayout, budget: KvBudget) -> Result<usize> {
    layout.validate()?;
    let page_bytes = layout.bytes_per_page()?;
    let pages = match budget {
        KvBudget::Bytes(b) => usize::try_from(b / page_bytes as u64).unwrap_or(usize::MAX),
        KvBudget::Pages(p) => p,
    };
    if pages == 0 {
        return Err(KvError::BudgetTooSmall { budget, page_bytes });
    }
    let max = MAX_PAGES.min(isize::MAX as usize / page_bytes);
    if pages > max {
        return Err(KvError::PoolTooLarge { pages, max });
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_page_counts_k_and_v_of_every_layer() {
        let l = KvLayout::new(32, 8, 128);
        assert_eq!(l.page_size, 16);
        assert_eq!(l.dtype, KvDtype::F16);
        assert_eq!(l.bytes_per_page().unwrap(), 2 * 32 * 8 * 128 * 16 * 2);
        let l = l.with_dtype(KvDtype::F32).with_page_size(32);
        assert_eq!(l.bytes_per_page().unwrap(), 2 * 32 * 8 * 128 * 32 * 4);
        assert_eq!(l.block_len(), 32 * 128);
        assert_eq!(l.row_len(), 8 * 128);
        assert_eq!(l.pages_for_tokens(0), 0);
        assert_eq!(l.pages_for_tokens(32), 1);
        assert_eq!(l.pages_for_tokens(33), 2);
    }

    #[test]
    fn zero_dimensions_are_rejected() {
        let err = KvLayout::new(2, 0, 4).validate().unwrap_err();
        assert_eq!(
            err,
            KvError::InvalidLayout("n_head_kv must be at least 1".into())
        );
        let err = KvLayout::new(2, 2, 4)
            .with_page_size(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("page_size"), "{err}");
        let huge = KvLayout::new(usize::MAX / 2, 4, 4);
        assert!(matches!(huge.validate(), Err(KvError::InvalidLayout(_))));
    }

    #[test]
    fn budget_in_bytes_rounds_down_to_whole_pages() {
        let l = KvLayout::new(2, 2, 4).with_page_size(4); // 2*2*2*4*4*2 = 256 bytes
        assert_eq!(l.bytes_per_page().unwrap(), 256);
        assert_eq!(pages_for_budget(&l, KvBudget::Bytes(256)).unwrap(), 1);
        assert_eq!(pages_for_budget(&l, KvBudget::Bytes(1023)).unwrap(), 3);
        assert_eq!(pages_for_budget(&l, KvBudget::Pages(7)).unwrap(), 7);
    }

    #[test]
    fn budget_below_one_page_is_a_clear_error() {
        let l = KvLayout::new(2, 2, 4).with_page_size(4);
        let err = pages_for_budget(&l, KvBudget::Bytes(255)).unwrap_err();
        assert_eq!(
            err,
            KvError::BudgetTooSmall {
                budget: KvBudget::Bytes(255),
                page_bytes: 256
            }
        );
        assert_eq!(
            err.to_string(),
            "KV cache budget of 255 bytes cannot hold one page of 256 bytes"
        );
        let err = pages_for_budget(&l, KvBudget::Pages(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "KV cache budget of 0 pages cannot hold one page of 256 bytes"
        );
    }

    #[test]
    fn budget_past_addressable_pages_is_an_error() {
        let l = KvLayout::new(1, 1, 1).with_page_size(1);
        let err = pages_for_budget(&l, KvBudget::Pages(MAX_PAGES + 1)).unwrap_err();
        assert!(matches!(err, KvError::PoolTooLarge { .. }), "{err}");
        let err = pages_for_budget(&l, KvBudget::Bytes(u64::MAX)).unwrap_err();
        assert!(matches!(err, KvError::PoolTooLarge { .. }), "{err}");
    }
}
