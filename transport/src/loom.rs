//! Atomics and cells, swapped for loom's under `cfg(loom)` (the tokio habit), so that the
//! lock-free protocols of this crate can be model-checked.
#![allow(unused_imports, unreachable_pub)]

#[cfg(loom)]
pub(crate) use loom::{cell, hint, sync, thread};

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::*;
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::*;
    }
}
#[cfg(not(loom))]
pub(crate) use std::{hint, thread};
