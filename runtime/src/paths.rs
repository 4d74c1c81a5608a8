//! The runtime's locks, one protocol per path (seed 000 §4), with per-path counters.
//!
//! Every lock of the communication path is a [`PathLock`]: a [`weft::lock::Mutex`] over a
//! [`DynLock`] (the protocol chosen by [`Locks`](crate::Locks)) wrapped in [`Counted`]
//! (acquisitions, contended acquisitions, optional time held, productive vs unproductive).
//!
//! Two classes of acquirer (seed 000 §2.2, §4.1):
//!
//! * the **main path** — posting a send on a CRI, posting a receive into a matching engine,
//!   entering `Global` mode's critical section to do either — acquires with *high* priority
//!   ([`PathLock::high`]);
//! * the **progress path** — polling a CRI, matching an arrival, a `Global`-mode waiter's
//!   pass over the progress engine — acquires with *low* priority ([`PathLock::low`],
//!   [`PathLock::try_low`]) and reports whether the acquisition was productive (seed 000
//!   §3.2: it completed or started at least one operation).
//!
//! For flat protocols both classes are the same acquisition; for `p-X-Y` they enter the
//! two-level lock of seed 000 Fig. 5 from its two sides.
//!
//! [`weft::lock::Mutex`]: crate::lock::Mutex

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lock::{Counted, DynLock, LockKind, LockOptions, LockStatsSnapshot, Mutex, Progress};

/// A lock of one runtime path guarding a `T`.
pub(crate) struct PathLock<T> {
    m: Mutex<Counted<DynLock>, T>,
    /// Try-acquisitions that found the lock taken and gave up (`Concurrent` progress): not
    /// acquisitions, so not in the lock's own counters, which only its holder writes.
    refused: AtomicU64,
}

impl<T> PathLock<T> {
    /// `value` behind a lock of protocol `kind`; `timed` also measures time held. `opts`
    /// carries the topology, detected once per runtime (HMCS levels).
    pub(crate) fn new(kind: LockKind, opts: &LockOptions, timed: bool, value: T) -> Self {
        let lock = DynLock::with_options(kind, opts);
        let raw = if timed { Counted::timed(lock) } else { Counted::new(lock) };
        PathLock { m: Mutex::with_raw(raw, value), refused: AtomicU64::new(0) }
    }

    /// Main path: runs `f` holding the lock with high priority.
    #[inline]
    pub(crate) fn high<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.m.with_lock(f)
    }

    /// Progress path: runs `f` holding the lock with low priority; `f` returns its result
    /// and whether it was productive.
    #[inline]
    pub(crate) fn low<R>(&self, f: impl FnOnce(&mut T) -> (R, bool)) -> R {
        self.m.with_lock_low(|v| self.record(f(v)))
    }

    /// Progress path without waiting: `None` (counted as refused) if the lock is taken.
    #[inline]
    pub(crate) fn try_low<R>(&self, f: impl FnOnce(&mut T) -> (R, bool)) -> Option<R> {
        let r = self.m.try_with_lock_low(|v| self.record(f(v)));
        if r.is_none() {
            // Relaxed: a statistic.
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    #[inline]
    fn record<R>(&self, (r, productive): (R, bool)) -> R {
        self.m.raw().record_progress(if productive { Progress::Productive } else { Progress::Unproductive });
        r
    }

    /// The lock's counters; `contended` also counts refused try-acquisitions.
    pub(crate) fn stats(&self) -> LockStatsSnapshot {
        let mut s = self.m.raw().stats().snapshot();
        s.contended += self.refused.load(Ordering::Relaxed);
        s
    }
}

/// Adds `b` into `a` (per-path totals over many locks, e.g. every CRI).
pub(crate) fn add(a: &mut LockStatsSnapshot, b: LockStatsSnapshot) {
    a.acquisitions += b.acquisitions;
    a.contended += b.contended;
    a.held_ns += b.held_ns;
    a.productive += b.productive;
    a.unproductive += b.unproductive;
}
