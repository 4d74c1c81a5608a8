//! The three progress modes (path step 4) and blocking waits.
//!
//! * `Global` — [Patinyasakdikul 2019, Alg. 1]: a waiter loops over its requests and, while any is
//!   pending, enters progress under the one progress lock. Never parks (it yields the core
//!   when a pass was unproductive, as Open MPI's `yield_when_idle`). The baseline.
//! * `Owner` — [Patinyasakdikul 2019, Alg. 2]: a waiter attaches its pending requests to its
//!   thread's sync object and waits on it. One waiter at a time owns progress and keeps it
//!   for its whole wait; when the owner is idle it parks on the rank's doorbell (woken by
//!   the next frame); the others park on their sync objects and are woken only when their
//!   own requests complete — or when the owner leaves and hands ownership on.
//! * `Concurrent` — [Patinyasakdikul 2019, Alg. 3-4]: a waiter progresses its dedicated CRI under
//!   try-lock, then the others, so every CRI is eventually progressed even if its thread is
//!   gone; matching runs concurrently per communicator.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use weft_sync::{Attach, Progress, SignalListener, Step, SyncObject};

use crate::config::ProgressMode;
use crate::request::Request;
use crate::runtime::Shared;

impl Shared {
    /// One non-blocking step of progress in the configured mode. Returns whether anything
    /// was handled.
    pub(crate) fn progress_once(&self) -> bool {
        match self.config.progress {
            ProgressMode::Global => self.progress_global() > 0,
            ProgressMode::Owner => {
                let me = crate::cri::thread_token();
                if self.owner.is(me) {
                    return self.progress_all() > 0;
                }
                if !self.owner.try_own(me) {
                    return false;
                }
                let n = self.progress_all();
                self.release_ownership();
                n > 0
            }
            ProgressMode::Concurrent => self.progress_concurrent() > 0,
        }
    }

    /// Algorithm 1's critical section: everything under the progress lock, entered with
    /// low priority ([Amer 2019, §4.1]: posting threads go first).
    fn progress_global(&self) -> usize {
        self.progress_lock.low(|_| {
            let n = self.progress_all();
            (n, n > 0)
        })
    }

