//! Size checks shared by the public entry points: every buffer length is validated here
//! before a kernel sees it.

use crate::{GgmlType, QuantError};

/// Bytes of a row of `n` elements of `ty`.
pub(crate) fn row_bytes(ty: GgmlType, n: usize, what: &'static str) -> Result<usize, QuantError> {
    if !n.is_multiple_of(ty.block_len()) {
        return Err(QuantError::NotWholeBlocks {
            what,
            ty,
            len: n,
            block_len: ty.block_len(),
        });
    }
    (n / ty.block_len())
        .checked_mul(ty.block_bytes())
        .ok_or(QuantError::SizeOverflow { what })
}

/// Elements held by `bytes` of `ty`, which must be whole blocks.
pub(crate) fn elements_in(
    ty: GgmlType,
    bytes: usize,
    what: &'static str,
) -> Result<usize, QuantError> {
    if !bytes.is_multiple_of(ty.block_bytes()) {
        return Err(QuantError::PartialBlock {
            what,
            ty,
            len: bytes,
            block_bytes: ty.block_bytes(),
        });
    }
    (bytes / ty.block_bytes())
        .checked_mul(ty.block_len())
        .ok_or(QuantError::SizeOverflow { what })
}

pub(crate) fn product(a: usize, b: usize, what: &'static str) -> Result<usize, QuantError> {
    a.checked_mul(b).ok_or(QuantError::SizeOverflow { what })
}

pub(crate) fn expect_len(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::SizeMismatch {
            what,
            expected,
            actual,
        })
    }
}
