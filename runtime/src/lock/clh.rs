//! CLH queue lock (Craig; Landin and Hagersten): FIFO, each waiter spins on its
//! *predecessor's* cell, the queue is implicit (no `next` pointers).
//!
//! A released cell is still read by the successor, so it cannot go back to its owner; as in
//! the original protocol, the releasing acquirer instead adopts its predecessor's cell (which
//! no one reads any more) for its next acquisition. Cells therefore live on the heap and
//! circulate: [`ClhNode`] holds a pointer to the cell it currently owns (allocated on first use,
//! freed by `Drop`), the lock owns the cell in `tail` when free.
//!
//! # State words
//!
//! | word | where | values |
//! |---|---|---|
//! | `tail` | the lock | the most recently enqueued cell, never null; low bit [`RELEASED`] set when that cell's acquirer released with no one queued behind it (the lock is free) |
//! | `locked` | each cell | `true` from enqueue until its acquirer hands the lock to a successor |
//!
//! A release with no successor CASes `tail` from its cell to the tagged cell instead of
//! clearing `locked`; a release with a successor clears `locked`. So `try_lock` decides from
//! `tail` alone (tagged = free) and never dereferences a cell it is not the successor of: a
//! cell read from `tail` may be adopted and freed by another thread at any moment.
//!
//! # Memory ordering
//!
//! - `locked.store(true, Relaxed)` then `tail.swap(AcqRel)`: Release publishes `locked = true`
//!   to the successor that reads our cell from `tail`; Acquire synchronizes with a releasing
//!   CAS that tagged `tail`.
//! - `pred.locked.load(Acquire)` / `locked.store(false, Release)`: hand-off to a successor.
//! - Release CAS tagging `tail` / Acquire swap or CAS that finds the tag: hand-off to a later
//!   arrival.

use std::cell::Cell;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::ptr;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::spin::SpinWait;
use super::{claim, dropped_in_use, RawLock, RawTimedLock};
use crate::loom::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// One circulating CLH cell.
#[derive(Debug)]
struct ClhCell {
    /// `true` while its acquirer waits for or holds the lock.
    locked: CachePadded<AtomicBool>,
}

impl ClhCell {
    fn boxed(locked: bool) -> *mut ClhCell {
        Box::into_raw(Box::new(ClhCell { locked: CachePadded::new(AtomicBool::new(locked)) }))
    }
}

/// Per-acquirer state of [`Clh`]: the cell this acquirer owns.
#[derive(Debug)]
pub struct ClhNode {
    /// The cell we own and enqueue next (null until first use).
    mine: Cell<*mut ClhCell>,
    /// While in the lock: the predecessor's cell, adopted at `unlock`.
    pred: Cell<*mut ClhCell>,
    /// In a lock right now.
    busy: Cell<bool>,
    _pin: PhantomPinned,
}

// SAFETY: the cells a `ClhNode` points to are heap cells it exclusively owns while not busy;
// moving the node (and its ownership) to another thread is fine. It stays `!Sync` (`Cell`).
unsafe impl Send for ClhNode {}

impl Default for ClhNode {
    fn default() -> Self {
        ClhNode { mine: Cell::new(ptr::null_mut()), pred: Cell::new(ptr::null_mut()), busy: Cell::new(false), _pin: PhantomPinned }
    }
}

impl ClhNode {
    /// Claims the node and returns its cell, initialized `locked = true`.
    #[inline]
    fn prepare(&self) -> *mut ClhCell {
        claim(&self.busy);
        let mut c = self.mine.get();
        if c.is_null() {
            c = ClhCell::boxed(true);
            self.mine.set(c);
        } else {
            // SAFETY: a non-busy node exclusively owns `mine` (no queue references it).
            unsafe { &*c }.locked.store(true, Ordering::Relaxed);
        }
        c
    }
}

impl Drop for ClhNode {
    fn drop(&mut self) {
        if self.busy.get() {
            dropped_in_use();
        }
        let c = self.mine.get();
        if !c.is_null() {
            // SAFETY: not busy, so we exclusively own `mine`, allocated by `ClhCell::boxed`.
            drop(unsafe { Box::from_raw(c) });
        }
    }
}

/// CLH queue lock. Node: [`ClhNode`].
#[derive(Debug)]
pub struct Clh {
    /// Most recently enqueued cell; never null.
    tail: CachePadded<AtomicPtr<ClhCell>>,
}

// SAFETY: `tail` is an atomic; the cells it points to are only accessed through atomics.
unsafe impl Send for Clh {}
// SAFETY: as above.
unsafe impl Sync for Clh {}

impl Default for Clh {
    fn default() -> Self {
        Clh::new()
    }
}