    /// Progresses every CRI that has frames (the owner's and the global lock holder's pass).
    pub(crate) fn progress_all(&self) -> usize {
        let mut n = self.flush_deferred();
        for k in 0..self.cris.len() {
            if self.transport.has_frames(k) {
                n += self.cris[k].lock.low(|c| self.progress_cri(k, c));
            }
        }
        n
    }

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
    pub(crate) fn progress_concurrent(&self) -> usize {
        let n = self.cris.len();
        let mine = self.cri_for_thread();
        let mut count = self.flush_deferred();
        // Where checking costs a poll (libfabric: a CQ read under the CRI's state lock), poll
        // the dedicated CRI directly: one state-lock acquisition per frame instead of two.
        if self.transport.check_costs_a_poll() || self.transport.has_frames(mine) {
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

    /// Gives up ownership and hands it on: one parked waiter is woken to take over, and
    /// idle async pollers are woken in case frames arrived meanwhile.
    pub(crate) fn release_ownership(&self) {
        self.owner.release();
        if self.transport.any_frames() {
            self.transport.doorbell().ring_all();
        }
    }

    /// One step for an async poller; when idle, `cx` is woken by the next frame.
    pub(crate) fn poll_progress(&self, cx: &mut Context<'_>) -> Step {
        if self.progress_once() {
            return Step::Progressed;
        }
        self.transport.doorbell().register(cx.waker());
        if self.work_before_sleep() {
            // A frame came, or room for a deferred one, before the registration: go round
            // again.
            return Step::Progressed;
        }
        Step::Idle
    }

    /// The last check of a poller about to sleep on the doorbell, made after it registered
    /// or listened: frames are waiting, or one more try at the deferred frames sent one. The
    /// transport rings the doorbell for new frames and when a destination that refused a
    /// frame has room again (`SendError::WouldBlock`'s contract), but either ring may have
    /// come between the poller's last pass and its registration; this check sees what it
    /// announced.
    pub(crate) fn work_before_sleep(&self) -> bool {
        // Acquire: pairs with the store in `defer`. The flush runs under the global critical
        // section in `Global` mode, as every other send.
        self.transport.any_frames() || (self.has_deferred.load(Ordering::Acquire) && self.main_path(|| self.flush_deferred()) > 0)
    }

    /// Unposts a receive that has not matched yet. Returns whether it was unposted.
    pub(crate) fn cancel_recv(&self, comm: &crate::comm::CommState, inner: &Arc<crate::request::ReqInner>) -> bool {
        // The receive's tag is not kept: look in every tag partition (cancel is rare); after a
        // switch to one order (even one during the loop) each look goes to partition 0.
        self.main_path(|| (0..self.matching_parts(comm)).any(|part| self.with_matching_of(comm, part, |m| m.cancel(inner))))
    }
}

// ---- Executor hook -----------------------------------------------------------------------

impl Shared {
    /// One non-blocking progress pass for an idle pool worker: never waits for a lock. In
    /// `Owner` mode it takes the owner token only if free (and hands it back: the token
    /// passes between workers and waiters, no thread keeps it); in `Concurrent` mode it
    /// progresses the CRIs it wins by try-lock; in `Global` mode it takes the progress
    /// lock's try path. Returns whether anything was handled.
    pub(crate) fn progress_idle(&self) -> bool {
        // (Rendezvous reads that are over count as frames: `any_frames`.)
        if !self.transport.any_frames() && !self.has_deferred.load(Ordering::Acquire) {
            return false;
        }
        match self.config.progress {
            ProgressMode::Global => self
                .progress_lock
                .try_low(|_| {
                    let n = self.progress_all();
                    (n > 0, n > 0)
                })
                .unwrap_or(false),
            ProgressMode::Owner => self.progress_once(),
            ProgressMode::Concurrent => self.progress_concurrent() > 0,
        }
    }
}

// ---- end of executor hook -----------------------------------------------------------------

/// The progress hook of sync objects made by `Runtime::sync_object`.
pub(crate) struct Hook {
    pub(crate) shared: Arc<Shared>,
}

impl Progress for Hook {
    fn progress(&self) -> Step {
        if self.shared.progress_once() {
            Step::Progressed
        } else {
            Step::Idle
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        park_or_frames(&self.shared, listener);
    }

    fn poll_progress(&self, cx: &mut Context<'_>) -> Step {
        self.shared.poll_progress(cx)
    }
}

/// The hook of an `Owner`-mode wait (Algorithm 2): ownership is kept for the whole wait.
struct OwnerWait<'a> {
    shared: &'a Shared,
    me: u64,
}

impl Progress for OwnerWait<'_> {
    fn progress(&self) -> Step {
        let s = self.shared;
        if s.owner.own_or_take(self.me) {
            if s.progress_all() > 0 {
                Step::Progressed
            } else {
                Step::Idle
            }
        } else {
            Step::Park
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        let s = self.shared;
        // Run a pool task instead of sleeping ([Patinyasakdikul 2019, §4.6.2]).
        if crate::executor::help(s) {
            return;
        }
        if s.owner.is(self.me) {
            // The owner sleeps until the next frame (or its own completion).
            park_or_frames(s, listener);
        } else if let Some(handoff) = s.owner.listen() {
            // A plain waiter: its completions, or a hand-off of ownership.
            s.counters.parks.fetch_add(1, Ordering::Relaxed);
            let _ = park_two(s, listener, Some(handoff));
        }
    }
}

/// The hook of a `Concurrent`-mode wait (Algorithm 4).
struct ConcurrentWait<'a> {
    shared: &'a Shared,
    /// `None` under round-robin assignment (no thread has a CRI of its own).
    attend: Option<&'a Attend<'a>>,
}

impl Progress for ConcurrentWait<'_> {
    fn progress(&self) -> Step {
        if self.shared.progress_concurrent() > 0 {
            Step::Progressed
        } else {
            Step::Idle
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        // Run a pool task instead of sleeping ([Patinyasakdikul 2019, §4.6.2]).
        if crate::executor::help(self.shared) {
            return;
        }
        match self.attend {
            Some(a) => a.away(|| park_or_frames(self.shared, listener)),
            None => park_or_frames(self.shared, listener),
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
    shared: &'a Shared,
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
    pub(crate) fn new(shared: &'a Shared, ctx: u32, part: usize) -> Self {
        let k = shared.cri_for_thread();
        let tag = ctx.wrapping_mul(crate::comm::TAG_PARTS as u32 + 1).wrapping_add(part as u32 + 1).max(1);
        shared.cris[k].attending.store(tag, Ordering::Relaxed);
        let outer = WAIT_CTX.with(|c| c.replace(tag));
        Attend { shared, k, tag, outer }
    }

    /// Runs `f` (a park) with the attendance withdrawn.
    fn away<R>(&self, f: impl FnOnce() -> R) -> R {
        self.withdraw();
        let r = f();
        self.shared.cris[self.k].attending.store(self.tag, Ordering::Relaxed);
        r
    }

    fn withdraw(&self) {
        // Only our own mark: another thread sharing the CRI may have attended since. A load
        // and a store, not a compare-exchange (a locked instruction at the end of every
        // wait): the mark is a hint, and losing the race only clears another thread's mark,
        // which makes its CRI walked by others for the rest of its wait.
        let a = &self.shared.cris[self.k].attending;
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

/// Parks on `listener` and the doorbell, unless frames are already waiting.
///
/// A thread the doorbell woke makes one progress pass before it returns: the ring was
/// meant for whoever progresses, and its own wait may be over already (it would then leave
/// without looking at the frames, and the threads still parked were not woken for them).
fn park_or_frames(s: &Shared, listener: SignalListener<'_>) {
    let bell = s.transport.doorbell().listen();
    if s.work_before_sleep() {
        return;
    }
    s.counters.parks.fetch_add(1, Ordering::Relaxed);
    if park_two(s, listener, Some(bell)) == Woken::Second {
        s.progress_once();
    }
}

/// Which listener ended a `park_two`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woken {
    First,
    Second,
    /// Neither: the park limit passed.
    Timeout,
}

/// Wakes a parked thread.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static PARKER: Waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
}

/// Longest single park. A safety net, not the wake-up mechanism: every wake-up path is a
/// notification (a destination that refused a frame rings the doorbell when it has room
/// again: `SendError::WouldBlock`'s contract), so a missed notification costs at most this
/// much latency instead of a hang.
const PARK_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Blocks until either listener fires (or `PARK_LIMIT` passes, counted in
/// `park_timeouts`; callers re-check): yields the core for the configured
/// `yield_window` first (a notification then needs no futex wake), then parks.
fn park_two(s: &Shared, mut a: SignalListener<'_>, mut b: Option<SignalListener<'_>>) -> Woken {
    use std::future::Future;
    use std::pin::Pin;
    let waker = PARKER.with(|w| w.clone());
    let start = std::time::Instant::now();
    let deadline = start + PARK_LIMIT;
    // At most the park limit: a longer window yields just as long (the wait ends there), and
    // `start + Duration::MAX` would overflow the `Instant`.
    let yield_until = start + s.config.yield_window.min(PARK_LIMIT);
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(()) = Pin::new(&mut a).poll(&mut cx) {
            s.counters.wakes.fetch_add(1, Ordering::Relaxed);
            return Woken::First;
        }
        if let Some(b) = b.as_mut() {
            if let Poll::Ready(()) = Pin::new(b).poll(&mut cx) {
                s.counters.wakes.fetch_add(1, Ordering::Relaxed);
                return Woken::Second;
            }
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            s.counters.park_timeouts.fetch_add(1, Ordering::Relaxed);
            return Woken::Timeout;
        }
        if now < yield_until {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// Idle progress passes `wait_all` makes while testing requests directly, before it
/// attaches them to the thread's sync object.
const TEST_SPINS: u32 = 16;

/// The same while no thread on the machine waits for a core
/// (`IdleBackoff::may_spin_long`): about 0.1-0.2 ms of idle passes.
const LONG_TEST_SPINS: u32 = 2048;

/// Index of the first request from `from` on that has not completed (`reqs.len()` if none).
#[inline]
fn first_pending<B: Send + 'static>(reqs: &[Request<'_, B>], mut from: usize) -> usize {
    while from < reqs.len() && reqs[from].is_complete() {
        from += 1;
    }
    from
}

thread_local! {
    /// Sync objects for this thread's blocking waits (Algorithm 2's SYNC_INIT, made once and
    /// reused): one per nesting level. A wait takes one and gives it back empty; a pool task
    /// that a waiting thread runs instead of sleeping (`help`), and that itself waits, takes
    /// another, so it waits for its own requests only, not for those of the wait it runs in.
    static WAIT_SYNCS: RefCell<Vec<SyncObject<usize>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with one of this thread's wait sync objects, which nothing is attached to; `f`
/// must leave it so (every attachment completed or detached, every event taken).
fn with_wait_sync<R>(f: impl FnOnce(&SyncObject<usize>) -> R) -> R {
    let sync = WAIT_SYNCS.try_with(|p| p.borrow_mut().pop()).ok().flatten().unwrap_or_default();
    let r = f(&sync);
    debug_assert!(sync.size() == 0 && sync.probe() == 0, "a wait left its sync object in use");
    let _ = WAIT_SYNCS.try_with(move |p| p.borrow_mut().push(sync));
    r
}

/// What a blocking wait waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Every request complete (`MPI_Waitall`).
    All,
    /// One request complete and not yet taken (`MPI_Waitany`).
    Any,
}

/// Index of a request that completed and was not taken yet.
fn first_done<B: Send + 'static>(reqs: &[Request<'_, B>]) -> Option<usize> {
    reqs.iter().position(|r| r.is_live() && r.is_complete())
}

/// Whether `want` holds for `reqs`, and for [`Want::Any`] the index of a completed request
/// (`None` if every one was taken). `first`, the first request not known complete, only
/// moves forward: requests mostly complete in the order they were posted, so checking
/// them all costs O(1) per completion.
fn satisfied<B: Send + 'static>(reqs: &[Request<'_, B>], want: Want, first: &mut usize) -> (bool, Option<usize>) {
    match want {
        Want::All => {
            *first = first_pending(reqs, *first);
            (*first == reqs.len(), None)
        }
        Want::Any => match first_done(reqs) {
            Some(i) => (true, Some(i)),
            None => (!reqs.iter().any(|r| r.is_live()), None),
        },
    }
}

