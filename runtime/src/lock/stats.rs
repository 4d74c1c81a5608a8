//! Per-path lock counters ([Amer 2019, §3.2]): acquisitions, contended acquisitions, time held,
//! and productive vs unproductive acquisitions of a progress path.
//!
//! Counting is opt-in: wrap a protocol in [`Counted`] (a plain protocol writes no counter).
//! Every counter is written only by the current holder of the lock, so updates are a
//! `Relaxed` load and store, not a read-modify-write; the counters share one cache line
//! (`CachePadded` as a block, away from the lock word and other data), which travels with the
//! lock anyway: one extra line transfer per hand-off, none in an uncontended loop. Padding each
//! counter separately would only multiply those transfers. Held time needs two clock reads per
//! acquisition, so it is a separate switch ([`Counted::timed`]).
//!
//! A progress-path acquisition is *productive* when it completed or started at least one
//! operation; the holder reports that with [`Counted::record_progress`] before releasing.

use std::cell::Cell;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::{RawLock, RawPriorityLock, RawTimedLock};
use crate::loom::sync::atomic::{AtomicU64, Ordering};

/// What an acquisition of a progress path achieved ([Amer 2019, §3.2]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// Completed or started at least one operation.
    Productive,
    /// Changed nothing (only polled).
    Unproductive,
}

/// The counters of one lock (one path).
#[derive(Debug)]
struct LockCounters {
    /// Successful acquisitions.
    acquisitions: AtomicU64,
    /// Acquisitions whose first `try_lock` failed.
    contended: AtomicU64,
    /// Total time held, in ns (only with timing on).
    held_ns: AtomicU64,
    /// Acquisitions reported [`Acquisition::Productive`].
    productive: AtomicU64,
    /// Acquisitions reported [`Acquisition::Unproductive`].
    unproductive: AtomicU64,
}

/// LockCounters of one lock, written by its holder (see the module docs for the cost model).
#[derive(Debug)]
pub struct LockStats {
    /// All counters, on their own cache line(s).
    c: CachePadded<LockCounters>,
}

/// A plain copy of [`LockStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockStatsSnapshot {
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found the lock taken (their first `try_lock` failed).
    pub contended: u64,
    /// Total time held, in ns (0 unless timing is on).
    pub held_ns: u64,
    /// Acquisitions reported productive.
    pub productive: u64,
    /// Acquisitions reported unproductive.
    pub unproductive: u64,
}

impl LockStatsSnapshot {
    /// Fraction of acquisitions that were contended (0 when none).
    pub fn contention_ratio(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.contended as f64 / self.acquisitions as f64
        }
    }

    /// Productive share of the reported acquisitions, [Amer 2019, §3.2]'s path efficiency.
    pub fn efficiency(&self) -> f64 {
        let n = self.productive + self.unproductive;
        if n == 0 {
            0.0
        } else {
            self.productive as f64 / n as f64
        }
    }
}

impl Default for LockStats {
    fn default() -> Self {
        LockStats::new()
    }
}

impl LockStats {
    /// Zeroed counters.
    pub fn new() -> Self {
        let z = || AtomicU64::new(0);
        LockStats {
            c: CachePadded::new(LockCounters { acquisitions: z(), contended: z(), held_ns: z(), productive: z(), unproductive: z() }),
        }
    }

    /// Reads every counter (each exact, the set not atomic as a whole).
    pub fn snapshot(&self) -> LockStatsSnapshot {
        // Relaxed: monotone counters read for reporting; no data depends on them.
        LockStatsSnapshot {
            acquisitions: self.c.acquisitions.load(Ordering::Relaxed),
            contended: self.c.contended.load(Ordering::Relaxed),
            held_ns: self.c.held_ns.load(Ordering::Relaxed),
            productive: self.c.productive.load(Ordering::Relaxed),
            unproductive: self.c.unproductive.load(Ordering::Relaxed),
        }
    }