impl Clh {
    /// A free lock (allocates its first, released, cell).
    pub fn new() -> Self {
        Clh { tail: CachePadded::new(AtomicPtr::new(tag(ClhCell::boxed(true)))) }
    }

    #[inline]
    fn wait_on(pred: *mut ClhCell) {
        // SAFETY: `pred` was the tail when we enqueued behind it; its acquirer adopts another
        // cell at release and no one but us (its unique successor) will adopt `pred`, so it
        // stays allocated until we do.
        let p = unsafe { &*pred };
        // Acquire: pairs with the Release store of the predecessor's `unlock`.
        if !p.locked.load(Ordering::Acquire) {
            return;
        }
        let spin = SpinWait::local();
        // Acquire: as above.
        while p.locked.load(Ordering::Acquire) {
            spin.wait();
        }
    }
}

impl Drop for Clh {
    fn drop(&mut self) {
        let t = self.tail.load(Ordering::Relaxed);
        // A tagged tail cell belongs to the lock. An untagged one is held by an acquisition
        // that was never released (a leaked node, which aborts on drop): leave it.
        if is_released(t) {
            // SAFETY: `&mut self`: no acquisition in progress; the tagged cell is owned by
            // the lock and was allocated by `ClhCell::boxed`.
            drop(unsafe { Box::from_raw(untag(t)) });
        }
    }
}

/// Low bit of `tail`: the cell's acquirer released with no successor (cells are 128-byte
/// aligned, so the bit is free).
const RELEASED: usize = 1;

#[inline]
fn is_released(p: *mut ClhCell) -> bool {
    p as usize & RELEASED != 0
}

#[inline]
fn tag(p: *mut ClhCell) -> *mut ClhCell {
    p.wrapping_byte_add(RELEASED)
}

#[inline]
fn untag(p: *mut ClhCell) -> *mut ClhCell {
    p.wrapping_byte_sub(RELEASED)
}

// SAFETY: a cell is enqueued once per acquisition by the `tail` swap/CAS, and its acquirer
// enters only after its predecessor was released (its `locked` cleared, or `tail` tagged,
// which happens only while no one is queued behind it), so entries follow queue order one at a
// time. Release/Acquire on `locked` orders critical sections. After `unlock` the node owns
// only the adopted predecessor cell, which no other thread references.
unsafe impl RawLock for Clh {
    type Node = ClhNode;

    #[inline]
    fn lock(&self, node: Pin<&ClhNode>) {
        let mine = node.prepare();
        // AcqRel: see the module docs.
        let pred = self.tail.swap(mine, Ordering::AcqRel);
        if is_released(pred) {
            node.pred.set(untag(pred));
        } else {
            node.pred.set(pred);
            Self::wait_on(pred);
        }
    }

    #[inline]
    fn try_lock(&self, node: Pin<&ClhNode>) -> bool {
        let t = self.tail.load(Ordering::Relaxed);
        if !is_released(t) {
            return false;
        }
        let mine = node.prepare();
        // AcqRel: Acquire pairs with the Release CAS that tagged `t`; Release publishes our
        // initialized cell, as the swap in `lock`. The CAS compares addresses only: if `t`
        // was freed and reused meanwhile, a tagged tail still means "free".
        if self.tail.compare_exchange(t, mine, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            node.busy.set(false);
            return false;
        }
        node.pred.set(untag(t));
        true
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&ClhNode>) {
        let mine = node.mine.get();
        // Release: publish the critical section to the next arrival that finds the tag.
        if self.tail.compare_exchange(mine, tag(mine), Ordering::Release, Ordering::Relaxed).is_err() {
            // SAFETY: the caller holds the lock with `node`, so `mine` is our enqueued cell; a
            // successor spins on it and cannot adopt it before this store.
            // Release: hand over the critical section to that successor.
            unsafe { &*mine }.locked.store(false, Ordering::Release);
        }
        // Adopt the predecessor's cell: its only reader was us. (`mine` now belongs to the
        // successor, or to the lock while tagged in `tail`.)
        node.mine.set(node.pred.get());
        node.busy.set(false);
    }

    /// `false` only when a cell was enqueued after ours: its acquirer spins on our cell and
    /// will get the lock. (While we hold the lock `tail` is never tagged.)
    fn no_waiters(&self, node: Pin<&ClhNode>) -> bool {
        self.tail.load(Ordering::Relaxed) == node.mine.get()
    }
}

// SAFETY: polls `try_lock`, which acquires exactly as `lock` does.
unsafe impl RawTimedLock for Clh {
    fn try_lock_for(&self, node: Pin<&ClhNode>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}

super::flat_priority!(Clh);
