//! Completion cells and sync objects for weft.
#![deny(unsafe_op_in_unsafe_fn)]
