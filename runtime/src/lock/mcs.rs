//! MCS queue lock (Mellor-Crummey and Scott; [Amer 2019, §2.3]): FIFO hand-off, every waiter
//! spins on its own node.
//!
//! # State words
//!
//! | word | where | values |
//! |---|---|---|
//! | `tail` | the lock | null: free; else the last node in the queue (holder or last waiter) |
//! | `next` | each node | null until the successor links itself |
//! | `status` | each node | [`WAIT`]: queued; anything else: lock handed to this node |
//!
//! The queue node [`QNode`] is shared with [`super::Hmcs`], which also stores in `status` the
//! number of local hand-offs (`COHORT_START..threshold`) or [`ACQUIRE_PARENT`].
//!
//! # Memory ordering
//!
//! - `tail.swap(AcqRel)`: Release publishes the initialized node (`next = null`,
//!   `status = WAIT`) to the successor that finds it in `tail` and writes into it; Acquire
//!   synchronizes with the `Release` CAS of a holder that emptied the queue.
//! - `pred.next.store(Release)` / `next.load(Acquire)`: the predecessor's write of our
//!   `status` must come after our own initialization in the line's modification order.
//! - `status.store(Release)` / `status.load(Acquire)`: the hand-off; the critical section of
//!   the releaser happens-before that of the successor.
//! - `tail.compare_exchange(me, null, Release)`: an uncontended release publishes the
//!   critical section to the next `swap`.

use std::cell::Cell;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::ptr;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::spin::SpinWait;
use super::{claim, dropped_in_use, RawLock, RawTimedLock};
use crate::loom::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// `status` of a queued node that has not been handed the lock.
pub(crate) const WAIT: u64 = u64::MAX;
/// HMCS: the predecessor released the parent level; acquire it yourself.
pub(crate) const ACQUIRE_PARENT: u64 = u64::MAX - 1;
/// HMCS: first holder of a cohort; MCS: "lock granted".
pub(crate) const COHORT_START: u64 = 1;

/// The part of a queue node other threads touch.
#[derive(Debug)]
pub(crate) struct QNode {
    /// Successor in the queue, null until it links itself.
    pub(crate) next: AtomicPtr<QNode>,
    /// [`WAIT`], [`ACQUIRE_PARENT`] or a hand-off count / grant.
    pub(crate) status: AtomicU64,
}

impl QNode {
    pub(crate) fn new() -> Self {
        QNode { next: AtomicPtr::new(ptr::null_mut()), status: AtomicU64::new(0) }
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut QNode {
        self as *const QNode as *mut QNode
    }

    /// Links `self` behind `pred` and spins until handed the lock; returns the status read.
    ///
    /// # Safety
    ///
    /// `pred` was just read from the `tail` of the queue `self` entered by the swap that
    /// returned it, and `self` is initialized (`next` null, `status` [`WAIT`]).
    #[inline]
    pub(crate) unsafe fn link_and_wait(&self, pred: *mut QNode) -> u64 {
        // SAFETY: `pred`'s owner cannot finish releasing (and reuse or free `pred`) before it
        // has read our pointer from `pred.next`: `tail` is no longer `pred`, so its CAS to
        // null fails and it waits for the link (see `release_to`).
        let pred = unsafe { &*pred };
        // Release: our initialization of `status` is ordered before the predecessor's write.
        pred.next.store(self.as_ptr(), Ordering::Release);
        // Acquire: pairs with the Release hand-off store of the predecessor.
        let s = self.status.load(Ordering::Acquire);
        if s != WAIT {
            return s;
        }
        let spin = SpinWait::local();
        loop {
            spin.wait();
            // Acquire: as above.
            let s = self.status.load(Ordering::Acquire);
            if s != WAIT {
                return s;
            }
        }
    }

    /// Hands the lock to the successor with `status = val`, or empties `tail` if there is
    /// none.
    ///
    /// # Safety
    ///
    /// `self` heads the queue whose tail word is `tail` (its owner holds that level).
    #[inline]
    pub(crate) unsafe fn release_to(&self, tail: &AtomicPtr<QNode>, val: u64) {
        // Acquire: the successor's initialization happens-before our write of its status.
        let mut succ = self.next.load(Ordering::Acquire);
        if succ.is_null() {
            // Release: publish the critical section to the next `swap` of `tail`.
            if tail.compare_exchange(self.as_ptr(), ptr::null_mut(), Ordering::Release, Ordering::Relaxed).is_ok() {
                return;
            }
            // A successor swapped `tail` but has not linked yet: it will, shortly.
            let spin = SpinWait::local();
            loop {
                // Acquire: as above.
                succ = self.next.load(Ordering::Acquire);
                if !succ.is_null() {
                    break;
                }
                spin.wait();
            }
        }
        // SAFETY: the successor is linked behind us and waits for this store; it cannot leave
        // the queue (or free its node) before seeing it. We do not touch it afterwards.
        // Release: hand over the critical section.
        unsafe { &*succ }.status.store(val, Ordering::Release);
    }
}

/// Queue node of [`Mcs`] and [`super::Hmcs`]: one per acquisition in flight, pinned while in
/// the lock (see the module docs of [`crate::lock`], *Nodes*).
#[derive(Debug)]
pub struct McsNode {
    /// What other threads write (successor link, hand-off status).
    pub(crate) q: QNode,
    /// HMCS: CPU whose leaf to enter at (`usize::MAX`: the CPU we run on at `lock` time).
    pub(crate) cpu: Cell<usize>,
    /// HMCS: index of the leaf this acquisition entered at, for `unlock`.
    pub(crate) leaf: Cell<usize>,
    /// In a lock right now; checked by `lock` and `Drop`.
    pub(crate) busy: Cell<bool>,
    _pin: PhantomPinned,
}

impl Default for McsNode {
    fn default() -> Self {
        McsNode::new()
    }
}

impl McsNode {
    /// A fresh node.
    pub fn new() -> Self {
        McsNode { q: QNode::new(), cpu: Cell::new(usize::MAX), leaf: Cell::new(0), busy: Cell::new(false), _pin: PhantomPinned }
    }

