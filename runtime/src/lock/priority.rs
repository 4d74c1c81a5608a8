//! TLP, the two-level priority lock of [Amer 2019, §4.1], exactly as its Fig. 5.
//!
//! ```text
//! acquire (high):  lock high_p;  if !go_straight { lock filter; go_straight = 1 }
//! release (high):  if nowaiters_high_p { go_straight = 0; unlock filter };  unlock high_p
//! acquire_l (low): lock low_p;   lock filter
//! release_l (low): unlock filter; unlock low_p
//! ```
//!
//! `high_p` and `low_p` are arbitrary protocols (`H`, `L`); `filter` is a [`Ticket`] lock: at
//! most two threads compete for it (the first high-priority thread and the head low-priority
//! thread), where a ticket is as good as any queue lock ([Amer 2019, §4.1]). While high-priority
//! threads keep arriving, the filter stays with the high class (`go_straight`), and later
//! high-priority threads pass with `high_p` alone; low-priority threads wait at the filter.
//! When the releasing high-priority holder sees no queued high-priority waiter
//! ([`RawLock::no_waiters`], which may miss an arriving waiter but never invents one), it
//! reopens the filter.
//!
//! [`Priority::acquire_high`], [`Priority::release_high`], [`Priority::acquire_low`],
//! [`Priority::release_low`] are the seed's four routines with the class's own node;
//! through [`RawPriorityLock`] (`lock_high`, `lock_low`, ...) they take a [`PriorityNode`].
//!
//! Names follow the seed's `P-X-Y` convention: X the protocol of the high class (main path),
//! Y that of the low class (progress path). [`LockKind`](super::LockKind) parses
//! `p-hmcs-mcs` (the seed's best overall, §4.2), `p-mcs-mcs`, `p-ticket-ticket`, ...
//!
//! # State words
//!
//! | word | guarded by | meaning |
//! |---|---|---|
//! | `high_p` | — | mutual exclusion among high-priority threads |
//! | `go_straight` | `high_p` | `true`: the high class holds `filter`; the next high-priority holder skips it |
//! | `filter` | — | ticket lock between the high class and one low-priority thread |
//! | `low_p` | — | mutual exclusion among low-priority threads |
//!
//! # Memory ordering
//!
//! `go_straight` is read and written only by the holder of `high_p`, so `Relaxed` suffices:
//! `high_p`'s own Acquire/Release orders the accesses of successive holders. The filter may be
//! taken by one high-priority thread and released by a later one; the ticket's counters are
//! ordered through the same `high_p` hand-offs (see [`Ticket::release`]).

use std::pin::Pin;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::{RawLock, RawPriorityLock, RawTimedLock, Ticket};
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Two-level priority lock `P-H-L` ([Amer 2019, Fig. 5]).
#[derive(Debug)]
pub struct Priority<H, L> {
    /// Lock of the high-priority class (seed: `high_p`).
    high_p: CachePadded<H>,
    /// The high class holds `filter` (seed: `go_straight`); guarded by `high_p`.
    go_straight: CachePadded<AtomicBool>,
    /// Blocks low-priority threads while high-priority ones are present (seed: `filter`).
    filter: Ticket,
    /// Lock of the low-priority class (seed: `low_p`).
    low_p: CachePadded<L>,
}

/// Node of [`Priority`] used through [`RawLock`]/[`RawPriorityLock`] (`lock` = `lock_high`):
/// one node per class. The inherent [`Priority::acquire_high`]/[`Priority::acquire_low`] take
/// the class's node directly.
#[derive(Debug, Default)]
pub struct PriorityNode<HN, LN> {
    /// Node for `high_p`.
    pub high: HN,
    /// Node for `low_p`.
    pub low: LN,
}

impl<H: Default, L: Default> Default for Priority<H, L> {
    fn default() -> Self {
        Priority::new(H::default(), L::default())
    }
}

impl<H, L> Priority<H, L> {
    /// A free lock made of the two class locks.
    pub fn new(high_p: H, low_p: L) -> Self {
        Priority {
            high_p: CachePadded::new(high_p),
            go_straight: CachePadded::new(AtomicBool::new(false)),
            filter: Ticket::new(),
            low_p: CachePadded::new(low_p),
        }
    }

    /// The high-priority class lock.
    pub fn high(&self) -> &H {
        &self.high_p
    }

    /// The low-priority class lock.
    pub fn low(&self) -> &L {
        &self.low_p
    }
}

impl<H: RawLock, L: RawLock> Priority<H, L> {
    /// [Amer 2019, Fig. 5] `acquire` (lines 12–18): high priority (main path).
    #[inline]
    pub fn acquire_high(&self, node: Pin<&H::Node>) {
        self.high_p.lock(node);
        // Relaxed: guarded by `high_p` (module docs).
        if !self.go_straight.load(Ordering::Relaxed) {
            self.filter.acquire();
            self.go_straight.store(true, Ordering::Relaxed);
        }
    }

