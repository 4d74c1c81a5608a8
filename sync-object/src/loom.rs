//! Atomics, locks and cells, swapped for loom's under `cfg(loom)` (the tokio habit), so the
//! completion-cell and sync-object protocols can be model-checked.
#![allow(unused_imports, unreachable_pub, dead_code)]

#[cfg(loom)]
pub(crate) use loom::{hint, sync, thread};

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
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

/// Locks a mutex, ignoring poisoning: the data these mutexes guard stays consistent across
/// a panic (they are queues and waker slots written in one step).
pub(crate) fn lock<T>(m: &sync::Mutex<T>) -> sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Runs `f` on the value of an atomic the caller holds exclusively (`&mut`): no atomic
/// instruction, as `AtomicUsize::get_mut` (loom spells it `with_mut`).
#[inline]
pub(crate) fn with_mut<R>(a: &mut sync::atomic::AtomicUsize, f: impl FnOnce(&mut usize) -> R) -> R {
    #[cfg(loom)]
    return a.with_mut(f);
    #[cfg(not(loom))]
    return f(a.get_mut());
}

/// The value behind a mutex the caller holds exclusively (`&mut`), ignoring poisoning.
#[inline]
pub(crate) fn get_mut<T>(m: &mut sync::Mutex<T>) -> &mut T {
    match m.get_mut() {
        Ok(v) => v,
        Err(p) => p.into_inner(),
    }
}
