//! The system locks as [`RawLock`]s, so that the runtime can pick them per path and the
//! benchmarks compare against them: `std::sync::Mutex` (futex-based on Linux, the Rust
//! analogue of the Pthread mutex of [Amer 2019, §2.3]) and `parking_lot`'s raw mutex.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::MutexGuard;
use std::time::Duration;

use parking_lot::lock_api::{RawMutex as _, RawMutexTimed as _};

use super::{dropped_in_use, RawLock, RawTimedLock};

/// `std::sync::Mutex<()>` as a raw lock. Node: [`StdNode`], which keeps the std guard while
/// the lock is held (std offers no raw unlock). The mutex is boxed so that a `StdLock` may be
/// moved while held, like every other lock of this module. Poisoning is ignored.
#[derive(Debug, Default)]
pub struct StdLock {
    /// The std mutex, at a fixed address.
    m: Box<std::sync::Mutex<()>>,
}

/// Node of [`StdLock`]: the guard of the current acquisition.
#[derive(Default)]
pub struct StdNode {
    /// `Some` while this node holds a [`StdLock`]. The `'static` is a lie bounded by the
    /// `RawLock` contract: the guard is dropped in `unlock`, before the lock can be dropped.
    guard: Cell<Option<MutexGuard<'static, ()>>>,
}

impl std::fmt::Debug for StdNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdNode").finish_non_exhaustive()
    }
}

impl Drop for StdNode {
    fn drop(&mut self) {
        if self.guard.get_mut().is_some() {
            // The lock may already be gone: do not drop the guard.
            dropped_in_use();
        }
    }
}

impl StdLock {
    /// A free lock.
    pub fn new() -> Self {
        StdLock::default()
    }

    fn keep(node: &StdNode, g: MutexGuard<'_, ()>) {
        // SAFETY: lifetime extension only (same type otherwise). The guard borrows the boxed
        // mutex, which lives as long as `self`; it is taken back and dropped by `unlock`, which
        // the `RawLock` contract requires before the lock is released or dropped. A node
        // dropped while holding a guard aborts without touching it.
        let g: MutexGuard<'static, ()> = unsafe { std::mem::transmute::<MutexGuard<'_, ()>, MutexGuard<'static, ()>>(g) };
        if node.guard.replace(Some(g)).is_some() {
            // The node already held a guard: it is in use by another acquisition.
            dropped_in_use();
        }
    }
}

// SAFETY: mutual exclusion and synchronization are std's. The node is not referenced by the
// lock; `unlock` drops the guard it holds.
unsafe impl RawLock for StdLock {
    type Node = StdNode;

    fn lock(&self, node: Pin<&StdNode>) {
        let g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        Self::keep(node.get_ref(), g);
    }

    fn try_lock(&self, node: Pin<&StdNode>) -> bool {
        match self.m.try_lock() {
            Ok(g) => {
                Self::keep(node.get_ref(), g);
                true
            }
            Err(std::sync::TryLockError::Poisoned(e)) => {
                Self::keep(node.get_ref(), e.into_inner());
                true
            }
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    unsafe fn unlock(&self, node: Pin<&StdNode>) {
        drop(node.guard.take());
    }
}

// SAFETY: polls `try_lock`, which acquires exactly as `lock` does.
unsafe impl RawTimedLock for StdLock {
    fn try_lock_for(&self, node: Pin<&StdNode>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}

/// `parking_lot::RawMutex` as a raw lock (spins briefly, then parks). Node: `()`.
pub struct ParkingLot {
    /// The parking_lot mutex word.
    raw: parking_lot::RawMutex,
}

impl std::fmt::Debug for ParkingLot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkingLot").field("locked", &self.raw.is_locked()).finish()
    }
}

impl Default for ParkingLot {
    fn default() -> Self {
        ParkingLot::new()
    }
}

impl ParkingLot {
    /// A free lock.
    pub fn new() -> Self {
        ParkingLot { raw: parking_lot::RawMutex::INIT }
    }
}

// SAFETY: mutual exclusion and synchronization are parking_lot's; there is no node.
unsafe impl RawLock for ParkingLot {
    type Node = ();

    #[inline]
    fn lock(&self, _node: Pin<&()>) {
        self.raw.lock()
    }

    #[inline]
    fn try_lock(&self, _node: Pin<&()>) -> bool {
        self.raw.try_lock()
    }

    #[inline]
    unsafe fn unlock(&self, _node: Pin<&()>) {
        // SAFETY: the caller holds the lock (trait contract), as parking_lot requires.
        unsafe { self.raw.unlock() }
    }
}

// SAFETY: parking_lot's own timed lock.
unsafe impl RawTimedLock for ParkingLot {
    fn try_lock_for(&self, _node: Pin<&()>, timeout: Duration) -> bool {
        self.raw.try_lock_for(timeout)
    }
}

super::flat_priority!(StdLock, ParkingLot);
