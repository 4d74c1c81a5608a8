//! The rank's CRIs (Communication Resource Instances, [Patinyasakdikul 2019, §5.3]): each
//! is one endpoint of the transport with the lock that serializes posting and polling on
//! it. Which CRI a thread uses: round-robin, or dedicated ([Patinyasakdikul 2019, Alg. 3],
//! GET-INSTANCE-ID-DEDICATED: a thread keeps the CRI it was first given, per runtime, in
//! thread-local storage).
//!
//! Dedicated CRIs are given in the order threads first communicate, and setting a rank up
//! (its windows, locks, communicators) communicates: the thread that does it, usually the
//! main thread, keeps CRI 0, and the rank's first worker thread gets CRI 1. Kept so on
//! purpose. A main thread that goes on communicating beside its workers has a CRI of its
//! own; one that only waits for them leaves CRI 0 (on libfabric the endpoint peers'
//! one-sided operations target) to those operations, which the idle polls of every CRI
//! serve. Not counting the setup (the first worker bound to CRI 0 too) measured within the
//! noise of the distributed-lock benchmark on `shm` (`weft-bench dlock --provider shm
//! --launch weftrun --bench lb --lock d-mcs,fompi-spin --ranks 4 --ops 50`, 20 runs each on
//! 2 cores shared with other jobs: median acquisitions per second 19.6k against 22.3k for
//! d-mcs with quartiles 9.5k-23.7k and 9.7k-27.2k, 64.9k against 67.1k for fompi-spin),
//! and would put the main thread's frames on the first worker's CRI.
//! `Runtime::pin_cri` binds a thread to a CRI of the caller's choice.

use std::cell::{Cell, RefCell};

use crate::config::Assignment;
use crate::lock::path::PathLock;
use crate::loom::sync::atomic::{AtomicU32, Ordering};
use crate::matching::Matches;

use super::Engine;

/// Counts kept under one CRI's lock (its acquisitions are counted by the lock itself).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CriCounters {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

/// One CRI as the runtime sees it: the lock that serializes posting and polling on it.
pub(crate) struct Cri {
    /// Held while sending on (high priority) or progressing (low priority) this CRI; guards
    /// its message counters and a progress pass's scratch lists.
    pub(crate) lock: PathLock<CriLocal>,
    /// 1 + the context id a thread dedicated to this CRI waits on while it polls the CRI
    /// in a `Concurrent` wait right now (0: nobody); waiters on other communicators leave
    /// the CRI's frames to it (see `Engine::progress_concurrent`).
    pub(crate) attending: AtomicU32,
    /// The one-sided (RMA) gate of the CRI (`rma/`): held while an RMA operation is posted
    /// on it and through a flush of it, so a flush waits for exactly the operations posted
    /// before it; guards the copies of the data of puts posted and not yet flushed (freed
    /// by the next flush, or with the engine, after the transport).
    pub(crate) rma: parking_lot::Mutex<Vec<Box<[u8]>>>,
}

/// What a CRI's lock guards.
#[derive(Default)]
pub(crate) struct CriLocal {
    /// Messages sent and received through the CRI.
    pub(crate) counters: CriCounters,
    /// Scratch lists of a progress pass on the CRI (kept empty between passes, reused, so a
    /// pass allocates nothing): the frames drained from it, and the matches found for
    /// them. The CRI's, not the thread's: no thread-local lookup per pass, and a pass nested
    /// inside another (on another CRI) has lists of its own.
    pub(crate) matches: Matches,
}

impl Engine {
    /// The CRI this thread uses for its next send ([Patinyasakdikul 2019, Alg. 3]).
    #[inline]
    pub(crate) fn cri_for_thread(&self) -> usize {
        let n = self.cris.len();
        if n == 1 {
            return 0;
        }
        match self.config.assignment {
            Assignment::RoundRobin => self.rr.fetch_add(1, Ordering::Relaxed) % n,
            Assignment::Dedicated => crate::engine::cris::dedicated(self.id, || self.rr.fetch_add(1, Ordering::Relaxed) % n),
        }
    }
}

thread_local! {
    /// `(runtime id, CRI index)` pairs of this thread; a handful at most.
    static DEDICATED: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
    /// The pair last looked up (runtime ids start at 1): a thread mostly talks through one
    /// runtime, and a send and each progress pass ask, so the common answer is one
    /// thread-local load instead of a `RefCell` borrow and a scan.
    static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
}

/// This thread's dedicated CRI in runtime `id`, assigned by `assign` on first use.
#[inline(always)]
pub(crate) fn dedicated(id: u64, assign: impl FnOnce() -> usize) -> usize {
    if let Ok((r, k)) = LAST.try_with(Cell::get) {
        if r == id {
            return k;
        }
    }
    dedicated_slow(id, assign)
}

/// [`dedicated`] past the last runtime asked about: the thread's list, or a new choice.
#[inline(never)]
fn dedicated_slow(id: u64, assign: impl FnOnce() -> usize) -> usize {
    let known = DEDICATED.try_with(|d| d.borrow().iter().find(|(r, _)| *r == id).map(|&(_, k)| k));
    if let Ok(Some(k)) = known {
        let _ = LAST.try_with(|l| l.set((id, k)));
    }
    match known {
        Ok(Some(k)) => k,
        Ok(None) => {
            let k = assign();
            pin_cri(id, k);
            k
        }
        Err(_) => 0,
    }
}

/// Makes `k` this thread's dedicated CRI in runtime `id` (replacing an earlier choice).
pub(crate) fn pin_cri(id: u64, k: usize) {
    let _ = LAST.try_with(|l| l.set((id, k)));
    let _ = DEDICATED.try_with(|d| {
        let mut d = d.borrow_mut();
        match d.iter_mut().find(|(r, _)| *r == id) {
            Some(slot) => slot.1 = k,
            None => d.push((id, k)),
        }
    });
}

/// A token naming the calling thread (non-zero), used for progress ownership.
#[inline]
pub(crate) fn thread_token() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    // std: a `static` needs a `const fn new`, which loom's atomics lack.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.try_with(|t| *t).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(loom), not(miri)))]
mod tests {
    use crate::Runtime;

    /// The module docs' rule: the thread that sets a rank up keeps CRI 0, and the rank's
    /// worker threads get the next CRIs in the order they first communicate.
    #[test]
    fn the_setup_thread_keeps_cri_0_and_workers_get_the_next() {
        let rt = &Runtime::builder().env(false).cris(3).build_local(1).unwrap()[0];
        let w = rt.world().dup().unwrap();
        assert_eq!(rt.engine.cri_for_thread(), 0, "the thread that set the rank up");
        let workers: Vec<usize> = (0..3).map(|_| std::thread::scope(|s| s.spawn(|| rt.engine.cri_for_thread()).join().unwrap())).collect();
        assert_eq!(workers, vec![1, 2, 0]);
        w.free();
    }
}
