//! Sleeping workers and waking them (rayon's `sleep/` and tokio's `idle.rs` are the models).
//!
//! A worker about to sleep sets its `parked` flag and bumps `num_sleeping`, re-checks for
//! work, then parks its thread. A pusher checks `num_sleeping` (one load, after a fence) and
//! only when someone sleeps claims one flag (true -> false) and unparks that thread. The
//! worker also listens to the rank's doorbell, so network activity wakes it to progress:
//! in `Owner` mode only while nobody owns progress (the owner listens itself), otherwise to
//! the ownership hand-off. Both notify one listener, which may be this worker instead of
//! the blocked thread that needed it: a worker that cannot use the notification passes it
//! on (`pass_on`).
//!
//! # Memory ordering
//!
//! Dekker-style, a SeqCst fence on each side: the worker's follows its announcement
//! (`num_sleeping` incremented, flag set) and precedes its re-check of the queues; the
//! pusher's follows its push and precedes its load of `num_sleeping` and of the flags. One
//! of the two sees the other. (The worker's fence does not rely on the queues' own loads
//! being SeqCst.) The loom models at the bottom check it on `Sleepers` itself: no worker
//! stays parked with a task queued.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::pool::Pool;
use super::Drive;
use crate::loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use crate::loom::thread::{self, Thread};

/// Longest single sleep: a safety net only (every wake-up path is a notification), cheap
/// enough that an idle runtime stays far below 1% of a core.
const WORKER_NAP_LIMIT: Duration = Duration::from_millis(250);

/// The sleep state of the pool's workers.
pub(crate) struct Sleepers {
    /// Per worker: parked (or about to park) and not yet claimed by a waker.
    parked: Box<[CachePadded<AtomicBool>]>,
    /// Per worker: its thread, set before it first parks.
    threads: Box<[OnceLock<Thread>]>,
    /// Number of `parked` flags set.
    num_sleeping: CachePadded<AtomicUsize>,
}

