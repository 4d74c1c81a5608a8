//! Providers and Communication Resource Instances for weft.
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "ofi")]
pub mod ofi;