/// Blocks until every request in `reqs` has completed, in the runtime's progress mode.
pub(crate) fn wait_all<B: Send + 'static>(shared: &Shared, reqs: &mut [Request<'_, B>]) {
    wait(shared, reqs, Want::All);
}

/// The ranks `reqs` belong to, if more than one (in-process ranks of `build_local`).
fn ranks_of<'a, B: Send + 'static>(reqs: &'a [Request<'_, B>]) -> Option<Vec<&'a Shared>> {
    let comm = reqs.first()?.communicator();
    // Requests of one communicator handle (a window of sends or receives): one rank's.
    if reqs.iter().all(|r| std::ptr::eq(r.communicator(), comm)) {
        return None;
    }
    let first = comm.shared();
    if reqs.iter().all(|r| Arc::ptr_eq(r.communicator().shared(), first)) {
        return None;
    }
    let mut ranks: Vec<&Shared> = Vec::new();
    for r in reqs {
        let s = &**r.communicator().shared();
        if !ranks.iter().any(|k| std::ptr::eq(*k, s)) {
            ranks.push(s);
        }
    }
    Some(ranks)
}

/// Blocks until `want` holds for `reqs`, in the runtime's progress mode, driving `shared`
/// (the first request's rank). Returns, for [`Want::Any`], the index of a completed request
/// not yet taken (`None` if every request was taken already); for [`Want::All`], `None`.
///
/// Requests of several in-process ranks: `shared`'s progress alone may never complete the
/// others'. A wait that has not ended after its first idle passes looks (once: a scan of
/// the requests, which the common wait that ends at once does not pay) and, if they span
/// ranks, goes on in [`wait_polling`], driving every one of them.
pub(crate) fn wait<B: Send + 'static>(shared: &Shared, reqs: &mut [Request<'_, B>], want: Want) -> Option<usize> {
    let mut first = 0;
    if let (true, found) = satisfied(reqs, want, &mut first) {
        return found;
    }
    match shared.config.progress {
        ProgressMode::Global => {
            // Algorithm 1.
            let mut idle = 0;
            loop {
                if let (true, found) = satisfied(reqs, want, &mut first) {
                    return found;
                }
                if shared.progress_global() == 0 {
                    idle += 1;
                    if idle == TEST_SPINS {
                        if let Some(ranks) = ranks_of(reqs) {
                            return wait_polling(&ranks, reqs, want);
                        }
                    }
                    // Nothing to progress: run a pool task rather than only yield ([Patinyasakdikul 2019,
                    // §4.6.2]), as the other modes' waiters do before they park — with no
                    // pool workers, a task this wait depends on runs nowhere else.
                    if !crate::executor::help(shared) {
                        std::thread::yield_now();
                    }
                }
            }
        }
        ProgressMode::Owner | ProgressMode::Concurrent => {
            // While progress keeps completing requests (or for a few idle passes), test them
            // directly: attaching costs two atomic updates per request and completing an
            // attached one two more, which a wait that never sleeps does not need. What is
            // still pending then is attached (Algorithm 2 from there on). In `Owner` mode the
            // token, once taken, is kept through both phases (taking and releasing it per
            // pass would wake a parked waiter per release); a thread that cannot take it
            // makes no progress here and attaches at once.
            let owner_mode = shared.config.progress == ProgressMode::Owner;
            let me = crate::cri::thread_token();
            let lead = &reqs[first.min(reqs.len() - 1)];
            let attend = (!owner_mode && shared.config.assignment == crate::config::Assignment::Dedicated)
                .then(|| Attend::new(shared, lead.communicator().context_id(), lead.part()));
            let mut idle = 0;
            let mut spin = weft_sync::IdleBackoff::new();
            let pause = shared.config.idle_pause;
            let mut limit = TEST_SPINS;
            let mut found = None;
            let mut done = false;
            loop {
                if idle >= limit {
                    // With a core for every runnable thread on the machine (a rank per core
                    // polling, as in a ping-pong), attaching and the sync-object wait's yields
                    // would only lengthen a wait that is about to end: test on, up to
                    // `LONG_TEST_SPINS` idle passes.
                    if limit == TEST_SPINS && spin.may_spin_long() {
                        limit = LONG_TEST_SPINS;
                    } else {
                        break;
                    }
                }
                (done, found) = satisfied(reqs, want, &mut first);
                if done {
                    break;
                }
                let progressed = if owner_mode {
                    if !shared.owner.own_or_take(me) {
                        break;
                    }
                    shared.progress_all() > 0
                } else {
                    shared.progress_concurrent() > 0
                };
                if progressed {
                    idle = 0;
                } else {
                    idle += 1;
                    // Between idle polls: see `Config::idle_pause`; with every core
                    // already spinning, the thread whose frames we wait for needs ours.
                    if spin.may_spin() {
                        for _ in 0..pause {
                            std::hint::spin_loop();
                        }
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
            // `spin` keeps its slot through the sync-object wait below, whose own backoff then
            // spins only with a second, free slot (or, with a one-slot budget, on this one).
            let spanned = if done { None } else { ranks_of(reqs) };
            if let Some(ranks) = spanned {
                found = wait_polling(&ranks, reqs, want);
            } else if !done {
                // Algorithm 2: attach what is pending, then wait on the sync object.
                let owner_wait = OwnerWait { shared, me };
                let concurrent_wait = ConcurrentWait { shared, attend: attend.as_ref() };
                let hook: &dyn Progress = if owner_mode { &owner_wait } else { &concurrent_wait };
                found = with_wait_sync(|sync| wait_attached(sync, hook, shared, &mut reqs[first..], want)).map(|i| first + i);
                if owner_mode && !shared.owner.is(me) {
                    // We may have been the waiter a hand-off woke, and left without
                    // taking ownership (our requests were done): pass it on, or a
                    // parked waiter would wait with no owner (`OwnerToken::leave`).
                    shared.owner.leave(me);
                }
            }
            if owner_mode && shared.owner.is(me) {
                shared.release_ownership();
            }
            found
        }
    }
}

/// Algorithm 2's second half: attaches the pending requests of `reqs` to `sync` and waits on
/// it, driving `hook`. Returns, for [`Want::Any`], the index (in `reqs`) of a completed
/// request. `sync` is left empty.
///
/// A request already attached to a sync object of the user's cannot be attached here; the
/// wait then tests it between progress passes instead ([`wait_polling`]'s loop).
fn wait_attached<B: Send + 'static>(
    sync: &SyncObject<usize>,
    hook: &dyn Progress,
    shared: &Shared,
    reqs: &mut [Request<'_, B>],
    want: Want,
) -> Option<usize> {
    // Requests attached elsewhere (rare: no allocation unless there is one), and the end of
    // the attached range.
    let mut foreign: Vec<usize> = Vec::new();
    let mut attached = 0;
    let found = match want {
        Want::All => {
            for (i, r) in reqs.iter_mut().enumerate() {
                if !r.is_complete() {
                    attached = i + 1;
                    if sync.attach_counted(r).is_err() {
                        foreign.push(i);
                    }
                }
            }
            let _ = sync.wait_all_with(hook);
            if !foreign.is_empty() {
                wait_polling(&[shared], reqs, Want::All);
            }
            None
        }
        Want::Any => {
            for (i, r) in reqs.iter_mut().enumerate() {
                if r.is_live() && !r.is_complete() {
                    attached = i + 1;
                    if sync.attach(r, i).is_err() {
                        foreign.push(i);
                    }
                }
            }
            let found = if !foreign.is_empty() {
                // One of them completes outside our object: test every one.
                wait_polling(&[shared], reqs, Want::Any)
            } else {
                // Nothing attached means something completed between the test and here.
                sync.wait_any_with(hook).map(|c| c.data).or_else(|| first_done(reqs))
            };
            // Take the others back (those that completed meanwhile leave an event).
            for r in reqs.iter_mut() {
                if r.is_live() {
                    let _ = sync.detach(r);
                }
            }
            // A request completed by another thread while we detached it is reported as
            // `AlreadyComplete` as soon as its cell is marked complete, before the completer
            // has queued its event: drained now, the object would hand that event to this
            // thread's next wait as its answer. The object counts an attachment until its
            // event is queued, so once the count is zero (every request here is detached or
            // complete: it drops within the completers' delivery, with no progress needed)
            // the queue holds every event of this wait.
            if sync.size() != 0 {
                let _ = sync.wait_all();
            }
            while sync.query().is_some() {}
            found.or_else(|| first_done(reqs))
        }
    };
    // The completions our object took (and that are drained now) are the user's again: a
    // sync object they attach a request to after this wait gets its completion.
    for (i, r) in reqs[..attached].iter_mut().enumerate() {
        if r.is_live() && !foreign.contains(&i) {
            r.completion_cell().forget_delivery();
        }
    }
    found
}

/// Waits for `want` by testing `reqs` between progress passes of every rank in `ranks`, and
/// sleeping (up to 1 ms at a time, never burning a core for long) while none of them has
/// anything to do. For waits that one rank's sync object cannot serve: requests of several
/// in-process ranks at once (one rank's progress alone would never complete the others'),
/// or a request attached to a sync object of the user's.
pub(crate) fn wait_polling<B: Send + 'static>(ranks: &[&Shared], reqs: &[Request<'_, B>], want: Want) -> Option<usize> {
    let mut idle = weft_sync::IdleBackoff::new();
    let mut nap = std::time::Duration::from_micros(20);
    let mut first = 0;
    loop {
        if let (true, found) = satisfied(reqs, want, &mut first) {
            return found;
        }
        let mut progressed = false;
        for s in ranks {
            progressed |= s.progress_once();
        }
        if !progressed {
            // As the other waits do when idle: a pool task of one of the ranks.
            progressed = ranks.iter().any(|s| crate::executor::help(s));
        }
        if progressed {
            idle.reset();
            nap = std::time::Duration::from_micros(20);
        } else if !idle.is_completed() {
            idle.snooze();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
        }
    }
}
