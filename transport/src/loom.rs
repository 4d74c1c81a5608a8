//! Atomics and cells, swapped for loom's under `cfg(loom)` (the tokio habit), so that the
//! lock-free protocols of this crate can be model-checked.
#![allow(unused_imports, unreachable_pub)]

#[cfg(loom)]
pub(crate) use loom::{hint, sync, thread};

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::*;
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::*;
    }
}
#[cfg(not(loom))]
pub(crate) use std::{hint, thread};

#[cfg(loom)]
pub(crate) use loom::cell;

/// `UnsafeCell` with loom's closure API, so the same code checks under loom.
#[cfg(not(loom))]
pub(crate) mod cell {
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        #[inline]
        pub(crate) const fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}