    /// Adds `n` to a counter written only under the lock: load + store, no RMW.
    #[inline]
    fn bump(c: &AtomicU64, n: u64) {
        // Relaxed: single writer (the holder); the lock's hand-off orders successive writers.
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// A protocol `L` with [`LockStats`]. Node: [`CountedNode`].
#[derive(Debug, Default)]
pub struct Counted<L> {
    /// The protocol.
    inner: L,
    /// The counters.
    stats: LockStats,
    /// Measure time held (two clock reads per acquisition).
    timed: bool,
}

/// Node of [`Counted`]: the protocol's node and the acquisition's start time.
#[derive(Debug, Default)]
pub struct CountedNode<N> {
    /// The protocol's node.
    inner: N,
    /// When the current acquisition got the lock (timing on).
    since: Cell<Option<Instant>>,
}

impl<L> Counted<L> {
    /// Counts acquisitions, contention and productivity.
    pub fn new(inner: L) -> Self {
        Counted { inner, stats: LockStats::new(), timed: false }
    }

    /// Also measures time held.
    pub fn timed(inner: L) -> Self {
        Counted { inner, stats: LockStats::new(), timed: true }
    }

    /// The wrapped protocol.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The counters.
    pub fn stats(&self) -> &LockStats {
        &self.stats
    }

    /// Reports what the current acquisition achieved. Call it while holding the lock (the
    /// counters are single-writer); calls from a non-holder may be lost, never unsafe.
    #[inline]
    pub fn record_progress(&self, p: Acquisition) {
        match p {
            Acquisition::Productive => LockStats::bump(&self.stats.c.productive, 1),
            Acquisition::Unproductive => LockStats::bump(&self.stats.c.unproductive, 1),
        }
    }

    #[inline]
    fn inner_node<N>(node: Pin<&CountedNode<N>>) -> Pin<&N> {
        // SAFETY: structural pinning: `CountedNode` never moves `inner` out and has no `Drop`.
        unsafe { node.map_unchecked(|n| &n.inner) }
    }

    #[inline]
    fn acquired<N>(&self, node: &CountedNode<N>, contended: bool) {
        LockStats::bump(&self.stats.c.acquisitions, 1);
        if contended {
            LockStats::bump(&self.stats.c.contended, 1);
        }
        if self.timed {
            node.since.set(Some(Instant::now()));
        }
    }

    #[inline]
    fn releasing<N>(&self, node: &CountedNode<N>) {
        if let Some(t) = node.since.take() {
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            LockStats::bump(&self.stats.c.held_ns, ns);
        }
    }
}

// SAFETY: acquisition and release are `L`'s; the counters are written only between them.
unsafe impl<L: RawLock> RawLock for Counted<L> {
    type Node = CountedNode<L::Node>;

    #[inline]
    fn lock(&self, node: Pin<&Self::Node>) {
        let n = Self::inner_node(node);
        let contended = !self.inner.try_lock(n);
        if contended {
            self.inner.lock(n);
        }
        self.acquired(&node, contended);
    }

    #[inline]
    fn try_lock(&self, node: Pin<&Self::Node>) -> bool {
        let ok = self.inner.try_lock(Self::inner_node(node));
        if ok {
            self.acquired(&node, false);
        }
        ok
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&Self::Node>) {
        self.releasing(&node);
        // SAFETY: forwarded contract.
        unsafe { self.inner.unlock(Self::inner_node(node)) }
    }

    fn no_waiters(&self, node: Pin<&Self::Node>) -> bool {
        self.inner.no_waiters(Self::inner_node(node))
    }
}

// SAFETY: as the `RawLock` impl, per class.
unsafe impl<L: RawPriorityLock> RawPriorityLock for Counted<L> {
    #[inline]
    fn lock_low(&self, node: Pin<&Self::Node>) {
        let n = Self::inner_node(node);
        let contended = !self.inner.try_lock_low(n);
        if contended {
            self.inner.lock_low(n);
        }
        self.acquired(&node, contended);
    }

    #[inline]
    fn try_lock_low(&self, node: Pin<&Self::Node>) -> bool {
        let ok = self.inner.try_lock_low(Self::inner_node(node));
        if ok {
            self.acquired(&node, false);
        }
        ok
    }

    #[inline]
    unsafe fn unlock_low(&self, node: Pin<&Self::Node>) {
        self.releasing(&node);
        // SAFETY: forwarded contract.
        unsafe { self.inner.unlock_low(Self::inner_node(node)) }
    }
}

// SAFETY: `L`'s timed acquisition, counted as contended when the first attempt failed.
unsafe impl<L: RawTimedLock> RawTimedLock for Counted<L> {
    fn try_lock_for(&self, node: Pin<&Self::Node>, timeout: Duration) -> bool {
        let n = Self::inner_node(node);
        if self.inner.try_lock(n) {
            self.acquired(&node, false);
            return true;
        }
        let ok = self.inner.try_lock_for(n, timeout);
        if ok {
            self.acquired(&node, true);
        }
        ok
    }
}
