//! The one safe mutex over every [`RawLock`] protocol (the `lock_api::Mutex` habit).
//!
//! Two ways to hold it, both keeping the protocol's node pinned for the whole acquisition:
//!
//! - [`Mutex::with_lock`]: the node lives on `with_lock`'s own stack frame; the closure gets
//!   `&mut T`. Nothing to set up, a fresh node per call.
//! - [`Mutex::lock_with`]: the caller pins a node (`std::pin::pin!`) and gets an RAII
//!   [`MutexGuard`] that borrows it; a thread can reuse one node across acquisitions (this
//!   matters for [`super::Clh`], whose node allocates its first cell).
//!
//! Leaking a guard (`mem::forget`) leaves the lock held, as with any mutex; its node then
//! aborts the process when it goes out of scope, because other threads may still write into
//! it (see the module docs of [`crate::lock`], *Nodes*).

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::pin::{pin, Pin};
use std::time::Duration;

use super::{RawLock, RawPriorityLock, RawTimedLock};

/// A mutual-exclusion lock protecting a `T`, over any protocol `L`.
pub struct Mutex<L, T: ?Sized> {
    /// The protocol.
    raw: L,
    /// The protected value.
    data: UnsafeCell<T>,
}

// SAFETY: the mutex hands `&mut T` to one holder at a time (the `RawLock` contract), so it can
// be shared across threads when `T` can be sent between them, as `std::sync::Mutex`.
unsafe impl<L: RawLock, T: ?Sized + Send> Sync for Mutex<L, T> {}
// SAFETY: moving the mutex moves `T` and the (unheld) raw lock, which is `Send`.
unsafe impl<L: RawLock, T: ?Sized + Send> Send for Mutex<L, T> {}

impl<L: RawLock + Default, T> Mutex<L, T> {
    /// A mutex with the protocol's default configuration.
    pub fn new(value: T) -> Self {
        Mutex::with_raw(L::default(), value)
    }
}

impl<L: RawLock + Default, T: Default> Default for Mutex<L, T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<L, T> Mutex<L, T> {
    /// A mutex over an already-built protocol (e.g. a [`super::DynLock`] or an
    /// [`super::Hmcs`] with its own topology).
    pub fn with_raw(raw: L, value: T) -> Self {
        Mutex { raw, data: UnsafeCell::new(value) }
    }

    /// The protected value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<L: RawLock, T: ?Sized> Mutex<L, T> {
    /// The protocol (for statistics and `no_waiters`).
    pub fn raw(&self) -> &L {
        &self.raw
    }

    /// The value, without locking: `&mut self` proves no one else holds it.
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// Runs `f` while holding the lock.
    #[inline]
    pub fn with_lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let node = pin!(L::Node::default());
        let mut g = self.lock_with(node);
        f(&mut g)
    }

    /// Runs `f` if the lock can be taken without waiting.
    #[inline]
    pub fn try_with_lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let node = pin!(L::Node::default());
        let mut g = self.try_lock_with(node)?;
        Some(f(&mut g))
    }

    /// Acquires with `node`, pinned by the caller for at least as long as the guard.
    ///
    /// ```
    /// use std::pin::pin;
    /// use weft::lock::{Mcs, McsNode, Mutex};
    ///
    /// let m: Mutex<Mcs, u32> = Mutex::new(1);
    /// let mut node = pin!(McsNode::new());
    /// for _ in 0..3 {
    ///     *m.lock_with(node.as_mut()) += 1; // one node, reused
    /// }
    /// assert_eq!(*m.lock_with(node.as_mut()), 4);
    /// ```
    #[inline]
    pub fn lock_with<'a>(&'a self, node: Pin<&'a mut L::Node>) -> MutexGuard<'a, L, T> {
        self.raw.lock(node.as_ref());
        MutexGuard { mutex: self, node, _not_send: PhantomData }
    }

    /// Acquires with `node` if that needs no waiting.
    #[inline]
    pub fn try_lock_with<'a>(&'a self, node: Pin<&'a mut L::Node>) -> Option<MutexGuard<'a, L, T>> {
        if self.raw.try_lock(node.as_ref()) {
            Some(MutexGuard { mutex: self, node, _not_send: PhantomData })
        } else {
            None
        }
    }
}

impl<L: RawLock<Node = ()>, T: ?Sized> Mutex<L, T> {
    /// Acquires a protocol that needs no node (TAS, ticket, parking_lot).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, L, T> {
        // `()` is `Unpin` and zero-sized: a fresh `&mut ()` lives for any lifetime.
        self.lock_with(Pin::new(Box::leak(Box::new(()))))
    }
}

