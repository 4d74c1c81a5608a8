//! The runtime's locks, one protocol per path ([Amer 2019, §4]), with per-path counters.
//!
//! Every lock of the communication path is a [`PathLock`]: a [`weft::lock::Mutex`] over a
//! [`DynLock`] (the protocol chosen by [`Locks`](crate::Locks)) wrapped in [`Counted`]
//! (acquisitions, contended acquisitions, optional time held, productive vs unproductive).
//!
//! Two classes of acquirer ([Amer 2019, §2.2], §4.1):
//!
//! * the **main path** — posting a send on a CRI, posting a receive into a matching engine,
//!   entering `Global` mode's critical section to do either — acquires with *high* priority
//!   ([`PathLock::high`]);
//! * the **progress path** — polling a CRI, matching an arrival, a `Global`-mode waiter's
//!   pass over the progress engine — acquires with *low* priority ([`PathLock::low`],
//!   [`PathLock::try_low`]) and reports whether the acquisition was productive ([Amer 2019,
//!   §3.2]: it completed or started at least one operation).
//!
//! For flat protocols both classes are the same acquisition; for `p-X-Y` they enter the
//! two-level lock of [Amer 2019, Fig. 5] from its two sides.
//!
//! [`weft::lock::Mutex`]: crate::lock::Mutex

use crate::lock::{Acquisition, Counted, DynLock, FlatKind, LockKind, LockOptions, LockStatsSnapshot, Mutex, ParkingLot};
use crate::loom::sync::atomic::{AtomicU64, Ordering};

/// A lock of one runtime path guarding a `T`.
pub(crate) struct PathLock<T> {
    m: PathImp<T>,
    /// Try-acquisitions that found the lock taken and gave up (`Concurrent` progress): not
    /// acquisitions, so not in the lock's own counters, which only its holder writes.
    refused: AtomicU64,
}

/// The protocol behind a [`PathLock`]. The default of the CRI and matching paths,
/// `parking_lot`, is held directly: through [`DynLock`] every acquisition would build (and
/// drop) a node with a field for each queue protocol, a cost paid twice per message on the
/// path of one eager send and receive although `parking_lot` uses none of it. Inline, not
/// boxed: a box would put a pointer chase on every acquisition of the other protocols.
#[allow(clippy::large_enum_variant)]
enum PathImp<T> {
    /// `parking_lot` (no node).
    Plain(Mutex<Counted<ParkingLot>, T>),
    /// Any other protocol, chosen at run time.
    Dyn(Mutex<Counted<DynLock>, T>),
}

/// Runs `$e` with `$m` bound to the chosen mutex (the same code for either protocol).
macro_rules! with_imp {
    ($imp:expr, |$m:ident| $e:expr) => {
        match $imp {
            PathImp::Plain($m) => $e,
            PathImp::Dyn($m) => $e,
        }
    };
}

impl<T> PathLock<T> {
    /// `value` behind a lock of protocol `kind`; `timed` also measures time held. `opts`
    /// carries the topology, detected once per runtime (HMCS levels).
    pub(crate) fn new(kind: LockKind, opts: &LockOptions, timed: bool, value: T) -> Self {
        fn counted<L>(lock: L, timed: bool) -> Counted<L> {
            if timed {
                Counted::timed(lock)
            } else {
                Counted::new(lock)
            }
        }
        let m = match kind {
            LockKind::Flat(FlatKind::ParkingLot) => PathImp::Plain(Mutex::with_raw(counted(ParkingLot::new(), timed), value)),
            _ => PathImp::Dyn(Mutex::with_raw(counted(DynLock::with_options(kind, opts), timed), value)),
        };
        PathLock { m, refused: AtomicU64::new(0) }
    }

    /// Main path: runs `f` holding the lock with high priority.
    #[inline]
    pub(crate) fn high<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        with_imp!(&self.m, |m| m.with_lock(f))
    }

    /// Progress path: runs `f` holding the lock with low priority; `f` returns its result
    /// and whether it was productive.
    #[inline]
    pub(crate) fn low<R>(&self, f: impl FnOnce(&mut T) -> (R, bool)) -> R {
        with_imp!(&self.m, |m| m.with_lock_low(|v| record(m.raw(), f(v))))
    }

    /// Progress path without waiting: `None` (counted as refused) if the lock is taken.
    #[inline]
    pub(crate) fn try_low<R>(&self, f: impl FnOnce(&mut T) -> (R, bool)) -> Option<R> {
        let r = with_imp!(&self.m, |m| m.try_with_lock_low(|v| record(m.raw(), f(v))));
        if r.is_none() {
            // Relaxed: a statistic.
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// The lock's counters; `contended` also counts refused try-acquisitions.
    pub(crate) fn stats(&self) -> LockStatsSnapshot {
        let mut s = with_imp!(&self.m, |m| m.raw().stats().snapshot());
        s.contended += self.refused.load(Ordering::Relaxed);
        s
    }
}

/// Reports a progress-path acquisition's outcome to its lock's counters (while holding it).
#[inline]
fn record<L, R>(lock: &Counted<L>, (r, productive): (R, bool)) -> R {
    lock.record_progress(if productive { Acquisition::Productive } else { Acquisition::Unproductive });
    r
}

/// Adds `b` into `a` (per-path totals over many locks, e.g. every CRI).
pub(crate) fn add(a: &mut LockStatsSnapshot, b: LockStatsSnapshot) {
    a.acquisitions += b.acquisitions;
    a.contended += b.contended;
    a.held_ns += b.held_ns;
    a.productive += b.productive;
    a.unproductive += b.unproductive;
}