    /// Non-waiting [`Priority::acquire_high`]; `true` on success.
    #[inline]
    pub fn try_acquire_high(&self, node: Pin<&H::Node>) -> bool {
        if !self.high_p.try_lock(node) {
            return false;
        }
        // Relaxed: guarded by `high_p`.
        if self.go_straight.load(Ordering::Relaxed) {
            return true;
        }
        if self.filter.try_acquire() {
            self.go_straight.store(true, Ordering::Relaxed);
            return true;
        }
        // SAFETY: we hold `high_p` with `node` (just acquired) and take nothing else.
        unsafe { self.high_p.unlock(node) };
        false
    }

    /// [Amer 2019, Fig. 5] `release` (lines 20–26).
    ///
    /// # Safety
    ///
    /// The caller holds this lock through `acquire_high`/`try_acquire_high` with `node`.
    #[inline]
    pub unsafe fn release_high(&self, node: Pin<&H::Node>) {
        if self.high_p.no_waiters(node) {
            // Relaxed: guarded by `high_p`, released below.
            self.go_straight.store(false, Ordering::Relaxed);
            // SAFETY: the high class holds the filter (`go_straight` was true: set by us or an
            // earlier holder of `high_p`), and only this holder releases it.
            unsafe { self.filter.release() };
        }
        // SAFETY: caller contract: we hold `high_p` with `node`.
        unsafe { self.high_p.unlock(node) };
    }

    /// [Amer 2019, Fig. 5] `acquire_l` (lines 28–32): low priority (progress path).
    #[inline]
    pub fn acquire_low(&self, node: Pin<&L::Node>) {
        self.low_p.lock(node);
        self.filter.acquire();
    }

    /// Non-waiting [`Priority::acquire_low`]; `true` on success.
    #[inline]
    pub fn try_acquire_low(&self, node: Pin<&L::Node>) -> bool {
        if !self.low_p.try_lock(node) {
            return false;
        }
        if self.filter.try_acquire() {
            return true;
        }
        // SAFETY: we hold `low_p` with `node` (just acquired).
        unsafe { self.low_p.unlock(node) };
        false
    }

    /// [Amer 2019, Fig. 5] `release_l` (lines 34–37).
    ///
    /// # Safety
    ///
    /// The caller holds this lock through `acquire_low`/`try_acquire_low` with `node`.
    #[inline]
    pub unsafe fn release_low(&self, node: Pin<&L::Node>) {
        // SAFETY: we hold the filter (taken in `acquire_low`).
        unsafe { self.filter.release() };
        // SAFETY: caller contract: we hold `low_p` with `node`.
        unsafe { self.low_p.unlock(node) };
    }

    /// Pins the class node of a [`PriorityNode`].
    #[inline]
    fn high_node(node: Pin<&PriorityNode<H::Node, L::Node>>) -> Pin<&H::Node> {
        // SAFETY: structural pinning: `PriorityNode` never moves its fields out and has no
        // `Drop` of its own; a pinned `PriorityNode` keeps `high` in place.
        unsafe { node.map_unchecked(|n| &n.high) }
    }

    #[inline]
    fn low_node(node: Pin<&PriorityNode<H::Node, L::Node>>) -> Pin<&L::Node> {
        // SAFETY: as `high_node`.
        unsafe { node.map_unchecked(|n| &n.low) }
    }
}

// SAFETY: [Amer 2019, §4.1]: holding the lock means holding the filter, either as the high class
// (with `high_p`, `go_straight` set) or as the one low thread holding `low_p`; the filter is a
// ticket lock, so at most one of the two classes is in, and within a class `high_p` (resp.
// `low_p` + filter) excludes. Synchronization: filter and class locks are Acquire/Release.
unsafe impl<H: RawLock, L: RawLock> RawLock for Priority<H, L> {
    type Node = PriorityNode<H::Node, L::Node>;

    #[inline]
    fn lock(&self, node: Pin<&Self::Node>) {
        self.acquire_high(Self::high_node(node))
    }

    #[inline]
    fn try_lock(&self, node: Pin<&Self::Node>) -> bool {
        self.try_acquire_high(Self::high_node(node))
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&Self::Node>) {
        // SAFETY: forwarded contract.
        unsafe { self.release_high(Self::high_node(node)) }
    }

    fn no_waiters(&self, node: Pin<&Self::Node>) -> bool {
        self.high_p.no_waiters(Self::high_node(node))
    }
}

// SAFETY: the methods are the seed's two classes, which exclude each other (see `RawLock`).
unsafe impl<H: RawLock, L: RawLock> RawPriorityLock for Priority<H, L> {
    #[inline]
    fn lock_low(&self, node: Pin<&Self::Node>) {
        self.acquire_low(Self::low_node(node))
    }

    #[inline]
    fn try_lock_low(&self, node: Pin<&Self::Node>) -> bool {
        self.try_acquire_low(Self::low_node(node))
    }

    #[inline]
    unsafe fn unlock_low(&self, node: Pin<&Self::Node>) {
        // SAFETY: forwarded contract.
        unsafe { self.release_low(Self::low_node(node)) }
    }
}

// SAFETY: polls `try_lock` (high priority), which acquires exactly as `lock` does.
unsafe impl<H: RawLock, L: RawLock> RawTimedLock for Priority<H, L> {
    fn try_lock_for(&self, node: Pin<&Self::Node>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}