    /// A node that enters an [`super::Hmcs`] lock at the leaf of `cpu` (modulo the
    /// topology's CPU count) rather than at the CPU it runs on. Ignored by [`Mcs`]. For
    /// threads pinned by the application, and for tests that emulate a deeper machine.
    pub fn with_cpu(cpu: usize) -> Self {
        let n = McsNode::new();
        n.cpu.set(cpu);
        n
    }

    #[inline]
    pub(crate) fn init(&self) {
        claim(&self.busy);
        self.q.next.store(ptr::null_mut(), Ordering::Relaxed);
        self.q.status.store(WAIT, Ordering::Relaxed);
    }
}

impl Drop for McsNode {
    fn drop(&mut self) {
        if self.busy.get() {
            dropped_in_use();
        }
    }
}

/// MCS queue lock. Node: [`McsNode`].
#[derive(Debug)]
pub struct Mcs {
    /// Last node of the queue, null when free.
    tail: CachePadded<AtomicPtr<QNode>>,
}

impl Default for Mcs {
    fn default() -> Self {
        Mcs::new()
    }
}

impl Mcs {
    /// A free lock.
    pub fn new() -> Self {
        Mcs { tail: CachePadded::new(AtomicPtr::new(ptr::null_mut())) }
    }

    /// Whether the lock is held right now (a racy snapshot).
    pub fn is_locked(&self) -> bool {
        !self.tail.load(Ordering::Relaxed).is_null()
    }
}

// SAFETY: the queue admits one head at a time: a node enters only through the `tail` swap or
// CAS, and becomes head either by finding the queue empty or by being handed the lock by its
// predecessor (`release_to`), which happens once per release. Orderings as in the module docs.
// `unlock` does not touch the node after clearing `busy`; `McsNode::drop` aborts while busy.
unsafe impl RawLock for Mcs {
    type Node = McsNode;

    #[inline]
    fn lock(&self, node: Pin<&McsNode>) {
        let n = node.get_ref();
        n.init();
        // AcqRel: see the module docs (publish our node; sync with an emptying release).
        let pred = self.tail.swap(n.q.as_ptr(), Ordering::AcqRel);
        if !pred.is_null() {
            // SAFETY: `pred` came from the swap that enqueued our initialized node.
            unsafe { n.q.link_and_wait(pred) };
        }
    }

    #[inline]
    fn try_lock(&self, node: Pin<&McsNode>) -> bool {
        let n = node.get_ref();
        if !self.tail.load(Ordering::Relaxed).is_null() {
            return false;
        }
        n.init();
        // AcqRel: as the swap in `lock`.
        let ok = self.tail.compare_exchange(ptr::null_mut(), n.q.as_ptr(), Ordering::AcqRel, Ordering::Relaxed).is_ok();
        if !ok {
            n.busy.set(false);
        }
        ok
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&McsNode>) {
        let n = node.get_ref();
        // SAFETY: the caller holds the lock with `node` (trait contract), so it heads the
        // queue of `tail`.
        unsafe { n.q.release_to(&self.tail, COHORT_START) };
        n.busy.set(false);
    }

    /// `false` only when a successor has linked itself behind us: it will get the lock.
    #[inline]
    fn no_waiters(&self, node: Pin<&McsNode>) -> bool {
        node.q.next.load(Ordering::Relaxed).is_null()
    }
}

// SAFETY: polls `try_lock`, which acquires exactly as `lock` does.
unsafe impl RawTimedLock for Mcs {
    fn try_lock_for(&self, node: Pin<&McsNode>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}

super::flat_priority!(Mcs);
