//! `ProgressMode::Concurrent` ([Patinyasakdikul 2019, Alg. 3-4]): a waiter progresses its
//! dedicated CRI under try-lock, then the others, so every CRI is eventually progressed even
//! if its thread is gone; matching runs concurrently per communicator.

use weft_sync::{Progress, SignalListener, Step};

use super::park::park_or_frames;
use crate::engine::Engine;
use crate::loom::sync::atomic::Ordering;

impl Engine {
    /// [Patinyasakdikul 2019, Alg. 4]: the dedicated CRI first (try-lock), then the others, returning
    /// at the first CRI that yields completions.
    ///
    /// Algorithm 4 walks the others with the shared round-robin counter; this walks them
    /// from the dedicated index onwards instead, which gives every CRI the same eventual
    /// progress without writing a shared counter on every call (STYLE habit 5).
    ///
    /// While the calling thread waits on a communicator, the walk skips a CRI whose own
    /// thread is polling it right now for a *different* communicator ([`Attend`]): that
    /// thread takes the frames on its next pass, and taking them from it would complete its
    /// requests from another core and wake it for nothing (one communicator per thread
    /// pair: each pair's frames arrive on its receiver's CRI). Waiters on the *same*
    /// communicator still walk each other's CRIs: one thread matching for both under one
    /// lock acquisition beats two threads contending for that communicator's matching lock —
    /// unless messages are ordered per sending thread
    /// ([`Config::per_thread_order`](crate::config::Config::per_thread_order)): then each CRI
    /// is its own ordering channel, no frame on another thread's CRI holds ours back, and
    /// taking that thread's frames would only move its requests' cache lines to our core
    /// (multirate, 2-8 pairs on one communicator: 4.1-4.8 -> 6.0-6.2 M msg/s, medians of 5).
    /// A CRI nobody attends — its thread gone, computing or parked — is walked as
    /// Algorithm 4 says, and every [`STEAL_EVERY`]th idle pass walks all of them, so every
    /// CRI is still progressed eventually and frames that arrive on another thread's CRI
    /// are not left to that thread alone for long.
    ///
    /// The collectives in flight are advanced after the walk, with no lock held, and the
    /// callbacks the pass completed run then too (`deferred.rs`).
    pub(crate) fn progress_concurrent(&self) -> usize {
        crate::deferred::pass(|| {
            let n = self.walk_concurrent();
            n + self.advance_schedules(n > 0)
        })
    }

    /// Whether a waiter polls its dedicated CRI `mine`: it may hold frames, or checking
    /// costs a poll anyway (libfabric: a CQ read under the CRI's state lock), where polling
    /// directly takes the state lock once per frame instead of twice.
    #[inline]
    pub(crate) fn worth_polling(&self, mine: usize) -> bool {
        self.transport.check_costs_a_poll() || self.transport.has_frames(mine)
    }

    /// The walk of [`progress_concurrent`](Self::progress_concurrent).
    fn walk_concurrent(&self) -> usize {
        let n = self.cris.len();
        let mine = self.cri_for_thread();
        let mut count = self.flush_deferred();
        if self.worth_polling(mine) {
            count += self.cris[mine].lock.try_low(|c| self.progress_cri(mine, c)).unwrap_or(0);
        }
        if count > 0 {
            IDLE_PASSES.with(|c| c.set(0));
            return count;
        }
        if n == 1 {
            return count;
        }
        // Every `STEAL_EVERY`th idle pass in a row walks the attended CRIs too: a thread
        // whose frames arrive on a CRI another thread attends does not depend on that
        // thread alone for longer than that.
        let mine_ctx = WAIT_CTX.with(|c| c.get());
        // Per-thread order: every CRI is an ordering channel of its own (see above).
        let independent = self.config.per_thread_order && self.config.assignment == crate::config::Assignment::Dedicated;
        let all = IDLE_PASSES.with(|c| {
            let v = c.get().wrapping_add(1);
            c.set(v);
            v % STEAL_EVERY == 0
        });
        for i in 1..n {
            // `mine < n`, `i < n`: a subtraction, not a division, per CRI walked.
            let k = if mine + i >= n { mine + i - n } else { mine + i };
            // Relaxed: a hint; a stale value only delays a CRI by one pass.
            let attended = self.cris[k].attending.load(Ordering::Relaxed);
            if (!all && attended != 0 && mine_ctx != 0 && (independent || attended != mine_ctx)) || !self.transport.has_frames(k) {
                continue;
            }
            count += self.cris[k].lock.try_low(|c| self.progress_cri(k, c)).unwrap_or(0);
            if count > 0 {
                return count;
            }
        }
        count
    }
}

