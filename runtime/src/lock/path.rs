//! The runtime's locks, one protocol per path ([Amer 2019, §4]), with per-path counters.
//!
//! Every lock of the communication path is a [`PathLock`]: a [`weft::lock::Mutex`] over the
//! protocol chosen by [`Locks`](crate::Locks), wrapped in [`Counted`] (acquisitions,
//! contended acquisitions, optional time held, productive vs unproductive) when the
//! runtime's lock statistics are on ([`Counting`]).
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

use crate::lock::{Acquisition, Counted, DynLock, FlatKind, LockKind, LockOptions, LockStatsSnapshot, Mutex, TasPark};
use crate::loom::sync::atomic::{AtomicU64, Ordering};

/// What the path locks count ([`Config::lock_stats`], [`Config::lock_timing`]).
///
/// [`Config::lock_stats`]: crate::Config::lock_stats
/// [`Config::lock_timing`]: crate::Config::lock_timing
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counting {
    /// Nothing: an acquisition is the protocol's alone.
    Off,
    /// Acquisitions, contended ones, productive and unproductive ones.
    Counts,
    /// The counts and the time held (two clock reads per acquisition).
    Timed,
}

impl Counting {
    /// Counting as the switches ask: timing implies the counts.
    pub(crate) fn new(stats: bool, timing: bool) -> Self {
        match (stats, timing) {
            (_, true) => Counting::Timed,
            (true, false) => Counting::Counts,
            (false, false) => Counting::Off,
        }
    }
}

/// A lock of one runtime path guarding a `T`.
pub(crate) struct PathLock<T> {
    m: PathImp<T>,
    /// Try-acquisitions that found the lock taken and gave up (`Concurrent` progress): not
    /// acquisitions, so not in the lock's own counters, which only its holder writes.
    /// Counted only with the counters on.
    refused: AtomicU64,
}

/// The protocol behind a [`PathLock`], with or without its counters. The default of the CRI
/// and matching paths, [`TasPark`], is held directly: through [`DynLock`] every
/// acquisition would build (and drop) a node with a field for each queue protocol, a cost
/// paid twice per message on the path of one eager send and receive although `TasPark`
/// uses none of it. Without counters ([`Counting::Off`], the default) an acquisition writes
/// no counter and builds no node for a start time: the counters' load-and-store, the check
/// for timing and the start time's store and reset were about 9 instructions per
/// acquisition, two acquisitions (a CRI's, a matching lock's) on every message. Inline,
/// not boxed: a box would put a pointer chase on every acquisition of the other protocols.
#[allow(clippy::large_enum_variant)]
enum PathImp<T> {
    /// [`TasPark`] (no node), not counted.
    Plain(Mutex<TasPark, T>),
    /// [`TasPark`], counted.
    PlainCounted(Mutex<Counted<TasPark>, T>),
    /// Any other protocol, chosen at run time, not counted.
    Dyn(Mutex<DynLock, T>),
    /// Any other protocol, counted.
    DynCounted(Mutex<Counted<DynLock>, T>),
}

/// Runs `$e` with `$m` bound to the chosen mutex (the same code for every protocol).
macro_rules! with_imp {
    ($imp:expr, |$m:ident| $e:expr) => {
        match $imp {
            PathImp::Plain($m) => $e,
            PathImp::PlainCounted($m) => $e,
            PathImp::Dyn($m) => $e,
            PathImp::DynCounted($m) => $e,
        }
    };
}

/// The counters of a path lock's protocol: [`Counted`]'s, or none.
trait PathStats {
    /// Reports a progress-path acquisition's outcome (while holding the lock).
    #[inline]
    fn record(&self, productive: bool) {
        let _ = productive;
    }

    /// Whether the lock keeps counters.
    #[inline]
    fn counts(&self) -> bool {
        false
    }

    /// The counters now (zero without them).
    fn snapshot(&self) -> LockStatsSnapshot {
        LockStatsSnapshot::default()
    }
}

impl PathStats for TasPark {}

impl PathStats for DynLock {}

impl<L> PathStats for Counted<L> {
    #[inline]
    fn record(&self, productive: bool) {
        self.record_progress(if productive { Acquisition::Productive } else { Acquisition::Unproductive });
    }

    #[inline]
    fn counts(&self) -> bool {
        true
    }

    fn snapshot(&self) -> LockStatsSnapshot {
        self.stats().snapshot()
    }
}

impl<T> PathLock<T> {
    /// `value` behind a lock of protocol `kind`, counting as `counting` says. `opts` carries
    /// the topology, detected once per runtime (HMCS levels).
    pub(crate) fn new(kind: LockKind, opts: &LockOptions, counting: Counting, value: T) -> Self {
        fn counted<L>(lock: L, counting: Counting) -> Counted<L> {
            if counting == Counting::Timed {
                Counted::timed(lock)
            } else {
                Counted::new(lock)
            }
        }
        let plain = matches!(kind, LockKind::Flat(FlatKind::TasPark));
        let m = match (plain, counting) {
            (true, Counting::Off) => PathImp::Plain(Mutex::with_raw(TasPark::new(), value)),
            (true, _) => PathImp::PlainCounted(Mutex::with_raw(counted(TasPark::new(), counting), value)),
            (false, Counting::Off) => PathImp::Dyn(Mutex::with_raw(DynLock::with_options(kind, opts), value)),
            (false, _) => PathImp::DynCounted(Mutex::with_raw(counted(DynLock::with_options(kind, opts), counting), value)),
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
        with_imp!(&self.m, |m| {
            let r = m.try_with_lock_low(|v| record(m.raw(), f(v)));
            if r.is_none() && m.raw().counts() {
                // Relaxed: a statistic.
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            r
        })
    }

    /// The lock's counters (zero unless counting); `contended` also counts refused
    /// try-acquisitions.
    pub(crate) fn stats(&self) -> LockStatsSnapshot {
        let mut s = with_imp!(&self.m, |m| m.raw().snapshot());
        s.contended += self.refused.load(Ordering::Relaxed);
        s
    }
}

/// Reports a progress-path acquisition's outcome to its lock's counters, if it has any
/// (while holding it).
#[inline]
fn record<L: PathStats, R>(lock: &L, (r, productive): (R, bool)) -> R {
    lock.record(productive);
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