impl Sleepers {
    pub(super) fn new(n: usize) -> Self {
        Sleepers {
            parked: (0..n).map(|_| CachePadded::new(AtomicBool::new(false))).collect(),
            threads: (0..n).map(|_| OnceLock::new()).collect(),
            num_sleeping: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Records the calling thread as worker `index`.
    pub(super) fn register(&self, index: usize) {
        let _ = self.threads[index].set(thread::current());
    }

    /// Announces worker `index` as about to sleep: counts it in `num_sleeping`, then sets
    /// its flag. The worker then re-checks for work and either takes its flag back
    /// ([`unsleep`](Self::unsleep)) or sleeps until [`is_claimed`](Self::is_claimed).
    ///
    /// Count first, flag second (and a flag is cleared before its count is taken back):
    /// `num_sleeping` is never below the number of flags set, so a pusher that finds it 0
    /// cannot miss a sleeper. Flag first, a pusher could claim the flag and take back a
    /// count not yet added, and a second pusher read 0 while another worker slept.
    fn announce(&self, index: usize) {
        self.num_sleeping.fetch_add(1, Ordering::Relaxed);
        // Release: a waker's claim (AcqRel) orders its decrement after this increment.
        self.parked[index].store(true, Ordering::Release);
        // SeqCst: see the module docs (the re-check comes after this fence).
        fence(Ordering::SeqCst);
    }

    /// Whether worker `index`'s flag was claimed by a waker (or taken back by `unsleep`):
    /// what a sleeping worker checks each time its thread wakes. Acquire: pairs with the
    /// waker's claim, made after its push.
    fn is_claimed(&self, index: usize) -> bool {
        !self.parked[index].load(Ordering::Acquire)
    }

    /// Wakes one sleeping worker, if any (one fence and one load when none sleeps).
    #[inline]
    pub(super) fn notify_one(&self) {
        // SeqCst: see the module docs (the push happened before this fence).
        fence(Ordering::SeqCst);
        if self.num_sleeping.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.notify_slow(false);
    }

    /// Wakes every worker (shutdown).
    pub(super) fn notify_all(&self) {
        self.notify_slow(true);
        for t in self.threads.iter().filter_map(|t| t.get()) {
            t.unpark();
        }
    }

    #[cold]
    fn notify_slow(&self, all: bool) {
        for (i, flag) in self.parked.iter().enumerate() {
            if flag.load(Ordering::Relaxed) && flag.compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.num_sleeping.fetch_sub(1, Ordering::Relaxed);
                if let Some(t) = self.threads[i].get() {
                    t.unpark();
                }
                if !all {
                    return;
                }
            }
        }
    }

    /// Clears our own flag (woken by a timeout, the doorbell, or work found on re-check).
    fn unsleep(&self, index: usize) {
        if self.parked[index].swap(false, Ordering::AcqRel) {
            self.num_sleeping.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A waker that unparks a thread: of the listener a parked worker sleeps on, and of every
/// other thread of the runtime that parks (waiters, the courier).
pub(crate) struct Unpark(pub(crate) std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Parks worker `index` until new work, network activity, shutdown, or `WORKER_NAP_LIMIT`.
///
/// Its sleep is on std's thread (loom has no `park_timeout`); the loom model below sleeps
/// with loom's `park` in its place, on the same `Sleepers` calls.
pub(super) fn park_worker(drive: &dyn Drive, pool: &Pool, index: usize) {
    let sleep = &pool.sleep;
    sleep.announce(index);

    // Network wake-ups (see the module docs for why Owner mode differs). Deferred frames do
    // not keep a worker awake: the transport rings the doorbell when their destination has
    // room, and `listen_scoped` looks once more after listening.
    let mut parked = false;
    let mut heard = None;
    drive.listen_scoped(&mut |listened| {
        let (mut listener, someone_owns) = match listened {
            Some(l) if !pool.has_work() && !pool.is_shutdown() => l,
            _ => return,
        };
        parked = true;
        drive.count_park(false);
        tracing::trace!(worker = index, "pool worker parks");
        UNPARK.with(|waker| {
            let mut cx = Context::from_waker(waker);
            let deadline = Instant::now() + WORKER_NAP_LIMIT;
            loop {
                if sleep.is_claimed(index) || pool.is_shutdown() {
                    drive.count_park(true);
                    break;
                }
                if let Poll::Ready(()) = Pin::new(&mut listener).poll(&mut cx) {
                    drive.count_park(true);
                    heard = Some(someone_owns);
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    // An idle worker's periodic look around, not a missed notification: not
                    // counted in `park_timeouts`.
                    break;
                }
                std::thread::park_timeout(deadline - now);
            }
        });
    });
    sleep.unsleep(index);
    if parked {
        tracing::trace!(worker = index, heard = heard.is_some(), "pool worker unparks");
    }
    if let Some(someone_owns) = heard {
        drive.heard(someone_owns);
    }
}

std::thread_local! {
    /// The waker of the listener a parked worker sleeps on: it unparks the worker's thread
    /// (made once per thread, not per park).
    static UNPARK: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

#[cfg(all(test, not(loom), not(miri)))]
mod tests {
    use std::time::Duration;

    use super::{park_worker, WORKER_NAP_LIMIT};
    use crate::executor::pool::Pool;
    use crate::executor::Drive;
    use crate::progress::park::tests::allocations_here;
    use crate::{ProgressMode, Runtime};

    /// An idle pool worker's park allocates nothing, in every progress mode (its listener
    /// lives on its stack, its waker is made once per thread; each used to be allocated at
    /// every park, several times a second per idle worker). Each park sleeps out the
    /// worker's nap limit: nothing wakes it.
    #[test]
    fn an_idle_worker_park_allocates_nothing() {
        for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
            let rt = Runtime::builder().env(false).progress(mode).workers(0).yield_window(Duration::ZERO).build().unwrap();
            let drive: &dyn Drive = &*rt.engine;
            let pool = Pool::for_tests(1);
            // What a first park makes once (the thread's parker and waker, the events' lists).
            park_worker(drive, &pool, 0);
            let parks = rt.engine.counters.parks.load(std::sync::atomic::Ordering::Relaxed);
            let t0 = std::time::Instant::now();
            let n = allocations_here(|| park_worker(drive, &pool, 0));
            assert_eq!(rt.engine.counters.parks.load(std::sync::atomic::Ordering::Relaxed), parks + 1, "{mode}: did not park");
            assert!(t0.elapsed() >= WORKER_NAP_LIMIT / 2, "{mode}: the park ended early");
            assert_eq!(n, 0, "{mode}: allocations in an idle worker's park");
        }
    }
}

#[cfg(all(test, loom))]
mod model {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    use super::Sleepers;

    /// Takes one of the published tasks (a count stands for the pool's queues).
    fn take(tasks: &AtomicUsize) -> bool {
        tasks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Worker `index` until it has run one task: `worker_main`'s loop reduced to taking a
    /// task or parking, and `park_worker`'s sleep with loom's `park` for its timed one.
    fn worker(sleep: &Sleepers, tasks: &AtomicUsize, index: usize) {
        sleep.register(index);
        loop {
            if take(tasks) {
                return;
            }
            sleep.announce(index);
            // The re-check (`Pool::has_work`: the injector's `is_empty` loads SeqCst).
            if tasks.load(Ordering::SeqCst) > 0 {
                sleep.unsleep(index);
                continue;
            }
            while !sleep.is_claimed(index) {
                thread::park();
            }
            sleep.unsleep(index);
        }
    }

    /// What `Pool::schedule` does: push, then wake one sleeper.
    fn push(sleep: &Sleepers, tasks: &AtomicUsize) {
        tasks.fetch_add(1, Ordering::Release);
        sleep.notify_one();
    }

    /// `workers` workers and as many tasks, pushed by `pushers` threads (the rest by the
    /// model's own thread). Loom fails the model with a deadlock if a worker stays parked
    /// with a task published (a lost wake-up); every flag and `num_sleeping` end at rest.
    fn run(workers: usize, pushers: usize, preemptions: Option<usize>) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = preemptions;
        b.check(move || {
            let sleep = Arc::new(Sleepers::new(workers));
            let tasks = Arc::new(AtomicUsize::new(0));
            let mut threads: Vec<_> = (0..workers)
                .map(|i| {
                    let (sleep, tasks) = (sleep.clone(), tasks.clone());
                    thread::spawn(move || worker(&sleep, &tasks, i))
                })
                .collect();
            threads.extend((0..pushers).map(|_| {
                let (sleep, tasks) = (sleep.clone(), tasks.clone());
                thread::spawn(move || push(&sleep, &tasks))
            }));
            for _ in pushers..workers {
                push(&sleep, &tasks);
            }
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(tasks.load(Ordering::Relaxed), 0);
            assert_eq!(sleep.num_sleeping.load(Ordering::Relaxed), 0, "num_sleeping not back to 0");
            assert!(sleep.parked.iter().all(|f| !f.load(Ordering::Relaxed)), "a parked flag left set");
        });
    }

    /// One worker, one push from another thread.
    #[test]
    fn a_push_wakes_the_worker() {
        run(1, 0, None);
    }

    /// Two workers, two tasks pushed from two threads: no worker is left asleep with a
    /// task queued, whichever worker a push claims.
    #[test]
    fn two_pushes_wake_two_workers() {
        run(2, 1, Some(2));
    }
}