/// The hook of a `Concurrent`-mode wait (Algorithm 4).
pub(super) struct ConcurrentWait<'a> {
    pub(super) engine: &'a Engine,
    /// `None` under round-robin assignment (no thread has a CRI of its own).
    pub(super) attend: Option<&'a Attend<'a>>,
}

impl Progress for ConcurrentWait<'_> {
    fn progress(&self) -> Step {
        if self.engine.progress_concurrent() > 0 {
            Step::Progressed
        } else {
            Step::Idle
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        // Run a pool task instead of sleeping ([Patinyasakdikul 2019, §4.6.2]).
        if crate::executor::help(&self.engine.executor) {
            return;
        }
        match self.attend {
            Some(a) => a.away(|| park_or_frames(self.engine, listener)),
            None => park_or_frames(self.engine, listener),
        }
    }
}

/// How often (in idle passes in a row) a `Concurrent` pass also walks attended CRIs.
const STEAL_EVERY: u32 = 64;

thread_local! {
    /// This thread's `Concurrent` passes in a row that found nothing on its own CRI.
    static IDLE_PASSES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// 1 + the context id this thread's current `Concurrent` wait is on (0: not waiting).
    static WAIT_CTX: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A `Concurrent` waiter attending its dedicated CRI: its communicator (and tag partition) is
/// recorded in `Cri::attending` while it polls that CRI on every pass, so waiters on other
/// communicators (or partitions) leave the CRI's frames to it. Not while it parks (a parked
/// thread polls nothing; the others must walk its CRI then).
pub(crate) struct Attend<'a> {
    pub(super) engine: &'a Engine,
    k: usize,
    tag: u32,
    /// This thread's `WAIT_CTX` in the wait this one is nested in (a pool task run by a
    /// waiting thread), put back when this one ends; 0 if none.
    outer: u32,
}

impl<'a> Attend<'a> {
    /// Attends the calling thread's dedicated CRI for a wait on context `ctx`, tag partition
    /// `part` (waiters on other partitions of a `no_any_tag` communicator leave the CRI to
    /// it, as waiters on other communicators do).
    pub(crate) fn new(engine: &'a Engine, ctx: u32, part: usize) -> Self {
        let k = engine.cri_for_thread();
        let tag = ctx.wrapping_mul(crate::engine::TAG_PARTS as u32 + 1).wrapping_add(part as u32 + 1).max(1);
        engine.cris[k].attending.store(tag, Ordering::Relaxed);
        let outer = WAIT_CTX.with(|c| c.replace(tag));
        Attend { engine, k, tag, outer }
    }

    /// Runs `f` (a park) with the attendance withdrawn.
    fn away<R>(&self, f: impl FnOnce() -> R) -> R {
        self.withdraw();
        let r = f();
        self.engine.cris[self.k].attending.store(self.tag, Ordering::Relaxed);
        r
    }

    fn withdraw(&self) {
        // Only our own mark: another thread sharing the CRI may have attended since. A load
        // and a store, not a compare-exchange (a locked instruction at the end of every
        // wait): the mark is a hint, and losing the race only clears another thread's mark,
        // which makes its CRI walked by others for the rest of its wait.
        let a = &self.engine.cris[self.k].attending;
        if a.load(Ordering::Relaxed) == self.tag {
            a.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Attend<'_> {
    fn drop(&mut self) {
        self.withdraw();
        // The outer wait's mark on its CRI (a hint) is not put back: it may be another
        // rank's; that CRI is then walked by others until the outer wait parks and returns.
        WAIT_CTX.with(|c| c.set(self.outer));
    }
}
