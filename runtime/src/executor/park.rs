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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::pool::Pool;
use crate::config::ProgressMode;
use crate::runtime::Shared;

/// Longest single sleep: a safety net only (every wake-up path is a notification), cheap
/// enough that an idle runtime stays far below 1% of a core.
const PARK_LIMIT: Duration = Duration::from_millis(250);

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

/// Parks worker `index` until new work, network activity, shutdown, or `PARK_LIMIT`.
pub(super) fn park_worker(shared: &Shared, pool: &Pool, index: usize) {
    let sleep = &pool.sleep;
    sleep.parked[index].store(true, Ordering::Relaxed);
    // SeqCst: see the module docs.
    sleep.num_sleeping.fetch_add(1, Ordering::SeqCst);

    // Network wake-ups (see the module docs for why Owner mode differs).
    let handoff = if shared.config.progress == ProgressMode::Owner { shared.owner.listen() } else { None };
    let someone_owns = handoff.is_some();
    let mut listener = match handoff {
        Some(l) => l,
        None => shared.transport.doorbell().listen(),
    };

    // Deferred frames do not keep a worker awake: the transport rings the doorbell when their
    // destination has room, and one more try here covers a ring that came before `listen`.
    let network_ready = if someone_owns { !shared.owner.is_taken() } else { shared.work_before_sleep() };
    if network_ready || pool.has_work() || pool.is_shutdown() {
        sleep.unsleep(index);
        return;
    }
    shared.counters.parks.fetch_add(1, Ordering::Relaxed);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + PARK_LIMIT;
    let mut heard = false;
    loop {
        if !sleep.parked[index].load(Ordering::Acquire) || pool.is_shutdown() {
            shared.counters.wakes.fetch_add(1, Ordering::Relaxed);
            break;
        }
        if let Poll::Ready(()) = Pin::new(&mut listener).poll(&mut cx) {
            shared.counters.wakes.fetch_add(1, Ordering::Relaxed);
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
        pass_on(shared, someone_owns);
    }
}

/// A worker woke on a notification that a blocked thread may have needed: the doorbell
/// (notifying one listener, maybe instead of the progress owner) or an ownership hand-off
/// (meant for a parked waiter). If this worker cannot use it — progress is held by someone
/// else, or there is nothing to progress — it passes the notification on, so nobody waits
/// out a park limit. A successful `Owner`-mode pass releases ownership, which notifies the
/// hand-off itself.
fn pass_on(shared: &Shared, handoff: bool) {
    if shared.progress_idle() {
        return;
    }
    if handoff {
        // This worker owns nothing here (`progress_idle` hands the token back), so `leave`
        // only passes the hand-off on, and only if the token is still free.
        shared.owner.leave(crate::cri::thread_token());
    } else if shared.transport.any_frames() {
        shared.transport.doorbell().ring();
    }
}
