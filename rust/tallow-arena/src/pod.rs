//! Plain-old-data element types that may be handed out zero-filled.

mod sealed {
    pub trait Sealed {}
}

/// An element type for which the all-zero bit pattern is a valid value, and which has no padding,
/// no drop glue and no invalid bit patterns: the types scratch buffers hold (activations as `f32`,
/// f16/bf16 stored as `u16`, quantized values as `i8`/`u8`, indices as `i32`/`u32`, ...).
///
/// The trait is sealed: only the primitive types below implement it, so the zero-filled
/// allocation in [`Arena::alloc_slice`](crate::Arena::alloc_slice) is sound by construction.
pub trait Pod: Copy + sealed::Sealed + 'static {}

macro_rules! impl_pod {
    ($($t:ty),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl Pod for $t {}
        )*
    };
}

impl_pod!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