impl<L: RawTimedLock, T: ?Sized> Mutex<L, T> {
    /// Acquires with `node`, giving up after `timeout` (see [`RawTimedLock`] for what each
    /// protocol does).
    #[inline]
    pub fn try_lock_for_with<'a>(&'a self, node: Pin<&'a mut L::Node>, timeout: Duration) -> Option<MutexGuard<'a, L, T>> {
        if self.raw.try_lock_for(node.as_ref(), timeout) {
            Some(MutexGuard { mutex: self, node, _not_send: PhantomData })
        } else {
            None
        }
    }

    /// Runs `f` if the lock is acquired within `timeout`.
    #[inline]
    pub fn try_with_lock_for<R>(&self, timeout: Duration, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let node = pin!(L::Node::default());
        let mut g = self.try_lock_for_with(node, timeout)?;
        Some(f(&mut g))
    }
}

impl<L: RawPriorityLock, T: ?Sized> Mutex<L, T> {
    /// Runs `f` holding the lock with low priority (progress path, [Amer 2019, §4.1]); same as
    /// [`Mutex::with_lock`] for flat protocols.
    #[inline]
    pub fn with_lock_low<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let node = pin!(L::Node::default());
        let node = node.as_ref();
        self.raw.lock_low(node);
        /// Releases the low-priority acquisition, also on unwind.
        struct Low<'a, L: RawPriorityLock>(&'a L, Pin<&'a L::Node>);
        impl<L: RawPriorityLock> Drop for Low<'_, L> {
            fn drop(&mut self) {
                // SAFETY: constructed right after `lock_low` with this node succeeded.
                unsafe { self.0.unlock_low(self.1) }
            }
        }
        let _release = Low(&self.raw, node);
        // SAFETY: we hold the lock (low class) until `_release` drops after `f` returns.
        f(unsafe { &mut *self.data.get() })
    }

    /// Runs `f` if the lock can be taken with low priority without waiting.
    #[inline]
    pub fn try_with_lock_low<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let node = pin!(L::Node::default());
        let node = node.as_ref();
        if !self.raw.try_lock_low(node) {
            return None;
        }
        let r = {
            // SAFETY: we hold the lock (low class) until `unlock_low` below.
            let data = unsafe { &mut *self.data.get() };
            // Release on unwind too.
            struct Low<'a, L: RawPriorityLock>(&'a L, Pin<&'a L::Node>);
            impl<L: RawPriorityLock> Drop for Low<'_, L> {
                fn drop(&mut self) {
                    // SAFETY: constructed right after `try_lock_low` with this node succeeded.
                    unsafe { self.0.unlock_low(self.1) }
                }
            }
            let _release = Low(&self.raw, node);
            f(data)
        };
        Some(r)
    }
}

impl<L: RawLock, T: ?Sized + fmt::Debug> fmt::Debug for Mutex<L, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Mutex");
        match self.try_with_lock(|v| format!("{v:?}")) {
            Some(v) => d.field("data", &format_args!("{v}")),
            None => d.field("data", &format_args!("<locked>")),
        };
        d.finish_non_exhaustive()
    }
}

/// Holds a [`Mutex`] (high priority for [`super::Priority`]); releases it on drop.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct MutexGuard<'a, L: RawLock, T: ?Sized> {
    /// The held mutex.
    mutex: &'a Mutex<L, T>,
    /// The node this acquisition is linked with, pinned until we unlock.
    node: Pin<&'a mut L::Node>,
    /// Released on the acquiring thread, as std's guard (some nodes, e.g. [`super::StdNode`],
    /// require it).
    _not_send: PhantomData<*const ()>,
}

// SAFETY: sharing the guard only gives out `&T` (the node is not reachable through `&guard`).
unsafe impl<L: RawLock, T: ?Sized + Sync> Sync for MutexGuard<'_, L, T> {}

impl<L: RawLock, T: ?Sized> Deref for MutexGuard<'_, L, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.mutex.data.get() }
    }
}

impl<L: RawLock, T: ?Sized> DerefMut for MutexGuard<'_, L, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock, and `&mut self` makes this the only
        // reference through it.
        unsafe { &mut *self.mutex.data.get() }
    }
}

impl<L: RawLock, T: ?Sized> Drop for MutexGuard<'_, L, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard exists only after a successful acquisition with this node, and is
        // dropped once.
        unsafe { self.mutex.raw.unlock(self.node.as_ref()) }
    }
}

impl<L: RawLock, T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, L, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
