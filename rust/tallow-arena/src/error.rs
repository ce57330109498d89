//! The crate's error type.

use std::fmt;

/// Errors from creating an arena. (Allocation *from* an arena reports exhaustion as `None`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaError {
    /// The requested capacity cannot be described by a `Layout` (it exceeds `isize::MAX` once
    /// rounded up to the buffer alignment).
    CapacityTooLarge(usize),
    /// The system allocator could not provide the buffer.
    OutOfMemory(usize),
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::CapacityTooLarge(n) => {
                write!(f, "arena capacity of {n} bytes is too large")
            }
            ArenaError::OutOfMemory(n) => {
                write!(f, "out of memory allocating an arena of {n} bytes")
            }
        }
    }
}

impl std::error::Error for ArenaError {}
