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
//! Dekker-style: the worker's `num_sleeping` increment (SeqCst) precedes its re-check of
//! the queues; the pusher's fence (SeqCst) follows its push and precedes its load of
//! `num_sleeping`. One of the two sees the other.

use crate::loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::pool::Pool;
use super::Drive;

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
        let _ = self.threads[index].set(std::thread::current());
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

/// Unparks a thread (the waker of the doorbell listener a worker sleeps on).
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Parks worker `index` until new work, network activity, shutdown, or `WORKER_NAP_LIMIT`.
pub(super) fn park_worker(drive: &dyn Drive, pool: &Pool, index: usize) {
    let sleep = &pool.sleep;
    sleep.parked[index].store(true, Ordering::Relaxed);
    // SeqCst: see the module docs.
    sleep.num_sleeping.fetch_add(1, Ordering::SeqCst);

    // Network wake-ups (see the module docs for why Owner mode differs). Deferred frames do
    // not keep a worker awake: the transport rings the doorbell when their destination has
    // room, and `listen` looks once more after listening.
    let listened = drive.listen();
    let (mut listener, someone_owns) = match listened {
        Some(l) if !pool.has_work() && !pool.is_shutdown() => l,
        _ => {
            sleep.unsleep(index);
            return;
        }
    };
    drive.count_park(false);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + WORKER_NAP_LIMIT;
    let mut heard = false;
    loop {
        if !sleep.parked[index].load(Ordering::Acquire) || pool.is_shutdown() {
            drive.count_park(true);
            break;
        }
        if let Poll::Ready(()) = Pin::new(&mut listener).poll(&mut cx) {
            drive.count_park(true);
            heard = true;
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
    sleep.unsleep(index);
    if heard {
        drive.heard(someone_owns);
    }
}
