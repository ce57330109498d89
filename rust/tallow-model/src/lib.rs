//! Transformer forward pass.
